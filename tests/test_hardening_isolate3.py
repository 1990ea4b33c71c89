"""Issue 37, item 3: the import worker is out of reach of other processes.  It is non-dumpable
(a process of its own uid, without CAP_SYS_PTRACE, cannot read its /proc entries, trace it or
take its descriptors), a uid of its own is used where the system allows (see
test_hardening_isolate2), and a worker killed from outside defers its file once instead of
rejecting it for good."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

import pytest

from tests.test_hardening_isolate2 import KINETO, _drop, _gated_scan, gate  # noqa: F401


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.split(":", 1) for line in f if ":" in line)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_a_process_of_the_workers_uid_cannot_reach_it(tmp_path, shared_fixtures, gate, monkeypatch):  # noqa: F811
    d = _drop(tmp_path, shared_fixtures, KINETO)
    d.importer.probe()
    t, _, pid = _gated_scan(d, gate, monkeypatch)
    try:
        uid, gid = _status(pid)["Uid"].split()[0], _status(pid)["Gid"].split()[0]
        # the same uid and gid, no capability: what another process of "nobody" was
        peer = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--inh-caps=-all",
                               "--bounding-set=-all", "cat", f"/proc/{pid}/environ"],
                              capture_output=True, text=True, timeout=30)
        assert peer.returncode != 0 and "Permission denied" in peer.stderr, (peer.returncode, peer.stderr)
        # before the fix: the worker was dumpable and its environment (and memory, and fds) readable
    finally:
        (gate / "go").touch()
        t.join(60)
        d.close()


def test_a_worker_killed_from_outside_defers_its_file_once(tmp_path, shared_fixtures, gate, monkeypatch):  # noqa: F811
    d = _drop(tmp_path, shared_fixtures, KINETO)
    d.importer.probe()
    for attempt in (1, 2):
        if attempt == 2:
            for name in ("ready", "go"):
                (gate / name).unlink(missing_ok=True)
        t, box, pid = _gated_scan(d, gate, monkeypatch)
        os.kill(pid, signal.SIGKILL)  # what any process of the worker's uid could do
        t.join(60)
        [out] = box[0]
        if attempt == 1:  # before the fix: rejected for good as "memory" at the first kill
            assert out.deferred and out.kind == "killed", out
            assert list((tmp_path / "drop" / "rejected").iterdir()) == []
            assert (tmp_path / "drop" / KINETO).exists()  # back in the root, to be claimed again
        else:  # the same file's worker killed again: no endless retry, rejected as before
            assert not out.deferred and out.kind == "memory", out
    d.close()
