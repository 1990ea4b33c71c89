"""Issue 26, findings 1-5 and 11: the drop directory, its sidecars, capture staging and the
importers under a local attacker (a producer who owns what it drops and can write the root).

Bombs run in a child with 1 GiB of address space and a timeout (``tests/bounded.py``), so each
test stays bounded on code that would not stop them."""

from __future__ import annotations

import gzip
import json
import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time
import tracemalloc
from pathlib import Path

import pytest

from exporter.importers.detect import import_file
from exporter.importers.dropdir import DropDir
from exporter.importers.isolate import Importer
from exporter.importers.model import ProfileRejected
from exporter.importers.profiles_source import ProfilesSource
from exporter.map.mapping import MappingSet
from exporter.map.schema import default_mappings_dir, load_schema
from exporter.sources.context import SourceContext
from tests.bounded import run_bounded

MiB = 1 << 20
ROCPROF_V1 = textwrap.dedent("""\
    "Index","KernelName","gpu-id","queue-id","pid","DispatchNs","BeginNs","EndNs","L2CacheHit"
    0,"gemm [clone .kd]",0,0,1,1000,6000,106000,40.0
    """)


def kineto(devices: int = 1, pad: int = 0) -> bytes:
    events = [{"ph": "X", "cat": "kernel", "name": "k", "pid": d, "tid": 7, "ts": 1, "dur": 5,
               "args": {"device": d, "stream": 7}} for d in range(devices)]
    return json.dumps({"traceEvents": events}).encode() + b" " * pad


@pytest.fixture(scope="module")
def mappings():
    mdir = default_mappings_dir()
    return MappingSet.load_dir(mdir, load_schema(mdir / "canonical.yaml"))


def _wait(cond, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


# ------------------------------------------------------------------ 1: capture staging
CAPTURE = textwrap.dedent(f"""\
    import os, sys
    out = sys.argv[1]
    open(sys.argv[2], "w").write(out)
    with open(out + ".csv", "w") as f:
        f.write({ROCPROF_V1!r})
    fd = os.open(out + ".txt", os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"SECRET-FIRST-LINE of a root-only tool log\\n")
    os.close(fd)
    """)


def test_capture_stages_in_a_private_folder_never_through_the_drop_dir(tmp_path, mappings):
    drop = tmp_path / "drop"
    drop.mkdir(mode=0o1777)
    os.chmod(drop, 0o1777)
    attacker = tmp_path / "attacker"
    attacker.mkdir(mode=0o777)
    os.chmod(attacker, 0o777)
    os.symlink(attacker, drop / "capturing")  # created first, before the exporter's capture
    if os.geteuid() == 0:
        os.chown(attacker, 65534, 65534)
        os.lchown(drop / "capturing", 65534, 65534)
    script, argv_log = tmp_path / "capture.py", tmp_path / "output-path"
    script.write_text(CAPTURE)
    src = ProfilesSource(SourceContext(options={"dir": str(drop), "settle": 0, "scan_interval": 3600, "trigger": {
        "enabled": True, "for_seconds": 0, "min_interval": 0, "timeout": 20,
        "command": [sys.executable, str(script), "{output}", str(argv_log)]}}, wanted=mappings.raw_fields()))
    src.open()
    try:
        assert src.observe_indicators(time.monotonic(), "nvidia-0", {"gpu_memory_contention": 1.0})
        assert _wait(lambda: src.trigger.stats["ok"] + src.trigger.stats["failed"] >= 1)
        assert src.trigger.stats["ok"] == 1
        output = Path(argv_log.read_text())
        assert drop not in output.parents and attacker not in output.resolve().parents
        assert list(attacker.iterdir()) == []  # nothing written where the attacker pointed
        assert not output.parent.exists()  # the private staging folder is gone afterwards
        imported = sorted(p.name for p in (drop / "imported").iterdir())
        assert any(n.endswith(".csv") for n in imported) and any(n.endswith(".csv.meta.json") for n in imported)
        # the tool's root-only log is rejected; its reason (quoting the first line) is as private
        reasons = list((drop / "rejected").glob("*.txt.reason"))
        assert len(reasons) == 1 and "SECRET-FIRST-LINE" in reasons[0].read_text()
        assert stat.S_IMODE(reasons[0].stat().st_mode) & 0o077 == 0
    finally:
        src.close()


def test_capture_staging_dir_must_be_private(tmp_path, mappings):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    src = ProfilesSource(SourceContext(options={"dir": str(tmp_path / "drop"), "settle": 0, "scan_interval": 3600, "trigger": {
        "enabled": True, "for_seconds": 0, "min_interval": 0, "staging_dir": str(shared),
        "command": [sys.executable, "-c", "open('x.csv', 'w')"]}}, wanted=mappings.raw_fields()))
    res = src.trigger.run_capture("gpu0")
    assert res.result == "failed" and "writable by nobody else" in res.reason
    assert list(shared.iterdir()) == []


# ------------------------------------------------------------------ 2: SQLite view bomb
def _view_bomb(path: Path, kind: str = "view") -> Path:
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE META_DATA_EXPORT(name TEXT, value TEXT);
        INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', '3.24.14');
        CREATE TABLE StringIds(id INTEGER, value TEXT);
    """)
    if kind == "view":
        db.executescript("""
            CREATE VIEW CUPTI_ACTIVITY_KIND_KERNEL AS
              WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r)
              SELECT n AS start, n + 1 AS end, 0 AS deviceId, 0 AS streamId, n AS correlationId,
                     16777216 AS globalPid, 1 AS shortName FROM r;
        """)
    else:
        db.executescript("""
            CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL(start INT, end INT, deviceId INT, streamId INT,
                                                    correlationId INT, globalPid INT, shortName INT);
            INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (1, 2, 0, 0, 1, 16777216, 1);
            CREATE TRIGGER t AFTER INSERT ON StringIds BEGIN SELECT 1; END;
        """)
    db.commit()
    db.close()
    assert path.stat().st_size <= 16384
    return path


@pytest.mark.parametrize("kind", ["view", "trigger"])
def test_sqlite_view_bomb_is_refused_at_once(tmp_path, kind):
    bomb = _view_bomb(tmp_path / "bomb.sqlite", kind)
    res = run_bounded(textwrap.dedent("""\
        import sys
        from exporter.importers.detect import import_file
        from exporter.importers.model import ProfileRejected
        try:
            import_file(sys.argv[1])
        except ProfileRejected as exc:
            print("REJECTED", exc)
        """), str(bomb), timeout=30)
    assert res.ok and "REJECTED" in res.out and f"defines a {kind}" in res.out, res


# the SQLite time limit and the shutdown: tests/test_hardening_isolate.py, on a generated export


# ------------------------------------------------------------------ 3: the sidecar's size
def test_sparse_gigabyte_sidecar_is_not_read(tmp_path):
    drop = tmp_path / "drop"
    d = DropDir(drop, settle=0)
    d.setup()
    d.close()
    (drop / "a.csv").write_text(ROCPROF_V1)
    with open(drop / "a.csv.meta.json", "wb") as f:  # 1 GiB, no disk used
        f.truncate(1 << 30)
    res = run_bounded(textwrap.dedent("""\
        import sys, time
        from exporter.importers.dropdir import DropDir
        d = DropDir(sys.argv[1], settle=0)
        d.setup()
        [o] = d.scan(now=time.time() + 10)
        print("FROM", o.profile.trace_id_from or "-", o.profile.warnings)
        """), str(drop), timeout=30)
    assert res.ok and "FROM -" in res.out and "above the limit of 65536" in res.out, res


def test_sidecar_above_the_limit_gives_no_trace_id(tmp_path):
    drop = tmp_path / "drop"
    d = DropDir(drop, settle=0)
    d.setup()
    (drop / "a.csv").write_text(ROCPROF_V1)
    (drop / "a.csv.meta.json").write_text('{"trace_id": "abc"}' + " " * 70000)
    [o] = d.scan(now=time.time() + 10)
    assert o.profile.trace_id == "" and "unreadable sidecar" in " ".join(o.profile.warnings)
    d.close()


# ------------------------------------------------------------------ 4: read through the fd, leases
LEASE_HOLDER = textwrap.dedent("""\
    import fcntl, os, signal, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR)
    def on_break(sig, frame):  # the reader opened it: grow it past the limit, then let go
        os.lseek(fd, 0, os.SEEK_END)
        os.write(fd, b" " * int(sys.argv[2]))
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        print("released", flush=True)
    signal.signal(signal.SIGIO, on_break)
    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
    print("leased", flush=True)
    time.sleep(60)
    """)


def test_leased_file_is_rejected_at_once_never_read_past_the_limit(tmp_path):
    drop = tmp_path / "drop"
    d = DropDir(drop, settle=0, max_bytes=MiB)
    d.setup()
    (drop / "trace.json").write_bytes(kineto())
    holder = subprocess.Popen([sys.executable, "-c", LEASE_HOLDER, str(drop / "trace.json"), str(8 * MiB)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "leased"
        [o] = d.scan(now=time.time() + 10)
        assert o.profile is None and "lease" in o.reason
        assert "lease" in (drop / "rejected" / "trace.json.reason").read_text()
    finally:
        holder.kill()
        holder.wait()
        d.close()


def test_file_grown_after_the_size_check_is_cut_at_the_limit(tmp_path, monkeypatch):
    """The size check and the read are one: a file that grows between them (the producer still
    owns the inode) is refused at the limit, never read whole.  (Parsed in this process, so that
    the growth can be timed after the size check, as the child process does it.)"""
    from exporter import safefile
    drop = tmp_path / "drop"
    d = DropDir(drop, settle=0, max_bytes=MiB, importer=Importer(isolated=False))
    d.setup()
    (drop / "trace.json").write_bytes(kineto())
    real_is_gzip = safefile.is_gzip

    def grow_then_read(fd):  # right after the size check, right before the read
        with open(os.open(drop / "processing" / "trace.json", os.O_WRONLY | os.O_APPEND), "wb") as w:
            w.write(b" " * (4 * MiB))  # the producer appends after fstat
        return real_is_gzip(fd)
    monkeypatch.setattr(safefile, "is_gzip", grow_then_read)
    [o] = d.scan(now=time.time() + 10)
    assert o.profile is None and "above the limit of 1048576" in o.reason
    d.close()


# ------------------------------------------------------------------ 5: gzip inflation
def test_gzip_content_is_bounded_by_max_file_bytes_after_decompression(tmp_path):
    drop = tmp_path / "drop"
    d = DropDir(drop, settle=0, max_bytes=MiB)
    d.setup()
    (drop / "ok.json.gz").write_bytes(gzip.compress(kineto(pad=MiB // 2)))
    (drop / "big.json.gz").write_bytes(gzip.compress(kineto(pad=3 * MiB)))  # 3 KB of gzip
    (drop / "bomb.json.gz").write_bytes(gzip.compress(b"\0" * (32 * MiB), 9))  # 32 KB of gzip
    tracemalloc.start()
    try:
        outs = {o.name: o for o in d.scan(now=time.time() + 10)}
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert outs["ok.json.gz"].profile is not None
    for name in ("big.json.gz", "bomb.json.gz"):
        assert outs[name].profile is None and "decompressed content above the limit" in outs[name].reason
    assert peak < 8 * MiB, peak  # never more than the limit (and a chunk) in memory
    d.close()


# ------------------------------------------------------------------ 11: imported series expire, caps
def test_expired_import_takes_its_gpus_and_import_counts_with_it(tmp_path, mappings):
    now = [1000.0]
    src = ProfilesSource(SourceContext(options={"dir": str(tmp_path / "drop"), "settle": 0, "scan_interval": 3600,
                                  "ttl": 60}, wanted=mappings.raw_fields()))
    src.clock = lambda: now[0]
    src.open()
    try:
        (tmp_path / "drop" / "trace.json").write_bytes(kineto(devices=3))
        assert src.scan_once() == 1
        s = src.poll()
        assert len(s.devices) == 3 and len([r for r in s.readings if r.field == "profile.imports"]) == 3
        now[0] += 61
        s = src.poll()
        assert s.devices == [] and s.readings == [] and s.errors["profile_expired"] == 1
    finally:
        src.close()


def test_evicted_import_takes_its_gpus_with_it(tmp_path, mappings):
    src = ProfilesSource(SourceContext(options={"dir": str(tmp_path / "drop"), "settle": 0, "scan_interval": 3600,
                                  "max_profiles": 1, "ttl": 0}, wanted=mappings.raw_fields()))
    src.open()
    try:
        (tmp_path / "drop" / "a.json").write_bytes(kineto(devices=4))
        assert src.scan_once() == 1
        (tmp_path / "drop" / "b.csv").write_text(ROCPROF_V1)
        assert src.scan_once() == 1
        s = src.poll()
        assert [d.key.split(":")[1] for d in s.devices] == ["rocprof"]
        assert {r.device for r in s.readings if r.field == "profile.imports"} == {s.devices[0].key}
    finally:
        src.close()


@pytest.mark.parametrize("opts,content,match", [
    ({}, kineto(devices=40), "40 GPUs, above max_devices_per_import \\(16\\)"),
    ({"max_series_per_import": 20}, kineto(devices=2), "series, above max_series_per_import \\(20\\)"),
])
def test_per_import_caps_reject_the_file(tmp_path, mappings, opts, content, match):
    src = ProfilesSource(SourceContext(options={"dir": str(tmp_path / "drop"), "settle": 0, "scan_interval": 3600, **opts}, wanted=mappings.raw_fields()))
    src.open()
    try:
        (tmp_path / "drop" / "many.json").write_bytes(content)
        assert src.scan_once() == 0
        s = src.poll()
        kind = "devices" if "GPUs" in match else "series"  # counted by the cap it hit
        assert s.devices == [] and s.readings == [] and s.errors[f"profile_rejected_{kind}"] == 1
        import re
        assert re.search(match, (tmp_path / "drop" / "rejected" / "many.json.reason").read_text())
    finally:
        src.close()


def test_new_options_pass_the_strict_config(tmp_path):
    from exporter.config import load_config
    cfg = tmp_path / "config.yaml"
    cfg.write_text(textwrap.dedent(f"""\
        collectors:
          profiles:
            enabled: true
            options:
              dir: {tmp_path / "drop"}
              max_devices_per_import: 4
              max_series_per_import: 1000
              trigger: {{enabled: true, command: [/bin/true], staging_dir: {tmp_path}}}
        """))
    src = ProfilesSource(SourceContext(options=load_config(cfg).collector("profiles").options_dict()))
    assert (src.max_devices, src.max_series, src.trigger.cfg.staging_dir) == (4, 1000, str(tmp_path))


# ------------------------------------------------------------------ trace ids fully matched
@pytest.mark.parametrize("tid", ["abc\n", "abc\r\n", "\nabc", "a" * 65, "-abc"])
def test_trace_id_is_matched_whole(tmp_path, tid):
    from exporter.importers.detect import valid_trace_id
    assert not valid_trace_id(tid)  # "abc\n" passed a $-anchored .match
    drop = tmp_path / "drop"
    d = DropDir(drop, settle=0)
    d.setup()
    (drop / "a.csv").write_text(ROCPROF_V1)
    (drop / "a.csv.meta.json").write_text(json.dumps({"trace_id": tid}))
    [o] = d.scan(now=time.time() + 10)
    assert o.profile.trace_id == "" and o.profile.trace_id_from == ""
    assert not [r for r in o.result.sample.readings if dict(r.labels).get("trace_id")]
    with pytest.raises(ProfileRejected, match="invalid trace id"):
        import_file(drop / "imported" / "a.csv", trace_id=tid)
    d.close()


def test_trace_id_up_to_64_characters_is_kept(tmp_path):
    from exporter.importers.detect import valid_trace_id
    assert valid_trace_id("a" * 64) and valid_trace_id("job-42.step:7_x")


# ------------------------------------------------------------------ capture staging on another filesystem
def _exdev_after(grow: int):
    """os.rename that raises EXDEV (staging on another filesystem), growing the file first by
    ``grow`` bytes (a capture tool still writing through a descriptor it kept)."""
    import errno
    real = os.rename

    def rename(src, dst, *, src_dir_fd=None, dst_dir_fd=None):
        if src_dir_fd is None:
            return real(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        if grow:
            with open(os.open(src, os.O_WRONLY | os.O_APPEND, dir_fd=src_dir_fd), "ab") as w:
                w.write(b" " * grow)
        raise OSError(errno.EXDEV, "Invalid cross-device link")
    return rename


@pytest.mark.parametrize("grow", [0, 4 * MiB])
def test_cross_filesystem_capture_copy_is_bounded(tmp_path, monkeypatch, grow):
    drop = tmp_path / "drop"
    d = DropDir(drop, settle=0, max_bytes=MiB)
    d.setup()
    staging = tmp_path / "staging"
    staging.mkdir(mode=0o700)
    (staging / "run.csv").write_text(ROCPROF_V1)
    monkeypatch.setattr(os, "rename", _exdev_after(grow))
    fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
    try:
        outs = d.adopt(fd, ["run.csv"], {"trace_id": "job1"})
    finally:
        os.close(fd)
        d.close()
    if not grow:  # copied through the fd, imported with its sidecar
        assert [o.profile.trace_id for o in outs] == ["job1"]
        assert sorted(p.name for p in (drop / "imported").iterdir()) == ["run.csv", "run.csv.meta.json"]
        return
    # grown past max_bytes while copied: the copy stops at the limit and leaves nothing behind
    assert outs == []
    for folder in ("processing", "imported", "rejected"):
        assert list((drop / folder).iterdir()) == [], folder


# ------------------------------------------------------------------ a total series cap across imports
def _kineto_on(device: int) -> bytes:
    return json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": device, "tid": 7, "ts": 1,
                                        "dur": 5, "args": {"device": device, "stream": 7}}]}).encode()


def test_total_series_cap_evicts_the_oldest_imports(tmp_path, mappings):
    one = ProfilesSource(SourceContext(options={"dir": str(tmp_path / "probe")}, wanted=mappings.raw_fields()))
    per_import = len(one._convert(import_file(_write(tmp_path / "p.json", _kineto_on(0))))[1].readings)
    src = ProfilesSource(SourceContext(options={
        "dir": str(tmp_path / "drop"), "settle": 0, "scan_interval": 3600, "ttl": 0,
        "max_series_per_import": per_import, "max_series_total": 2 * per_import + per_import // 2},
        wanted=mappings.raw_fields()))
    src.open()
    try:
        for gpu in range(3):
            (tmp_path / "drop" / f"gpu{gpu}.json").write_bytes(_kineto_on(gpu))
            assert src.scan_once() == 1
        s = src.poll()
        # three imports would be 3 x per_import series: the oldest (GPU 0) left to make room
        assert sorted(d.index for d in s.devices) == ["1", "2"]
        assert len([r for r in s.readings if r.field != "profile.imports"]) == 2 * per_import
        assert s.errors["profile_evicted"] == 1
    finally:
        src.close()


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
