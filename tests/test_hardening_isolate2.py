"""Issue 26, review of the import worker (exporter/importers/isolate.py, spawn.py, worker.py):
a stop or a broken environment never rejects a good file, the worker runs without the
daemon's privileges, and its answer is checked like any other hostile input.

Many tests hold a worker at a gate (``_gated``): its BOOT, after it set itself up, writes its
pid to ``<gate>/ready`` and waits for ``<gate>/go``, so a test can look at the running worker
(its uid, capabilities, environment, oom_score_adj) or signal it at a known point: conditions,
never a race against the clock."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from exporter.importers import isolate, spawn
from exporter.importers.dropdir import DropDir
from exporter.importers.isolate import Importer, ImportLimits
from exporter.importers.model import ProfileRejected
from exporter.importers.profiles_source import ProfilesSource
from exporter.sources.base import SourceUnavailable
from exporter.sources.context import SourceContext
from tests.bounded import in_thread
from tests.readable_copy import readable_copy

KINETO = "kineto-mi250-rocm6.2.json"
NSYS = "nsys-2026.1.1-schema3.24.14-torch-tiny.sqlite"
# an interpreter uid 65534 can run (this venv's may live under /root, 0700): the worker needs only
# the standard library and the exporter package
SYSTEM_PYTHON = next((p for p in (Path(f"/usr/bin/python3.{sys.version_info.minor}"), Path("/usr/bin/python3"))
                      if p.exists()), Path("/usr/bin/python3"))


@pytest.fixture
def gate():
    """A folder any user can write (the worker may run as uid 65534)."""
    d = Path(tempfile.mkdtemp(prefix="ugx-gate-"))
    os.chmod(d, 0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _gated(gate: Path) -> str:
    return isolate.BOOT.replace(
        "from exporter.importers.worker import main",
        "import time\n"
        f"open({str(gate / 'ready.tmp')!r}, 'w').write(str(os.getpid()))\n"
        f"os.rename({str(gate / 'ready.tmp')!r}, {str(gate / 'ready')!r})\n"
        "end = time.monotonic() + 50\n"
        f"while not os.path.exists({str(gate / 'go')!r}) and time.monotonic() < end:\n"
        "    time.sleep(0.005)\n"
        "from exporter.importers.worker import main")


def _wait_ready(gate: Path, timeout: float = 30) -> int:
    end = time.monotonic() + timeout
    while not (gate / "ready").exists():
        assert time.monotonic() < end, "the worker never reached the gate"
        time.sleep(0.005)
    return int((gate / "ready").read_text())


def _gated_scan(d, gate: Path, monkeypatch) -> tuple[threading.Thread, list, int]:
    """Start ``d.scan`` in a thread with the worker held at the gate: (thread, its result box,
    the worker's pid)."""
    monkeypatch.setattr(isolate, "BOOT", _gated(gate))
    t, box = _in_thread(lambda: d.scan(now=time.time() + 10))
    return t, box, _wait_ready(gate)


def _status(pid: int) -> dict[str, str]:
    return dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)


_in_thread = in_thread


def _drop(tmp_path: Path, shared_fixtures: Path, *names: str) -> DropDir:
    d = DropDir(tmp_path / "drop", settle=0)
    d.setup()
    for n in names:
        shutil.copy(shared_fixtures / "profilers" / n, tmp_path / "drop" / n)
    return d


# ------------------------------------------------------------------ 2: a stop rejects nothing
def test_sigterm_to_the_worker_mid_import_rejects_nothing(tmp_path, shared_fixtures, gate, monkeypatch):
    """systemd signals every process of the unit at stop: the worker ignores SIGTERM, SIGINT
    and SIGHUP (the daemon kills it itself when it stops).  Before: it died first, its file
    was rejected as a crash (and good files were moved from imported/ to rejected/)."""
    d = _drop(tmp_path, shared_fixtures, KINETO)
    d.importer.probe()
    t, box, pid = _gated_scan(d, gate, monkeypatch)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        os.kill(pid, sig)
    (gate / "go").touch()
    t.join(60)
    [out] = box[0]
    assert out.profile is not None, out  # imported: the signals changed nothing
    assert list((tmp_path / "drop" / "rejected").iterdir()) == []
    d.close()


def test_a_worker_that_dies_while_the_daemon_stops_is_stopped_not_rejected(tmp_path, shared_fixtures, gate,
                                                                          monkeypatch):
    """A death while stopping (here: SIGKILL, as systemd's final kill) is ``stopped``: the
    file goes back to the drop directory.  Before: a SIGKILL read as the memory limit."""
    d = _drop(tmp_path, shared_fixtures, KINETO)
    d.importer.probe()
    monkeypatch.setattr(isolate, "BOOT", _gated(gate))
    pid: list[int] = []
    # "stopping" becomes true only once the worker is dead and reaped, i.e. after _talk
    cancel = lambda: bool(pid) and not Path(f"/proc/{pid[0]}").exists()  # noqa: E731
    os.rename(tmp_path / "drop" / KINETO, tmp_path / "drop" / "processing" / KINETO)
    t, box = _in_thread(lambda: d.importer(d._fd("processing"), KINETO, cancel=cancel))
    pid.append(_wait_ready(gate))
    os.kill(pid[0], signal.SIGKILL)
    t.join(60)
    assert isinstance(box[0], ProfileRejected) and box[0].kind == "stopped" and box[0].deferred, box
    d.close()


def test_a_stop_during_restore_keeps_imported_files(tmp_path, shared_fixtures, gate, monkeypatch):
    d = _drop(tmp_path, shared_fixtures, KINETO)
    [first] = d.scan(now=time.time() + 10)
    assert first.profile is not None
    monkeypatch.setattr(isolate, "BOOT", _gated(gate))
    t, box = _in_thread(lambda: d.restore(4))
    os.kill(_wait_ready(gate), signal.SIGTERM)  # the unit stops during the start-up restore
    d.stopping.set()
    t.join(60)
    assert box[0] == []
    assert (tmp_path / "drop" / "imported" / KINETO).is_file()  # not moved to rejected/
    assert list((tmp_path / "drop" / "rejected").iterdir()) == []
    d.close()


# ------------------------------------------------------------------ 3: the environment rejects nothing
def test_a_worker_that_cannot_start_defers_the_file(tmp_path, shared_fixtures, monkeypatch):
    """fork/exec failing (EAGAIN: a pids limit) or no room for an SQLite copy is no fault of
    the file: it goes back to the drop directory and is counted, never rejected."""
    src = ProfilesSource(SourceContext(options={"dir": str(tmp_path / "drop"), "settle": 0,
                                                "scan_interval": 3600, "restore": False}))
    src.open()
    try:
        for n in (KINETO, NSYS):
            shutil.copy(shared_fixtures / "profilers" / n, tmp_path / "drop" / n)

        def no_fork(*_a, **_k):
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        monkeypatch.setattr(spawn, "spawn", no_fork)
        assert src.scan_once() == 0
        assert dict(src.poll().errors) == {"profile_deferred_environment": 2}
        assert sorted(p.name for p in (tmp_path / "drop").iterdir() if p.is_file()) == sorted([KINETO, NSYS])
        assert [p for p in (tmp_path / "drop" / "rejected").iterdir()] == []
        assert [p for p in (tmp_path / "drop" / "processing").iterdir()] == []
        monkeypatch.undo()
        assert src.scan_once() == 2  # tried again, imported
    finally:
        src.close()


def test_only_an_sqlite_file_needs_a_private_folder(tmp_path, shared_fixtures, monkeypatch):
    """A read-only root without a writable /tmp (docker run --read-only, readOnlyRootFilesystem):
    JSON and CSV need no temp dir at all; an SQLite copy goes to the drop directory's own
    scratch/ folder.  Before: mkdtemp in /tmp for every file, and its OSError escaped the scan
    (claimed files stranded in processing/)."""
    def read_only(*_a, **_k):
        raise OSError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    d = _drop(tmp_path, shared_fixtures, KINETO, NSYS)
    outs = {o.name: o for o in d.scan(now=time.time() + 10)}
    assert outs[KINETO].profile is not None and outs[NSYS].profile is not None, outs
    assert stat.S_IMODE((tmp_path / "drop" / "scratch").stat().st_mode) == 0o711  # others pass, never list
    assert list((tmp_path / "drop" / "scratch").iterdir()) == []  # removed after each import
    # and where even scratch/ cannot take the copy: deferred, the file back in the drop directory
    shutil.copy(shared_fixtures / "profilers" / NSYS, tmp_path / "drop" / "again.sqlite")

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(isolate, "_Scratch", full)
    [out] = d.scan(now=time.time() + 10)
    assert out.deferred and out.kind == "environment" and "No space left" in out.reason
    assert (tmp_path / "drop" / "again.sqlite").is_file()
    d.close()


def test_restore_under_a_broken_environment_keeps_imported_files(tmp_path, shared_fixtures, monkeypatch):
    d = _drop(tmp_path, shared_fixtures, KINETO)
    assert d.scan(now=time.time() + 10)[0].profile is not None

    def no_fork(*_a, **_k):
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
    monkeypatch.setattr(spawn, "spawn", no_fork)
    [out] = d.restore(4)
    assert out.deferred and out.profile is None
    assert (tmp_path / "drop" / "imported" / KINETO).is_file()
    assert list((tmp_path / "drop" / "rejected").iterdir()) == []
    d.close()


def test_the_source_is_down_with_the_reason_when_no_worker_can_run(tmp_path, monkeypatch):
    src = ProfilesSource(SourceContext(options={"dir": str(tmp_path / "drop"), "scan_interval": 3600}))
    src.drop.importer.python = str(tmp_path / "no-such-python")
    with pytest.raises(SourceUnavailable, match="import worker could not start"):
        src.open()
    src.close()


def test_the_worker_limit_fits_the_cgroup_memory_limit(monkeypatch, caplog):
    """A pod limit (the DaemonSet's 256Mi) below import_memory_bytes (768 MiB) plus the daemon:
    the worker's address space is lowered to fit, so the worker hits its own limit (a clean
    memory rejection) before the cgroup's OOM killer picks a victim."""
    monkeypatch.setattr(spawn, "memory_room", lambda: 180 << 20)
    imp = Importer()
    warnings = imp.probe()
    assert imp.limits.memory_bytes == 180 << 20
    assert any("lowered from 768 to 180 MiB" in w for w in warnings), warnings
    monkeypatch.setattr(spawn, "memory_room", lambda: 10 << 20)
    imp = Importer()
    assert any("less than an import worker needs" in w for w in imp.probe())
    assert imp.limits.memory_bytes == 768 << 20


def test_memory_max_reads_the_lowest_limit_on_the_cgroup_path(tmp_path):
    root = tmp_path / "cg"
    leaf = root / "kubepods.slice" / "pod1" / "ctr"
    leaf.mkdir(parents=True)
    (root / "kubepods.slice" / "memory.max").write_text("max\n")
    (root / "kubepods.slice" / "pod1" / "memory.max").write_text(f"{256 << 20}\n")
    (leaf / "memory.max").write_text("max\n")
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text("0::/kubepods.slice/pod1/ctr\n")
    assert spawn.memory_max(root, proc) == 256 << 20
    (proc / "cgroup").write_text("0::/\n")
    assert spawn.memory_max(root, proc) is None
    (proc / "cgroup").write_text("5:memory:/docker/x\n")  # cgroup v1
    (root / "memory" / "docker" / "x").mkdir(parents=True)
    (root / "memory" / "docker" / "x" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert spawn.memory_max(root, proc) is None  # v1's "unlimited"


def test_the_worker_offers_itself_to_the_oom_killer(tmp_path, shared_fixtures, gate, monkeypatch):
    d = _drop(tmp_path, shared_fixtures, KINETO)
    d.importer.probe()
    t, _, pid = _gated_scan(d, gate, monkeypatch)
    try:
        assert Path(f"/proc/{pid}/oom_score_adj").read_text().strip() == "1000"
        assert Path("/proc/self/oom_score_adj").read_text().strip() != "1000"
    finally:
        (gate / "go").touch()
        t.join(60)
        d.close()


# ------------------------------------------------------------------ 5: no privileges in the worker
def _nobody_can_run(python: Path) -> bool:
    if os.geteuid() != 0 or not python.exists():
        return False
    probe = subprocess.run([str(python), "-I", "-S", "-c", "pass"], user=spawn.NOBODY, group=spawn.NOBODY,
                           extra_groups=[], capture_output=True, cwd="/")
    return probe.returncode == 0


@pytest.fixture
def package_nobody_reads(monkeypatch):
    """The exporter package copied where uid 65534 can read it (a checkout may sit under /root,
    0700; an installed wheel is readable by all), handed to the worker as its package root."""
    root = Path(tempfile.mkdtemp(prefix="ugx-pkg-"))
    try:
        shutil.copytree(Path(isolate.__file__).resolve().parent.parent, root / "exporter",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for d, _, files in os.walk(root):
            os.chmod(d, 0o755)
            for f in files:
                os.chmod(os.path.join(d, f), 0o644)
        monkeypatch.setattr(isolate, "_PACKAGE_ROOT", str(root))
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _look_at_a_worker(tmp_path: Path, shared_fixtures: Path, gate: Path, monkeypatch, importer: Importer
                      ) -> tuple[dict[str, str], object]:
    """The status of a worker held at the gate while it imports the nsys export (an SQLite
    copy in scratch/, which its user must be able to write), and the import's outcome."""
    d = _drop(tmp_path, shared_fixtures, NSYS)
    d.importer = importer
    t, box, pid = _gated_scan(d, gate, monkeypatch)
    try:
        status = _status(pid)
    finally:
        (gate / "go").touch()
        t.join(60)
        d.close()
    return status, box[0][0]


@pytest.mark.skipif(not _nobody_can_run(SYSTEM_PYTHON), reason=f"needs root and {SYSTEM_PYTHON} (uid 65534 "
                    "cannot run the interpreter under /root)")
def test_as_root_the_worker_runs_under_a_uid_of_its_own_without_capabilities(tmp_path, shared_fixtures, gate,
                                                                              monkeypatch, package_nobody_reads):
    """Issue 37, item 3: not the shared uid 65534 (any process of "nobody" could signal it or
    take its descriptors), but a uid no passwd entry names and no other process runs as."""
    imp = Importer()
    imp.python = str(SYSTEM_PYTHON)
    assert imp.probe() == []
    uid = imp.creds["user"]
    assert uid in spawn.OWN_UIDS and imp.creds == {"user": uid, "group": uid, "extra_groups": []}
    status, out = _look_at_a_worker(tmp_path, shared_fixtures, gate, monkeypatch, imp)
    assert status["Uid"].split() == [str(uid)] * 4 and status["Gid"].split() == [str(uid)] * 4
    assert status["Groups"].strip() == ""
    for cap in ("CapEff", "CapPrm", "CapInh", "CapAmb"):
        assert int(status[cap], 16) == 0, (cap, status[cap])
    assert out.profile is not None, out  # the fds it was given and its SQLite folder: readable


@pytest.mark.skipif(not _nobody_can_run(SYSTEM_PYTHON), reason=f"needs root and {SYSTEM_PYTHON} (uid 65534 "
                    "cannot run the interpreter under /root)")
def test_as_another_uid_the_sqlite_copy_goes_to_scratch_where_nobody_reaches_it(shared_fixtures, monkeypatch,
                                                                           package_nobody_reads):
    """SQLite resolves its path: uid 65534 needs o+x on every folder above scratch/ (0711).  Here
    the temp dir is unusable (a read-only root), so only scratch/ can take the copy."""
    from exporter import safefile

    def read_only(*_a, **_k):
        raise OSError(errno.EROFS, "Read-only file system")
    base = Path(tempfile.mkdtemp(prefix="ugx-reach-"))
    try:
        os.chmod(base, 0o755)
        d = DropDir(base / "drop", settle=0)
        d.setup()
        d.importer.python = str(SYSTEM_PYTHON)
        assert d.importer.probe() == [] and d.importer.creds["user"] in spawn.OWN_UIDS
        monkeypatch.setattr(safefile, "private_dir", read_only)
        shutil.copy(shared_fixtures / "profilers" / NSYS, base / "drop" / NSYS)
        [out] = d.scan(now=time.time() + 10)
        assert out.profile is not None, out
        d.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_as_root_that_cannot_switch_users_the_worker_drops_every_capability(tmp_path, shared_fixtures, gate,
                                                                            monkeypatch):
    imp = Importer()
    imp.probe()
    imp.creds = {}  # as where uid 65534 cannot run Python, or without CAP_SETUID
    status, out = _look_at_a_worker(tmp_path, shared_fixtures, gate, monkeypatch, imp)
    assert status["Uid"].split()[1] == "0"
    for cap in ("CapEff", "CapPrm", "CapInh", "CapAmb", "CapBnd"):
        assert int(status[cap], 16) == 0, (cap, status[cap])
    assert status["NoNewPrivs"].strip() == "1"
    assert out.profile is not None, out


DAEMON = textwrap.dedent("""\
    import json, sys, threading, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from exporter.importers import isolate, spawn
    show = "import sys; sys.stdout.write(open('/proc/self/status').read())"
    proc = spawn.spawn([sys.executable, "-I", "-S", "-c", show], (), {})
    out, _ = proc.communicate(timeout=30)
    child = {k: int(v, 16) for k, v in (line.split(":") for line in out.decode().splitlines() if line.startswith("Cap"))}
    # a whole import: the worker, held at the gate, needs no capset (the unit's seccomp denies it)
    gate, imp = Path(sys.argv[2]), isolate.Importer()
    imp.probe()
    isolate.BOOT = sys.argv[4]
    done = []
    t = threading.Thread(target=lambda: done.append(imp.file(Path(sys.argv[3])).profile.tool), daemon=True)
    t.start()
    end = time.monotonic() + 50
    while not (gate / "ready").exists() and time.monotonic() < end:
        time.sleep(0.005)
    pid = (gate / "ready").read_text()
    worker = spawn.capabilities(pid)
    nnp = [l.split()[1] for l in open(f"/proc/{pid}/status") if l.startswith("NoNewPrivs")]
    (gate / "go").touch()
    t.join(50)
    print(json.dumps({"own": spawn.capabilities("self"), "child": child, "worker": worker, "nnp": nnp,
                      "done": done}))
    """)


@pytest.mark.skipif(not (os.geteuid() == 0 and shutil.which("setpriv") and _nobody_can_run(SYSTEM_PYTHON)),
                    reason="needs root, setpriv (util-linux) and a Python any user can run")
def test_ambient_capabilities_do_not_reach_the_worker(shared_fixtures, gate):
    """The shipped unit: a non-root user with AmbientCapabilities=CAP_SYS_PTRACE
    CAP_DAC_READ_SEARCH, which survive execve.  The worker starts with none, and never has to
    drop them itself (the unit's seccomp filter denies capset: the worker would refuse to run)."""
    # the package where uid 61234 can read it: a checkout may sit in a 0700 folder (issue 38)
    copy = readable_copy()
    repo = str(copy.__enter__())
    drop = Path(tempfile.mkdtemp(prefix="ugx-drop-"))
    try:
        os.chmod(drop, 0o755)
        shutil.copy(shared_fixtures / "profilers" / KINETO, drop / "t.json")
        os.chmod(drop / "t.json", 0o644)
        cmd = ["setpriv", "--reuid=61234", "--regid=61234", "--clear-groups",
               "--inh-caps=+sys_ptrace,+dac_read_search", "--ambient-caps=+sys_ptrace,+dac_read_search",
               str(SYSTEM_PYTHON), "-c", DAEMON, repo, str(gate), str(drop / "t.json"), _gated(gate)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=55, cwd="/")
    finally:
        shutil.rmtree(drop, ignore_errors=True)
        copy.__exit__(None, None, None)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["own"]["CapAmb"] != 0 and got["own"]["CapEff"] != 0  # the daemon keeps its own
    for who in ("child", "worker"):
        assert got[who]["CapAmb"] == 0 and got[who]["CapEff"] == 0 and got[who]["CapPrm"] == 0, got
    assert got["nnp"] == ["0"], got  # BOOT's own capset path (denied under the unit) never ran
    assert got["done"] == ["kineto"], got


# ------------------------------------------------------------------ 6: the answer is hostile input
GOOD = {"ok": True, "profile": {"tool": "kineto", "variant": "v", "path": "p", "trace_id": "", "trace_id_from": "",
                                "wall_zero_ns": None, "warnings": []},
        "devices": [{"key": "profiles:kineto:0", "vendor": "nvidia", "index": "0", "mapping": "profiles/kineto",
                     "uuid": "", "model": "", "pci_bus_id": ""}],
        "labels": [[["kernel", "k"]]], "readings": [[0, "kernel.executions", 1.0, 0]], "errors": {"x": 1},
        "summary": None}


def _forged(**changes) -> bytes:
    doc = json.loads(json.dumps(GOOD))
    for path, value in changes.items():
        *head, last = path.split("__")
        node = doc
        for k in head:
            node = node[int(k)] if isinstance(node, list) else node[k]
        node[int(last) if isinstance(node, list) else last] = value
    return json.dumps(doc).encode()


@pytest.mark.parametrize("answer", [
    _forged(readings=[[0, "kernel.executions", 10 ** 400, 0]]),  # OverflowError in float()
    _forged(readings=[[0, "kernel.executions", "@INF@", 0]]).replace(b'"@INF@"', b"1e999"),
    _forged(readings=[[0, "kernel.executions", "@INF@", 0]]).replace(b'"@INF@"', b"-1e999"),
    _forged(labels="@DEEP@").replace(b'"@DEEP@"', b"[" * 100_000 + b"]" * 100_000),  # RecursionError
    _forged(labels=[[["kernel", "k"]]] * 20_001),  # more label sets than series
    _forged(errors={f"k{i}": 1 for i in range(65)}),
    _forged(errors={"x": -1}),
    _forged(devices__0__mapping="nvml"),  # another mapping's raw fields
    _forged(devices__0__key="nvml:0"),  # another source's device
    _forged(devices__0__vendor="acme"),
    _forged(profile__tool="nvml"),
    _forged(labels=[[["gpu", "0"]]]),  # a label convert never gives (an identity label)
])
def test_a_forged_answer_is_refused_whole(answer):
    with pytest.raises(ProfileRejected, match="answer") as exc:
        isolate._decode(answer, ImportLimits())
    assert exc.value.kind == "crash"


def test_with_mappings_only_mapped_fields_are_accepted():
    allowed = {"profiles/kineto": frozenset({"kernel.executions"})}
    assert isolate._decode(_forged(), ImportLimits(), allowed).sample.readings[0].value == 1.0
    with pytest.raises(ProfileRejected, match="not one profiles/kineto maps"):
        isolate._decode(_forged(readings=[[0, "kernel.secret", 1.0, 0]]), ImportLimits(), allowed)


# ------------------------------------------------------------------ 7, 8: the pipe loop and the environment
def test_leaving_the_answer_loop_by_an_exception_kills_the_worker(tmp_path, gate, monkeypatch):
    """Before: the child was left running and wait4 blocked the import thread for good."""
    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": []}))
    imp = Importer()
    imp.probe()
    monkeypatch.setattr(isolate, "BOOT", _gated(gate))  # the worker waits at the gate: forever here
    calls = 0

    def cancel() -> bool:
        nonlocal calls
        calls += 1
        if (gate / "ready").exists():
            raise RuntimeError("a bug in the caller")
        return False
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        t, box = _in_thread(lambda: imp(fd, "t.json", cancel=cancel))
        pid = _wait_ready(gate)
        t.join(30)
        alive = t.is_alive()
        if alive:  # old code: unblock it so the test ends
            os.kill(pid, signal.SIGKILL)
            t.join(30)
        assert not alive, "the import thread hung in wait4 with the worker still running"
        assert isinstance(box[0], RuntimeError)
        assert not Path(f"/proc/{pid}").exists()  # killed and reaped
    finally:
        os.close(fd)


def test_the_worker_keeps_ld_library_path_and_nothing_else(tmp_path, shared_fixtures, gate, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/ugx-test/lib")
    monkeypatch.setenv("UGX_SECRET_TOKEN", "x")
    d = _drop(tmp_path, shared_fixtures, KINETO)
    d.importer.probe()
    t, box, pid = _gated_scan(d, gate, monkeypatch)
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    finally:
        (gate / "go").touch()
        t.join(60)
        d.close()
    assert [e for e in env if e] == [b"LD_LIBRARY_PATH=/opt/ugx-test/lib"]
    assert box[0][0].profile is not None
