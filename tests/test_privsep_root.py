"""Privilege separation with the real daemon, as root (issue 37): the serving process holds no
capability while the DRM fdinfo count of another user's process works through the counting
process, which alone holds CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH.

The other user's process is real (``setpriv`` to a uid of its own) and holds a real fd whose
link reads ``/dev/dri/renderD128`` (a file on a tmpfs mounted over ``/dev`` in a mount namespace
of its own: this machine has no DRM device).  Its fd table is the kernel's (``<procfs>/<pid>/fd``
links to the real ``/proc/<pid>/fd``: reading it is the kernel's ptrace-read check); its fdinfo
is a fixture file owned by that user, mode 0400 in a 0500 folder (the kernel's fdinfo of a plain
file has no ``drm-`` keys), so reading it takes CAP_DAC_READ_SEARCH as on a real node.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.privsep.caps import capabilities
from exporter.privsep.counter import COUNT_CAPS, held
from tests.conftest import require_binary
from tests.e2e_util import ProcessSet, children, http_get, start_exporter, wait_until
from tests.fdinfo_trees import add_card

OTHER_UID = 4243
PDEV = "0000:08:00.0"
FDINFO = ("pos:\t0\nflags:\t02100002\ndrm-driver:\tamdgpu\ndrm-pdev:\t" + PDEV + "\n"
          "drm-client-id:\t7\ndrm-memory-vram:\t1024 KiB\ndrm-engine-gfx:\t{ns} ns\n")


def _status(pid: int, key: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return line.split(":", 1)[1].strip()
    return ""


@pytest.fixture
def other_users_drm_client(tmp_path):
    """(pid, fd) of a process of uid OTHER_UID holding an fd on ``/dev/dri/renderD128``."""
    if os.geteuid() != 0:
        pytest.skip("needs root: it starts a process under another uid in a mount namespace of its own")
    unshare = require_binary("unshare", "util-linux")
    setpriv = require_binary("setpriv", "util-linux")
    script = ("mount -t tmpfs none /dev && mkdir /dev/dri && : > /dev/dri/renderD128 && "
              "exec 7<>/dev/dri/renderD128 && "
              f"exec {setpriv} --reuid={OTHER_UID} --regid={OTHER_UID} --clear-groups /bin/sleep 300")
    proc = subprocess.Popen([unshare, "--mount", "--propagation", "private", "/bin/sh", "-c", script])
    try:
        wait_until(lambda: os.stat(f"/proc/{proc.pid}").st_uid == OTHER_UID
                   and os.readlink(f"/proc/{proc.pid}/fd/7") == "/dev/dri/renderD128", 10)
        yield proc.pid, 7
    finally:
        proc.kill()
        proc.wait()


def _node(tmp_path: Path, pid: int, fd: int) -> tuple[Path, Path]:
    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    add_card(sysfs, 1, PDEV, driver="amdgpu")
    (proc / "2").mkdir(parents=True)
    (proc / "2" / "comm").write_text("kthreadd\n")
    base = proc / str(pid)
    base.mkdir()
    os.symlink(f"/proc/{pid}/fd", base / "fd")  # the kernel's fd table and its ptrace-read check
    (base / "comm").write_text("job\n")
    info = base / "fdinfo"
    info.mkdir()
    (info / str(fd)).write_text(FDINFO.format(ns=0))
    for p, mode in ((info / str(fd), 0o400), (info, 0o500)):
        os.chown(p, OTHER_UID, OTHER_UID)
        os.chmod(p, mode)
    return proc, sysfs


def _families(text: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_the_serving_process_holds_no_capability_while_the_count_works(tmp_path, other_users_drm_client):
    pid, fd = other_users_drm_client
    proc, sysfs = _node(tmp_path, pid, fd)
    setpriv = require_binary("setpriv", "util-linux")
    # what a process of uid 0 without capabilities (the serving process) may not do: read the
    # other user's fd table
    r = subprocess.run([setpriv, "--inh-caps=-all", "--bounding-set=-all", "ls", f"{proc}/{pid}/fd/"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "Permission denied" in r.stderr, r
    with ProcessSet() as procs:
        exporter = start_exporter(procs, tmp_path, ["--path.procfs", str(proc), "--path.sysfs", str(sysfs),
                                                    "--poll.interval", "500ms"], timeout=30)
        got: dict = {}

        def counted() -> bool:
            got.clear()
            got.update(_families(http_get(exporter.url + "/metrics").text))
            return got.get(("gpu_contention_evidence_info", (("evidence", "clients"), ("gpu", "1"), ("reason", ""),
                                                              ("source", "fdinfo"), ("uuid", f"pci-{PDEV}"),
                                                              ("vendor", "amd"))))
        wait_until(counted, 20)
        assert got[("unified_gpu_exporter_privilege_separated", (("source", "fdinfo"),))] == 1.0
        server = exporter.proc.pid
        # every thread of the serving process: no capability in any set, no new privileges
        assert held(str(server)) == {"CapPrm": 0, "CapEff": 0, "CapAmb": 0, "CapInh": 0}
        assert _status(server, "NoNewPrivs") == "1"
        (supervisor,) = children(server)
        (scanner,) = children(supervisor)
        for child in (supervisor, scanner):
            caps = capabilities(str(child))
            assert (caps["CapPrm"], caps["CapEff"], caps["CapAmb"], caps["CapInh"]) == (COUNT_CAPS, COUNT_CAPS, 0, 0)
            assert caps["CapBnd"] == COUNT_CAPS and _status(child, "NoNewPrivs") == "1"
            # non-dumpable: a process of its uid without CAP_SYS_PTRACE cannot read its /proc entries
            r = subprocess.run([setpriv, "--inh-caps=-all", "--bounding-set=-all", "cat", f"/proc/{child}/environ"],
                               capture_output=True, text=True)
            assert r.returncode != 0 and "Permission denied" in r.stderr, r


UNIT_UID = 61235  # a uid in systemd's DynamicUser range, as the unit runs the exporter
UNIT_CHECK = """
import json, os, sys
from pathlib import Path
from exporter.privsep.caps import capabilities, lower_effective
from exporter.privsep.counter import held, separate
from exporter.sources.fdinfo_records import LocalScanner
procfs, sysfs = Path(sys.argv[1]), Path(sys.argv[2])
before = held()
lower_effective()  # as the CLI does before it reads its configuration
counter = separate(procfs, sysfs)
remote = counter.scanner(procfs, sysfs)
remote.scan({}, 1.0)
local = LocalScanner(procfs, sysfs)
local.scan({}, 1.0)
print(json.dumps({"before": before, "after": held(), "uid": os.getuid(), "counter": capabilities(str(counter.pid)),
                  "remote": [remote.host_pids, remote.unreadable], "local": [local.host_pids, local.unreadable],
                  "sees_pid_2": os.path.exists(procfs / "2"), "sees_self": os.path.exists(procfs / str(os.getpid()))}))
counter.close()
"""


def test_as_the_units_dynamic_user_the_ambient_capabilities_go_to_the_counter_only(tmp_path):
    """The systemd unit's conditions, without systemd: a non-root uid with CAP_SYS_PTRACE and
    CAP_DAC_READ_SEARCH as ambient capabilities (its bounding set those two), no_new_privs, and a
    /proc mounted ``hidepid=ptraceable`` (``ProtectProc=ptraceable``).  The counting process keeps
    the two through its ``execve`` and sees every process (kthreadd: the host's PID namespace, every
    fd table readable); the serving process holds nothing and sees no other process."""
    if os.geteuid() != 0:
        pytest.skip("needs root: it mounts a procfs and switches to another uid with setpriv")
    from tests.readable_copy import SYSTEM_PYTHON, readable_copy

    unshare = require_binary("unshare", "util-linux")
    setpriv = require_binary("setpriv", "util-linux")
    sysfs = tmp_path / "sys"
    add_card(sysfs, 1, PDEV, driver="amdgpu")
    mnt = Path(tempfile.mkdtemp(prefix="ugx-proc-"))  # where the unit's uid may reach it
    mnt.chmod(0o755)
    caps = "+sys_ptrace,+dac_read_search"
    with readable_copy() as pkg, contextlib.ExitStack() as stack:
        stack.callback(mnt.rmdir)
        script = (f"mount -t proc -o hidepid=ptraceable proc {mnt} && exec {setpriv} --reuid={UNIT_UID} "
                  f"--regid={UNIT_UID} --clear-groups --inh-caps=-all,{caps} --ambient-caps=-all,{caps} "
                  f"--bounding-set=-all,{caps} --no-new-privs {SYSTEM_PYTHON} -I -c "
                  f"\"import sys; sys.path.insert(0, '{pkg}'); exec(sys.stdin.read())\" {mnt} {sysfs}")
        r = subprocess.run([unshare, "--mount", "--propagation", "private", "/bin/sh", "-c", script],
                           input=UNIT_CHECK, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["uid"] == UNIT_UID and got["before"]["CapAmb"] == COUNT_CAPS  # the unit's start
    assert got["after"] == {"CapPrm": 0, "CapEff": 0, "CapAmb": 0, "CapInh": 0}
    assert (got["counter"]["CapPrm"], got["counter"]["CapEff"], got["counter"]["CapAmb"]) == (COUNT_CAPS, COUNT_CAPS, 0)
    assert got["remote"] == [True, 0]  # the counter: the host's PID namespace, every fd table read
    # the serving process: its own processes only (kthreadd hidden, so in-process it would read
    # pid_namespace_private)
    assert got["sees_self"] is True and got["sees_pid_2"] is False and got["local"][0] is False


def test_the_daemon_exits_non_zero_when_the_counters_supervisor_dies(tmp_path):
    """Only the supervisor can start a scanner (the serving process holds no capability left
    to): once it is gone the count cannot come back, so the daemon logs it and exits 1 for its
    service manager to restart it (the unit: Restart=on-failure), instead of serving read_error
    for ever with privilege_separated still 1."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the daemon separates only when it holds the count capabilities")
    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    add_card(sysfs, 1, PDEV, driver="amdgpu")
    (proc / "2").mkdir(parents=True)
    (proc / "2" / "comm").write_text("kthreadd\n")
    with ProcessSet() as procs:
        exporter = start_exporter(procs, tmp_path, ["--path.procfs", str(proc), "--path.sysfs", str(sysfs),
                                                    "--poll.interval", "200ms"], timeout=30)
        wait_until(lambda: _families(http_get(exporter.url + "/metrics").text).get(
            ("unified_gpu_exporter_privilege_separated", (("source", "fdinfo"),))) == 1.0, 20)
        (supervisor,) = children(exporter.proc.pid)
        os.kill(supervisor, 9)
        wait_until(lambda: exporter.proc.poll() is not None, 20)
        assert exporter.proc.returncode == 1
        log = exporter.log_path.read_text()
        assert log.count("the counting process's supervisor exited") == 1, log
