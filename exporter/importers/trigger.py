"""Triggered deep capture (the seed's conditional instrumentation).

When an indicator of one GPU stays above a threshold for ``for_seconds`` (default: the
``gpu_memory_contention`` 0/1 gauge above 0.5 for 30 s), run the configured capture command
(an nsys / ncu / rocprofv3 invocation or a wrapper script) with a timeout, at most once per
``min_interval``; the files it writes are handed to the drop directory (``DropDir.adopt``: into
processing/ with a sidecar trace id, never through the drop root that other users can write) and
imported like any dropped file.  Off by default.

Config (``collectors.profiles.options.trigger``)::

    enabled: true
    metric: gpu_memory_contention     # a canonical series name the daemon passes to observe()
    above: 0.5
    for_seconds: 30
    command: [/usr/local/bin/capture.sh, "{output}", "{device}"]   # argv, no shell
    timeout: 300                      # seconds; the whole process group is killed after it
    min_interval: 900                 # seconds between two captures (any GPU)
    staging_dir: ""                   # where each capture gets a fresh 0700 folder; default: the
                                      # system temp dir; must be owned by the exporter's user and
                                      # writable by nobody else (its ancestors too)

Placeholders in ``command``: ``{output}`` (path without extension inside an empty private
staging folder: write your files there), ``{output_dir}``, ``{device}``, ``{trace_id}``, and from the
GPU's canonical labels ``{vendor}``, ``{gpu}``, ``{uuid}``.  ``{device}``, ``{vendor}``, ``{gpu}``
and ``{uuid}`` can come from an upstream target (issue 37): each is reduced to ``[A-Za-z0-9._:-]``
(any other character becomes ``_``), at most 64 characters, and never starts with ``-`` or ``.``
(no option for the tool, no ``..`` path component).

The command runs under ``capture_run``'s supervisor: at its timeout, and when it ends, every
process it started is killed, even one that left its session (``setsid``).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import safefile
from . import capture_run

log = logging.getLogger("unified_gpu_exporter")
_UNSAFE = re.compile(r"[^A-Za-z0-9._:-]")


def placeholder(value: str) -> str:
    """A value another party chose (a GPU's uuid from an upstream target), safe as a path
    component and as an argument: ``[A-Za-z0-9._:-]`` only, at most 64 characters, no leading
    ``-`` or ``.``; "" stays ""."""
    value = _UNSAFE.sub("_", value)[:64]
    return "_" + value[1:] if value[:1] in ("-", ".") else value


@dataclass
class TriggerConfig:
    enabled: bool = False
    metric: str = "gpu_memory_contention"
    above: float = 0.5
    for_seconds: float = 30.0
    command: list[str] = field(default_factory=list)
    timeout: float = 300.0
    min_interval: float = 900.0
    staging_dir: str = ""

    @classmethod
    def from_options(cls, opts: dict[str, Any] | None) -> TriggerConfig:
        opts = dict(opts or {})
        unknown = set(opts) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"profiles.trigger: unknown options {sorted(unknown)}")
        cfg = cls(**opts)
        if isinstance(cfg.command, str):
            raise ValueError("profiles.trigger.command must be a list (argv), not a shell string")
        cfg.command = [str(a) for a in cfg.command]
        cfg.staging_dir = str(cfg.staging_dir or "")
        if cfg.enabled and not cfg.command:
            raise ValueError("profiles.trigger.enabled needs a command")
        for name in ("for_seconds", "timeout", "min_interval"):
            if float(getattr(cfg, name)) < 0:
                raise ValueError(f"profiles.trigger.{name} must not be negative")
        return cfg


@dataclass
class CaptureResult:
    result: str  # ok | failed | timeout | busy
    reason: str = ""
    files: list[str] = field(default_factory=list)  # names the command wrote
    trace_id: str = ""
    seconds: float = 0.0
    delivered: Any = None  # what ``deliver`` returned


# (staging directory fd, file names, sidecar meta) -> anything: imports the files
Deliver = Callable[[int, list[str], dict[str, str]], Any]


class CaptureTrigger:
    def __init__(self, cfg: TriggerConfig, deliver: Deliver | None = None):
        self.cfg = cfg
        self.deliver = deliver
        self.stats: Counter[str] = Counter()  # ok, failed, timeout, rate_limited, busy
        self._since: dict[str, float] = {}
        self._limited: set[str] = set()
        self._last: float | None = None
        self._lock = threading.Lock()
        self._running = False

    def observe(self, now: float, device_id: str, series: dict[str, float]) -> bool:
        """Feed the current indicator values of one GPU; True when a capture should run now."""
        if not self.cfg.enabled:
            return False
        v = series.get(self.cfg.metric)
        if v is None or not v > self.cfg.above:
            self._since.pop(device_id, None)
            self._limited.discard(device_id)
            return False
        since = self._since.setdefault(device_id, now)
        if now - since < self.cfg.for_seconds or self._running:
            return False
        if self._last is not None and now - self._last < self.cfg.min_interval:
            if device_id not in self._limited:  # once per episode
                self._limited.add(device_id)
                self.stats["rate_limited"] += 1
                log.info("capture rate limited", extra={"device": device_id, "metric": self.cfg.metric})
            return False
        self._last = now
        return True

    def run_capture(self, device_id: str = "", info: dict[str, str] | None = None) -> CaptureResult:
        """Run the command once (blocking), then move its files into the drop directory."""
        with self._lock:
            if self._running:
                self.stats["busy"] += 1
                return CaptureResult("busy", "a capture is already running")
            self._running = True
        t0 = time.monotonic()
        try:
            res = self._run(device_id, info or {})
        finally:
            self._running = False
        res.seconds = time.monotonic() - t0
        self.stats[res.result] += 1
        log.log(logging.INFO if res.result == "ok" else logging.WARNING, "capture finished",
                extra={"device": device_id, "result": res.result, "reason": res.reason,
                       "files": len(res.files), "trace_id": res.trace_id, "seconds": round(res.seconds, 3)})
        return res

    def _run(self, device_id: str, info: dict[str, str]) -> CaptureResult:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{time.time_ns() % 1000000:06d}"
        dev = re.sub(r"[^A-Za-z0-9._-]", "_", device_id)[:40] or "gpu"
        trace_id = f"capture-{stamp}"
        try:  # a fresh 0700 folder of our own: nobody else can plant a symlink where the tool writes
            staging = safefile.private_dir(self.cfg.staging_dir or None, prefix=f"ugx-capture-{dev}-")
        except OSError as exc:
            return CaptureResult("failed", f"no private staging folder: {exc}", trace_id=trace_id)
        try:
            return self._in(staging, stamp, dev, device_id, trace_id, info)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _in(self, staging: Path, stamp: str, dev: str, device_id: str, trace_id: str,
            info: dict[str, str]) -> CaptureResult:
        subst = {"output": str(staging / f"capture-{dev}-{stamp}"), "output_dir": str(staging),
                 "device": placeholder(device_id), "trace_id": trace_id,
                 "vendor": placeholder(info.get("vendor", "")), "gpu": placeholder(info.get("gpu", "")),
                 "uuid": placeholder(info.get("uuid", ""))}
        try:
            argv = [a.format(**subst) for a in self.cfg.command]
        except (KeyError, IndexError, ValueError) as exc:
            return CaptureResult("failed", f"bad placeholder in command: {exc}", trace_id=trace_id)
        log.info("capture started", extra={"device": device_id, "argv": " ".join(argv)})
        try:
            ran = capture_run.run(argv, staging, self.cfg.timeout)
        except OSError as exc:
            return CaptureResult("failed", f"cannot start {argv[0]!r}: {exc}", trace_id=trace_id)
        if ran.status == "timeout":
            return CaptureResult("timeout", f"killed after {self.cfg.timeout:g}s", trace_id=trace_id)
        if ran.code != 0:
            tail = ran.tail.decode(errors="replace").strip().splitlines()[-3:]
            why = f"exit status {ran.code}" if ran.code is not None else ran.status
            return CaptureResult("failed", f"{why}: {' | '.join(tail)[:300]}", trace_id=trace_id)
        fd = safefile.open_dir(staging)
        try:
            names = sorted(e.name for e in os.scandir(fd)
                           if stat.S_ISREG(e.stat(follow_symlinks=False).st_mode))
            if not names:
                return CaptureResult("failed", "the command wrote no file", trace_id=trace_id)
            delivered = None
            if self.deliver is not None:
                delivered = self.deliver(fd, names, {"trace_id": trace_id, "device": dev})
            return CaptureResult("ok", files=names, trace_id=trace_id, delivered=delivered)
        finally:
            os.close(fd)
