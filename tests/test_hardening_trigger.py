"""Issue 37, items 5 and 10: the capture trigger.  Placeholders another party chose (a GPU's
uuid from an upstream target) cannot walk out of the staging folder or become an option; a
capture command whose child leaves the session (``setsid``) is killed at the timeout with
everything it started, and the next capture is not refused as busy."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from exporter.importers.trigger import CaptureTrigger, TriggerConfig

ARGS = "import json, sys\nopen('args.json', 'w').write(json.dumps(sys.argv[1:]))\n"

ESCAPER = r"""
import os, sys, time
pid = os.fork()
if pid == 0:
    os.setsid()  # out of the capture's process group and session
    if os.fork():
        os._exit(0)  # and reparented: the daemonizing double fork
    open(sys.argv[1], "w").write(str(os.getpid()))
    time.sleep(120)  # holding the output pipe
    os._exit(0)
time.sleep(120)
"""


def _trigger(tmp_path: Path, argv: list[str], timeout: float = 20) -> tuple[CaptureTrigger, list]:
    got: list = []

    def deliver(fd: int, names: list[str], meta: dict) -> None:
        if "args.json" in names:
            with open(os.open("args.json", os.O_RDONLY, dir_fd=fd)) as f:
                got.append(json.load(f))
    cfg = TriggerConfig.from_options({"enabled": True, "for_seconds": 0, "min_interval": 0, "timeout": timeout,
                                      "command": argv, "staging_dir": str(tmp_path)})
    return CaptureTrigger(cfg, deliver), got


def test_placeholders_from_a_peer_stay_inside_the_staging_folder(tmp_path):
    (tmp_path / "args.py").write_text(ARGS)
    os.chmod(tmp_path, 0o700)
    t, got = _trigger(tmp_path, [sys.executable, str(tmp_path / "args.py"), "{output_dir}/{uuid}/x", "{gpu}",
                                 "{device}", "{vendor}"])
    res = t.run_capture("../../../etc", info={"uuid": "../../escape", "gpu": "--output=/etc/passwd",
                                              "vendor": ".."})
    assert res.result == "ok", res.reason
    (args,) = got
    staging = args[0].rsplit("/", 2)[0]
    for a in args:  # before the fix: "<staging>/../../escape/x", "--output=/etc/passwd", "..", ...
        assert not a.startswith("-") and ".." not in a.split("/"), args
    assert os.path.normpath(args[0]).startswith(staging + "/")
    from exporter.importers.trigger import placeholder
    assert placeholder("GPU-5b7c3a2e-9d41") == "GPU-5b7c3a2e-9d41"  # a real uuid is kept as is
    assert placeholder("nvidia-0") == "nvidia-0" and placeholder("") == ""


def test_a_child_that_left_the_session_is_killed_at_the_timeout(tmp_path):
    (tmp_path / "escaper.py").write_text(ESCAPER)
    os.chmod(tmp_path, 0o700)
    pidfile = tmp_path / "escaped.pid"
    t, _ = _trigger(tmp_path, [sys.executable, str(tmp_path / "escaper.py"), str(pidfile)], timeout=1)
    results: list = []
    th = threading.Thread(target=lambda: results.append(t.run_capture("gpu0")), daemon=True)
    th.start()
    th.join(30)  # before the fix: the escaped child held the output pipe for its 120 s
    escaped = int(pidfile.read_text()) if pidfile.exists() else None
    try:
        assert not th.is_alive(), "the capture thread is still waiting after its timeout"
        assert results[0].result == "timeout"
        assert escaped is not None
        deadline = time.monotonic() + 10
        while Path(f"/proc/{escaped}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{escaped}").exists(), "the escaped child outlived the timeout"
        # and the trigger is free again: the next capture is not refused as busy
        assert t.run_capture("gpu0").result == "timeout"
        assert t.stats["busy"] == 0
    finally:
        if escaped is not None and Path(f"/proc/{escaped}").exists():
            os.kill(escaped, signal.SIGKILL)
