"""One capability helper (``exporter/privsep/caps.py``): the serving process, the counting
process's and the import worker's boot scripts and the capture supervisor run the same source
text; nothing else in the package calls prctl or capset through ctypes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from exporter.importers import capture_run, worker
from exporter.privsep import caps, child
from tests.conftest import REPO, require_binary

COUNT_CAPS = (1 << 19) | (1 << 2)


def test_every_boot_script_starts_with_the_shared_source():
    for script in (child.BOOT, worker.BOOT, capture_run.SUPERVISOR):
        assert script.startswith(caps.SOURCE)
        rest = script[len(caps.SOURCE):]
        assert "CDLL" not in rest and "capset(" not in rest.replace("restrict(", "")


def test_no_other_module_calls_prctl_or_capset_through_ctypes():
    others = []
    for path in (REPO / "exporter").rglob("*.py"):
        if path.name == "caps.py" and path.parent.name == "privsep":
            continue
        text = path.read_text(encoding="utf-8")
        if "CDLL(None" in text and ("prctl" in text or "capset" in text):
            others.append(str(path.relative_to(REPO)))
    assert others == []


DROP = """
import json, sys
from exporter.privsep.caps import capabilities, lower_effective, restrict
lower_effective()  # as the CLI does before it reads its configuration
after_lower = capabilities("self")
restrict(int(sys.argv[1]))
status = {l.split(":")[0]: l.split(":")[1].strip() for l in open("/proc/self/status") if ":" in l}
print(json.dumps({"lower": after_lower, "after": capabilities("self"), "nnp": status["NoNewPrivs"]}))
"""


@pytest.mark.parametrize("keep", [0, COUNT_CAPS])
def test_restrict_after_lower_effective_keeps_only_what_it_is_told(keep):
    r = subprocess.run([sys.executable, "-c", DROP, str(keep)], capture_output=True, text=True, timeout=60,
                       cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["lower"]["CapEff"] == 0 and got["nnp"] == "1"
    after = got["after"]
    held = got["lower"]["CapPrm"] & keep
    assert (after["CapPrm"], after["CapEff"], after["CapAmb"], after["CapInh"]) == (held, held, 0, 0)
    if os.geteuid() == 0:  # root holds CAP_SETPCAP: the bounding set goes too, though the
        assert after["CapBnd"] == keep  # effective set was emptied before


def test_capabilities_that_cannot_be_read_raise():
    """Fail closed: an unreadable /proc/<pid>/status is never read as 'nothing held'."""
    with pytest.raises(OSError):
        caps.capabilities("0")  # no such task
    with pytest.raises(OSError):
        caps.capabilities("self/no-such-task")


def test_the_import_worker_refuses_to_run_when_it_cannot_read_its_capabilities(tmp_path):
    """The worker's BOOT in a mount namespace whose /proc is an empty tmpfs: it cannot verify
    that it holds nothing, so it refuses (before, it took 'unreadable' for 'nothing held')."""
    if os.geteuid() != 0:
        pytest.skip("needs root: it mounts over /proc in a mount namespace of its own")
    unshare = require_binary("unshare", "util-linux")
    script = 'mount -t tmpfs none /proc && exec "$0" -I -S -c "$1" 1000000000 30 1000000 "$2"'
    r = subprocess.run([unshare, "--mount", "--propagation", "private", "sh", "-c", script,
                        sys.executable, worker.BOOT, str(REPO)],
                       input='{"probe": true}', capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["ok"] is False and got["kind"] == "environment", got
    assert "cannot drop its capabilities" in got["reason"], got


def test_held_skips_a_thread_that_ended_while_being_read_and_nothing_else(monkeypatch):
    """counter.held lists /proc/<pid>/task and reads each thread's status: a thread that ends in
    between (a CI run met one: FileNotFoundError on its status) held nothing any more and is
    skipped (FileNotFoundError at the open, ProcessLookupError at a read after the open); a status
    that cannot be read while its thread is still there stays an error."""
    from exporter.privsep import counter

    real = os.listdir
    monkeypatch.setattr(counter.os, "listdir", lambda path: [*real(path), "999999999"])
    assert set(counter.held()) == {"CapPrm", "CapEff", "CapAmb", "CapInh"}
    real_caps = counter.capabilities

    def reaped_at_the_read(pid):  # opened, then reaped: the read answers ESRCH
        if pid.endswith("/999999999"):
            raise ProcessLookupError(pid)
        return real_caps(pid)

    monkeypatch.setattr(counter, "capabilities", reaped_at_the_read)
    assert set(counter.held()) == {"CapPrm", "CapEff", "CapAmb", "CapInh"}

    def unreadable(pid):
        raise FileNotFoundError(pid)

    monkeypatch.setattr(counter, "capabilities", unreadable)
    monkeypatch.setattr(counter.os, "listdir", real)
    with pytest.raises(FileNotFoundError):
        counter.held()
