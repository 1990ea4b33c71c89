"""What amdsmi's busy-client count needs: a real uid of 0, not capabilities (docs/privileges.md).

amdsmi builds its process list (ROCm ``gpuvsmi_get_pids``) from the ``/proc/<pid>`` entries whose
``fdinfo`` passes ``access(R_OK)``.  access() checks with the REAL uid, and for a non-root real
uid with no capabilities at all, so the systemd unit (``DynamicUser``, ambient CAP_SYS_PTRACE +
CAP_DAC_READ_SEARCH) opens another user's fdinfo (DRM fdinfo's count is complete) while amdsmi
skips it (its count reads ``procfs_unreadable``).  The kernel's behaviour is checked here with
real processes under ``setpriv`` (root only: only root can start them), and the documents that
describe it are checked to say so.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, require_binary
from tests.readable_copy import SYSTEM_PYTHON, readable_copy

TARGET_UID, CHECKER_UID = 65533, 65534
CAPS = "+sys_ptrace,+dac_read_search"
CHECK = """
import os, sys
from pathlib import Path
from exporter.sources.evidence import procfs_visibility
fdinfo = f"/proc/{sys.argv[1]}/fdinfo"
try:
    opened = bool(os.listdir(fdinfo))
except OSError:
    opened = False
print(os.getuid(), os.access(fdinfo, os.R_OK), opened, procfs_visibility(Path("/proc"), True)[1] or "complete")
"""


def _uid_of(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _check(setpriv: str, pid: int, *args: str) -> list[str]:
    # a Python and a copy of the package any uid can read: a checkout may sit in a 0700 folder
    # (issue 38), and the check needs only the standard library
    with readable_copy() as pkg:
        out = subprocess.run([setpriv, *args, str(SYSTEM_PYTHON), "-I", "-c", f"import sys; sys.path.insert(0, {str(pkg)!r})\n"
                              + CHECK, str(pid)], capture_output=True, text=True, cwd="/", timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.fixture
def other_users_process():
    if os.geteuid() != 0:
        pytest.skip("needs root: it starts processes under other uids with setpriv")
    setpriv = require_binary("setpriv", "util-linux")
    proc = subprocess.Popen([setpriv, f"--reuid={TARGET_UID}", f"--regid={TARGET_UID}", "--clear-groups",
                             "sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while _uid_of(proc.pid) != TARGET_UID:  # setpriv switches uid before it execs sleep
            assert time.monotonic() < deadline, "the target process never ran as its uid"
            time.sleep(0.01)
        yield setpriv, proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_capabilities_open_another_users_fdinfo_but_amdsmis_access_check_refuses_it(other_users_process):
    setpriv, pid = other_users_process
    # the systemd unit: a non-root real uid with the two capabilities, ambient
    uid, access, opened, visibility = _check(setpriv, pid, f"--reuid={CHECKER_UID}", f"--regid={CHECKER_UID}",
                                             "--clear-groups", f"--inh-caps={CAPS}", f"--ambient-caps={CAPS}")
    assert (uid, access, opened) == (str(CHECKER_UID), "False", "True")  # DRM fdinfo reads it, amdsmi skips it
    assert visibility == "procfs_unreadable"  # what the exporter reports for amdsmi's count there
    # without the capabilities nothing reads it
    assert _check(setpriv, pid, f"--reuid={CHECKER_UID}", f"--regid={CHECKER_UID}", "--clear-groups")[1:3] == [
        "False", "False"]
    # real uid 0 with only the two capabilities (the client-count component): access() passes
    uid, access, opened, _ = _check(setpriv, pid, f"--bounding-set=-all,{CAPS}", "--inh-caps=-all")
    assert (uid, access, opened) == ("0", "True", "True")


def test_the_documents_say_amdsmi_needs_a_real_uid_of_0():
    doc = (REPO / "docs" / "privileges.md").read_text()
    [row] = [ln for ln in doc.splitlines() if ln.startswith("| amdsmi busy-client count")]
    assert "real uid 0" in row and "any user with the capabilities" not in row
    unit = (REPO / "systemd" / "unified-gpu-exporter.service").read_text()
    assert "NVML, amdsmi and sysfs readers need none" not in unit
    assert "amdsmi's busy-client count stays partial" in unit
