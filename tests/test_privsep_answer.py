"""The counting process's answer is checked like the import worker's (issue 37): bounded while
read, every field checked, within a deadline; a bad answer is counted, that poll's count reads
``read_error`` (the source is degraded, not down) and the next poll gets a fresh scanner.

The misbehaving scanners are real processes speaking the real protocol badly: a stand-in for the
interpreter runs a supervisor whose n-th session behaves as ``MODES`` says, and a good session
runs the real ``child.serve``.  Needs no privilege.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from exporter.privsep.answer import MAX_ANSWER_BYTES, MAX_RECORDS, BadAnswer, decode, frame, length
from exporter.privsep.counter import Counter
from exporter.sources import fdinfo_records
from exporter.sources.context import SourceContext
from exporter.sources.drm_fdinfo import DrmFdinfoSource
from exporter.sources.fdinfo_scan import ScanLimits
from tests.fdinfo_trees import add_card, add_fd, set_fdinfo, write_clients

PDEV = "0000:08:00.0"
FDINFO = ("pos:\t0\nflags:\t02100002\ndrm-driver:\tamdgpu\ndrm-pdev:\t" + PDEV + "\n"
          "drm-client-id:\t{cid}\ndrm-memory-vram:\t1024 KiB\ndrm-engine-gfx:\t{ns} ns\n")
GOOD = {"id": 1, "host_pids": True, "unreadable": 0, "partial": False, "budget_hit": False, "errors": {},
        "records": [["300", "5", "amdgpu", PDEV, "300", {"gfx": 5}, {}, {}, {}, {}, {"vram": 1024}, 0]],
        "names": {}}


def _with(**changes) -> bytes:
    return json.dumps({**GOOD, **changes}).encode()


def _record(**at) -> list:
    rec = list(GOOD["records"][0])
    for i, v in at.items():
        rec[int(i[1:])] = v
    return rec


def test_a_good_answer_decodes_to_records():
    got = decode(_with(), 1)
    ((pid, fd, rec),) = got.records
    assert (pid, fd, rec.driver, rec.pdev, rec.engine_ns, rec.resident()) == ("300", "5", "amdgpu", PDEV, {"gfx": 5},
                                                                              {"vram": 1024})


@pytest.mark.parametrize("data", [
    b"not json", b"[]", _with(id=2), _with(id=True), b'{"id": 1, "error": "the scan failed"}',
    _with(host_pids=1), _with(unreadable=-1), _with(unreadable=1 << 64), _with(errors={"anything": 1}),
    _with(records=[_record(f0="12a")]), _with(records=[_record(f0="../1")]), _with(records=[_record(f1="")]),
    _with(records=[_record(f3="0000:8:0.0")]), _with(records=[_record(f2="amd gpu\n")]),
    _with(records=[_record(f5={"gfx": -1})]), _with(records=[_record(f5={"gfx": 1.5})]),
    _with(records=[_record(f9={"gfx": "NaN"})]), b'{"id": 1, "unreadable": NaN}',
    _with(records=[_record(f5={f"e{i}": 1 for i in range(65)})]), _with(records=[GOOD["records"][0][:11]]),
    _with(records=[GOOD["records"][0]] * (MAX_RECORDS + 1)), _with(names={"300": "a\nb"}),
    _with(names={"300": "x" * 65}), _with(names={"x": "job"}), b"[" * 100000,
])
def test_a_malformed_answer_is_refused(data):
    with pytest.raises(BadAnswer) as exc:
        decode(data, 1)
    assert exc.value.kind == "malformed"


def test_a_frame_above_the_limit_is_refused_before_it_is_read():
    assert length(frame({"a": 1})[:4], MAX_ANSWER_BYTES) == 7
    with pytest.raises(BadAnswer) as exc:
        length((MAX_ANSWER_BYTES + 1).to_bytes(4, "big"), MAX_ANSWER_BYTES)
    assert exc.value.kind == "oversized"


# the stand-in supervisor: its n-th session (1-based) behaves as MODES[n-1]; past the list, "good"
STANDIN = r'''
import os, socket, sys, time
sys.path.insert(0, sys.argv[10])
from exporter.privsep.child import serve
modes = os.environ["MODES"].split(",")
ctl = socket.socket(fileno=int(sys.argv[7]))
ctl.sendall(b"R")
n = 0
while True:
    msg, fds, _, _ = socket.recv_fds(ctl, 16, 1)
    if not msg:
        sys.exit(0)
    mode = modes[n] if n < len(modes) else "good"
    n += 1
    if os.fork() == 0:
        ctl.close()
        s = socket.socket(fileno=fds[0])
        if mode == "good":
            os._exit(serve(fds[0], sys.argv[8], sys.argv[9]))
        s.recv(65536)
        if mode == "late":
            time.sleep(60)
        elif mode == "oversized":
            s.sendall((64 << 20).to_bytes(4, "big") + b"{" * 65536)
        elif mode == "malformed":
            s.sendall(b"\x00\x00\x00\x0b{\"id\": NaN}")
        elif mode == "exited":
            os._exit(3)
        time.sleep(60)
        os._exit(0)
    os.close(fds[0])
'''


@pytest.fixture
def standin(tmp_path):
    script = tmp_path / "standin.py"
    script.write_text(STANDIN)
    python = tmp_path / "python"

    def start(modes: str, proc: Path, sysfs: Path) -> Counter:  # the environment is emptied: MODES here
        python.write_text(f"#!/bin/sh\nMODES={modes} exec {sys.executable} {script} \"$@\"\n")
        python.chmod(python.stat().st_mode | stat.S_IXUSR)
        return Counter(proc, sysfs, python=str(python))
    yield start
    fdinfo_records.use_factory(None)


def _node(tmp_path: Path) -> tuple[Path, Path]:
    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    add_card(sysfs, 1, PDEV, driver="amdgpu")
    for pid in (300, 301):
        add_fd(proc, pid, 5, "/dev/dri/renderD128", FDINFO.format(cid=pid, ns=0))
    (proc / "2").mkdir()
    (proc / "2" / "comm").write_text("kthreadd\n")
    return proc, sysfs


def _evidence(sample) -> list:
    return [r.labels for r in sample.readings if r.field == "client.evidence"]


@pytest.mark.parametrize("mode", ["late", "oversized", "malformed", "exited"])
def test_a_bad_answer_is_counted_the_poll_degraded_and_the_next_poll_answered_by_a_fresh_scanner(
        tmp_path, standin, mode):
    proc, sysfs = _node(tmp_path)
    counter = standin(mode, proc, sysfs)
    try:
        fdinfo_records.use_factory(counter.scanner)
        t = [100.0]
        src = DrmFdinfoSource(SourceContext(sysfs=sysfs, procfs=proc,
                                            options={"scan_max_seconds": 0.01}), clock=lambda: t[0])
        src.open()
        bad = src.poll()  # the first session misbehaves: no count, not a crash
        assert bad.errors[f"counter_{mode}"] == 1 and counter.bad == {mode: 1}
        assert _evidence(bad) == [(("evidence", "fdinfo"), ("reason", "read_error"))]
        assert not [r for r in bad.readings if r.field.startswith("client.engine")]
        assert src.poll().errors == {}  # a fresh scanner (the second session) answers
        t[0] += 1.0
        for pid in (300, 301):
            set_fdinfo(proc, pid, 5, FDINFO.format(cid=pid, ns=500_000_000))
        good = src.poll()
        assert _evidence(good) == [(("evidence", "fdinfo"), ("reason", ""))]
        assert sorted(dict(r.labels)["client"] for r in good.readings if r.field == "client.engine_utilization") == \
            ["300", "301"]
        assert ("privilege_separated", (), 1.0) in good.self_samples
        src.close()
    finally:
        counter.close()
    assert counter.proc.returncode == 0  # the supervisor exits when the serving process lets go


def test_the_real_counter_answers_and_a_source_without_it_scans_in_this_process(tmp_path):
    proc, sysfs = _node(tmp_path)
    counter = Counter(proc, sysfs)
    try:
        remote = counter.scanner(proc, sysfs, ScanLimits())
        assert remote.separated and [p for p, _, _ in remote.scan({}, 1.0)] == ["300", "301"]
        assert remote.host_pids
        # another procfs than the counter's: scanned here (nothing the counter was not started for)
        assert not counter.scanner(tmp_path, sysfs).separated
    finally:
        counter.close()
    local = DrmFdinfoSource(SourceContext(sysfs=sysfs, procfs=proc))
    local.open()
    assert ("privilege_separated", (), 0.0) in local.poll().self_samples
    assert os.path.isdir(proc)


def test_the_counter_relays_the_debugfs_client_list_counts(tmp_path):
    """The client list is read in the counting process (it holds CAP_DAC_READ_SEARCH): its
    fallback and malformed-line counts come back in the answer's errors (and nothing else does)."""
    assert decode(_with(errors={"clients_list_unavailable": 1, "clients_list_malformed": 2}), 1).errors == {
        "clients_list_unavailable": 1, "clients_list_malformed": 2}
    proc, sysfs = _node(tmp_path)
    path = write_clients(sysfs, 1, [("app", 300), ("app", 301)])
    path.write_text(path.read_text() + "junk\n")
    counter = Counter(proc, sysfs)
    try:
        remote = counter.scanner(proc, sysfs, ScanLimits())
        errors: dict = {}
        remote.scan(errors, 1.0)
        assert errors == {"clients_list_malformed": 1}
        path.write_text("not the kernel's header\n")
        errors = {}
        remote.scan(errors, 2.0)
        assert errors == {"clients_list_unavailable": 1}
    finally:
        counter.close()


def test_the_counter_relays_the_stat_errors(tmp_path):
    """A ``<pid>/stat`` the counting process could not read or parse (fdinfo_activity: a real
    re-verification ran) comes back counted in the answer's errors."""
    assert decode(_with(errors={"stat_unreadable": 1, "stat_malformed": 2}), 1).errors == {
        "stat_unreadable": 1, "stat_malformed": 2}
    proc, sysfs = _node(tmp_path)
    (proc / "300" / "stat").write_text("300 (app) S 1\n")  # cut short: malformed
    os.symlink("/proc/self/stat", proc / "301" / "stat")  # not the kernel's file: never followed
    counter = Counter(proc, sysfs)
    try:
        errors: dict = {}
        counter.scanner(proc, sysfs, ScanLimits()).scan(errors, 1.0)  # first examinations take the fingerprint
        assert errors == {"stat_malformed": 1, "stat_unreadable": 1}
    finally:
        counter.close()


# ---------------------------------------------------------------- the security review (issue 37)
def test_a_scanner_imports_nothing_after_the_supervisor_said_ready(tmp_path, monkeypatch):
    """The serving process handles untrusted input before a scanner is forked: were a scanner to
    import then, whoever can write the package folder (a compromised serving process, maybe)
    could plant code to run with the count capabilities.  The supervisor imports all a scanner
    runs before it says ready, writes no .pyc (-B), and puts the package after the stdlib."""
    import shutil

    from exporter.privsep import counter as counter_mod

    root = tmp_path / "root"
    shutil.copytree(Path(counter_mod.__file__).resolve().parent.parent, root / "exporter",
                    ignore=shutil.ignore_patterns("__pycache__"))
    planted = tmp_path / "planted"
    (root / "json.py").write_text(f"open({str(planted)!r} + '-json', 'w').close()\nraise ImportError\n")
    monkeypatch.setattr(counter_mod, "_PACKAGE_ROOT", str(root))
    proc, sysfs = _node(tmp_path)
    counter = Counter(proc, sysfs)
    try:
        for mod in ("sources/fdinfo_records.py", "sources/fdinfo_scan.py", "privsep/answer.py"):
            path = root / "exporter" / mod
            path.write_text(f"open({str(planted)!r} + '-{path.stem}', 'w').close()\n" + path.read_text())
        remote = counter.scanner(proc, sysfs, ScanLimits())
        assert [p for p, _, _ in remote.scan({}, 1.0)] == ["300", "301"]
    finally:
        counter.close()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("planted")) == []
    assert not list(root.rglob("__pycache__"))


def test_a_dead_supervisor_is_reaped_logged_once_and_reported_and_the_daemon_told(tmp_path, caplog):
    import signal

    proc, sysfs = _node(tmp_path)
    counter = Counter(proc, sysfs)
    told = []
    counter.on_dead = lambda: told.append(1)
    try:
        fdinfo_records.use_factory(counter.scanner)
        src = DrmFdinfoSource(SourceContext(sysfs=sysfs, procfs=proc), clock=lambda: 100.0)
        src.open()
        assert ("privilege_separated", (), 1.0) in src.poll().self_samples
        os.kill(counter.pid, signal.SIGKILL)
        os.waitid(os.P_PID, counter.pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped yet
        with caplog.at_level("ERROR", logger="unified_gpu_exporter"):
            for _ in range(3):
                sample = src.poll()
                assert sample.errors == {"counter_supervisor_exited": 1}
                assert _evidence(sample) == [(("evidence", "fdinfo"), ("reason", "read_error"))]
                assert ("privilege_separated", (), 0.0) in sample.self_samples
        assert counter.proc.returncode == -signal.SIGKILL  # reaped: no zombie left
        assert told == [1] and counter.dead
        assert [r.levelname for r in caplog.records if "supervisor exited" in r.getMessage()] == ["ERROR"]
        src.close()
    finally:
        fdinfo_records.use_factory(None)
        counter.close()


def test_the_supervisor_never_waits_for_a_killed_scanner(monkeypatch):
    """A scanner stuck in D state dies only when its read returns: the supervisor kills it and
    reaps it later (WNOHANG), starting the next scanner meanwhile."""
    from exporter.privsep import child

    calls = []
    exited: set[int] = set()

    def waitpid(pid, flags):
        calls.append(flags)
        assert flags & os.WNOHANG, "a blocking waitpid"
        return (pid, 9) if pid in exited else (0, 0)

    monkeypatch.setattr(child.os, "kill", lambda pid, sig: None)
    monkeypatch.setattr(child.os, "waitpid", waitpid)
    monkeypatch.setattr(child, "_unreaped", set())
    assert child._stop(4321) == 0 and child._unreaped == {4321}  # still in D state: left for later
    exited.add(4321)
    child._reap()
    assert child._unreaped == set() and calls
