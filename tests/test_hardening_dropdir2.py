"""Issue 37, item 7: a flood of junk in the drop directory.  A small file no parser recognises is
rejected by a look at its head in the daemon, with the reason a worker would give, and no worker
is started for it (400 junk files cost 21-30 s of CPU, one worker each); files are claimed at a
bounded rate, the rest wait in the root."""

from __future__ import annotations

import gzip
import random
import time

from exporter.importers import dropdir, spawn
from exporter.importers.dropdir import DropDir
from tests.test_hardening_isolate2 import KINETO


def _counting_spawn(monkeypatch) -> list:
    started: list = []
    real = spawn.spawn

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        started.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(spawn, "spawn", counted)
    return started


def test_junk_is_rejected_without_a_worker(tmp_path, shared_fixtures, monkeypatch):
    d = DropDir(tmp_path / "drop", settle=0)
    d.setup()
    d.importer.probe()
    started = _counting_spawn(monkeypatch)
    junk = {"a.bin": b"x", "b.csv": b"just,some,columns\n1,2,3\n", "c.gz": gzip.compress(b"\x00junk" * 100),
            "d.txt": random.Random(35).randbytes(4096), "e.txt": b"   \n\n"}
    for name, data in junk.items():
        (tmp_path / "drop" / name).write_bytes(data)
    (tmp_path / "drop" / KINETO).write_bytes((shared_fixtures / "profilers" / KINETO).read_bytes())
    outcomes = {o.name: o for o in d.scan(now=time.time() + 10)}
    assert outcomes[KINETO].profile is not None  # a real artifact still gets its worker
    assert len(started) == 1, len(started)  # before the fix: one worker per file, junk included
    for name in junk:
        assert outcomes[name].profile is None and "unrecognised format" in outcomes[name].reason, outcomes[name]
        assert (tmp_path / "drop" / "rejected" / name).exists()
    d.close()


def test_files_are_claimed_at_a_bounded_rate(tmp_path, monkeypatch):
    monkeypatch.setattr(dropdir, "CLAIM_BURST", 5)
    monkeypatch.setattr(dropdir, "CLAIMS_PER_MINUTE", 6)  # one every 10 s
    d = DropDir(tmp_path / "drop", settle=0)
    d.setup()
    for i in range(12):
        (tmp_path / "drop" / f"junk{i}.bin").write_bytes(b"x")
    assert len(d.scan(now=time.time() + 10)) == 5  # before the fix: all 12 at once
    assert d.waiting == 7
    assert len([p for p in (tmp_path / "drop").iterdir() if p.name.startswith("junk")]) == 7
    d.close()
