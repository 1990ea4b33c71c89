"""Profiles source: profiler artifacts dropped in a directory (and triggered captures) as series.

Options (``collectors.profiles.options``)::

    dir: /var/lib/unified-gpu-exporter/profiles   # required: the drop directory
    top_kernels: 10        # kernels per GPU that keep their name; the rest are kernel="other"
    max_profiles: 16       # imported artifacts kept exported (oldest dropped first)
    settle: 1.0            # seconds a file must stay unchanged before it is imported
    scan_interval: 2.0     # seconds between scans of the directory
    max_file_bytes: 536870912
    restore: true          # re-read imported/ at start so series survive a restart
    ttl: 600               # seconds an import stays exported (0: until replaced); restored
                           # imports count from the restart
    max_devices_per_import: 16     # an artifact naming more GPUs is rejected
    max_series_per_import: 20000   # an artifact giving more series is rejected
    max_series_total: 50000        # all kept imports: the oldest are evicted to make room
                                   # (default: 50000 or max_series_per_import if larger)
    max_events_per_import: 1000000 # trace events / table rows read from one artifact
    import_memory_bytes: 805306368   # each artifact is parsed in a child process with
    import_cpu_seconds: 60           # these kernel limits (RLIMIT_AS, RLIMIT_CPU) and
    import_timeout: 120              # this wall-clock deadline (exporter/importers/isolate.py)
    trigger: {...}         # triggered deep capture, see exporter/importers/trigger.py

Imports run in a background thread, never in ``poll``, and each artifact is parsed in a child
process with memory, CPU and time limits: a huge or hostile file cannot stall the daemon or grow
its memory, and a parser failure only moves the file to ``rejected/``.  A rejection is counted
by the limit it hit: ``profile_rejected`` (not a supported artifact) or
``profile_rejected_<kind>`` (size, memory, time, events, devices, series, output, crash).  An
import that is no fault of the file is deferred, not rejected (the file is tried again):
``profile_deferred_stopped`` (the exporter was stopping), ``profile_deferred_environment``
(no worker could start, no room for an SQLite copy) or ``profile_deferred_killed`` (its worker
killed from outside, once per file).  ``open`` starts one worker that parses
nothing: where none can run, the source is down with the reason.  ``poll`` returns the series
of the imported artifacts, which stay exported until a newer import of the same tool, GPUs and
trace id replaces them or until they are ``ttl`` seconds old: they are profiler results, not
live hardware readings, and a stale one must not keep driving live indicators and alerts.  A
GPU is exported (as a device and in ``gpu_profile_imports_total``) only while a kept import
names it: expired and evicted imports take their GPUs with them.

``provides_identity = False``: an artifact GPU whose UUID a native source knows (nsys exports
carry it) takes that GPU's vendor/gpu/uuid labels; others keep the tool's device id as ``gpu``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from typing import ClassVar

from ..model import Frames
from ..sources.base import Abilities, Device, PollResult, Reading, SourceBase, SourceUnavailable
from ..sources.context import DEFAULT_CONTEXT, SourceContext
from ..sources.options import ProfilesOptions
from .convert import checked_sample
from .dropdir import DropDir, Outcome
from .isolate import Importer, ImportLimits
from .model import Profile, ProfileRejected
from .trigger import CaptureTrigger, TriggerConfig

log = logging.getLogger("unified_gpu_exporter")


class ProfilesSource(SourceBase):
    name: ClassVar[str] = "profiles"
    # borrows identity from native sources; arms triggered captures from the indicators' output
    abilities = Abilities(provides_identity=False, observes_indicators=True)

    def __init__(self, context: SourceContext = DEFAULT_CONTEXT):
        opts = context.typed(ProfilesOptions)
        self.dir = str(opts.dir or "")
        self.top_kernels = opts.top_kernels
        self.max_profiles = opts.max_profiles
        self.scan_interval = opts.scan_interval
        self.restore_on_open = opts.restore
        self.ttl = opts.ttl
        if not self.ttl >= 0:  # also rejects NaN
            raise ValueError(f"profiles ttl must be >= 0 seconds, got {self.ttl!r}")
        self.max_devices = opts.max_devices_per_import
        self.max_series = opts.max_series_per_import
        self.max_series_total = opts.max_series_total  # ProfilesOptions fills it in: never None
        self.clock = time.monotonic
        self.limits = ImportLimits(
            max_bytes=opts.max_file_bytes, max_events=opts.max_events_per_import, max_devices=self.max_devices,
            max_series=self.max_series, memory_bytes=opts.import_memory_bytes, cpu_seconds=opts.import_cpu_seconds,
            timeout=opts.import_timeout)
        # per mapping file, the raw fields it maps: an artefact's other fields are not emitted
        self._allowed = context.wanted
        self.drop = DropDir(self.dir or ".", settle=opts.settle,
                            importer=Importer(self.limits, self.top_kernels, self._allowed))
        self.trigger = CaptureTrigger(TriggerConfig.from_options(
            opts.trigger.model_dump() if opts.trigger is not None else None), self._deliver)
        self._lock = threading.Lock()
        # (tool, trace_id, device keys) -> (devices, readings, import time); newest last
        self._results: OrderedDict[tuple, tuple[list[Device], list[Reading], float]] = OrderedDict()
        self._devices: dict[str, Device] = {}
        self._imports: Counter[str] = Counter()
        self._errors: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._scan_lock = threading.Lock()

    # ------------------------------------------------------------------ Source protocol
    def open(self) -> None:
        if not self.dir:
            raise SourceUnavailable("no drop directory: set collectors.profiles.options.dir")
        try:
            moved = self.drop.setup()
        except OSError as exc:
            raise SourceUnavailable(f"drop directory {self.dir}: {exc}") from None
        try:  # once: can an import worker run here at all (and fit the cgroup's memory limit)?
            for warning in self.drop.importer.probe():
                log.warning("profiles: %s", warning)
        except ProfileRejected as exc:
            self.drop.close()
            raise SourceUnavailable(f"profiles: {exc}") from None
        if moved:
            with self._lock:
                self._errors["profile_rejected"] += moved
        self._stop.clear()
        self.drop.stopping.clear()
        self._thread = threading.Thread(target=self._loop, name="profiles-import", daemon=True)
        self._thread.start()

    def poll(self) -> PollResult:
        sample = PollResult()
        with self._lock:
            if self.ttl > 0:
                cutoff = self.clock() - self.ttl
                expired = [k for k, (_, _, at) in self._results.items() if at < cutoff]
                for key in expired:
                    del self._results[key]
                    self._errors["profile_expired"] += 1
                if expired:
                    self._forget_devices()
            for _devices, readings, _at in reversed(self._results.values()):  # newest first wins
                sample.readings.extend(readings)
            for key, n in self._imports.items():
                sample.readings.append(Reading(key, "profile.imports", float(n)))
            sample.devices = list(self._devices.values())
            sample.errors, self._errors = self._errors, Counter()
        return sample

    def close(self) -> None:
        self._stop.set()
        self.drop.stopping.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=2.0)
        if t is None or not t.is_alive():  # a held fd is closed only once nothing can use it
            self.drop.close()
        self._thread = None

    # ------------------------------------------------------------------ imports
    def _loop(self) -> None:
        if self.restore_on_open:
            try:
                for o in self.drop.restore(self.max_profiles):
                    if o.profile is not None:
                        self.add(o.profile, count=False, converted=_converted(o))
                    else:  # deferred (no worker could run): left in imported/
                        self._count(o)
            except Exception:  # noqa: BLE001 - never let the import thread die
                log.exception("restoring imported profiles failed")
        # the first scan after one interval: files found at start still get their settle time
        while not self._stop.wait(self.scan_interval):
            self.scan_once()

    def scan_once(self) -> int:
        """Import what is ready in the drop directory; returns the number of imported artifacts."""
        with self._scan_lock:
            try:
                outcomes = self.drop.scan()
            except Exception as exc:  # noqa: BLE001
                log.exception("profile scan failed")
                with self._lock:
                    self._errors["exception"] += 1
                log.debug("scan error", extra={"reason": str(exc)})
                return 0
            return self._keep(outcomes)

    def _keep(self, outcomes) -> int:
        n = 0
        for o in outcomes:
            if o.profile is not None:
                self.add(o.profile, converted=_converted(o))
                n += 1
                log.info("profile imported", extra={"file": o.name, "tool": o.profile.tool,
                                                    "variant": o.profile.variant,
                                                    "trace_id": o.profile.trace_id})
            elif not o.companion:
                self._count(o)
        return n

    def _count(self, o: Outcome) -> None:
        with self._lock:  # by the limit it hit: profile_rejected_memory, _time, ...; or deferred
            self._errors[("profile_deferred" if o.deferred else "profile_rejected")
                         + (f"_{o.kind}" if o.kind else "")] += 1

    def _convert(self, prof: Profile) -> tuple[list[Device], PollResult]:
        """A profile parsed in this process: its devices and readings, or ProfileRejected above
        the per-import caps."""
        return checked_sample(prof, self.top_kernels, self._allowed, self.max_devices, self.max_series)

    def add(self, prof: Profile, count: bool = True,
            converted: tuple[list[Device], PollResult] | None = None) -> None:
        """Keep one profile's readings (replacing an older one of the same key)."""
        devices, sample = converted if converted is not None else self._convert(prof)
        key = (prof.tool, prof.trace_id, tuple(sorted(d.key for d in devices)))
        with self._lock:
            self._results.pop(key, None)
            self._results[key] = (devices, sample.readings, self.clock())
            evicted = 0
            # the oldest imports leave first: above max_profiles, or above max_series_total series
            # all kept imports together (the newest one always stays: it is within its own cap)
            total = sum(len(readings) for _, readings, _ in self._results.values())
            while len(self._results) > 1 and (len(self._results) > max(self.max_profiles, 1)
                                              or total > self.max_series_total):
                _, (_, readings, _) = self._results.popitem(last=False)
                total -= len(readings)
                evicted += 1
            if evicted:
                self._errors["profile_evicted"] += evicted
            for d in devices:
                self._devices[d.key] = d
                if count:
                    self._imports[d.key] += 1
            if evicted:
                self._forget_devices()
            self._errors.update(sample.errors)

    def _forget_devices(self) -> None:
        """Drop the devices (and their import counts) that no kept import names (under _lock)."""
        live = {d.key for devices, _, _ in self._results.values() for d in devices}
        for key in [k for k in self._devices if k not in live]:
            del self._devices[key]
            self._imports.pop(key, None)

    # ------------------------------------------------------------------ triggered capture
    def observe_indicators(self, now: float, device_id: str, series: dict[str, float],
                           info: dict[str, str] | None = None) -> bool:
        """Current canonical values of one GPU.  Starts a capture in the background when the
        trigger fires; returns whether it did.  ``info`` fills {vendor} {gpu} {uuid} in the command."""
        if not self.trigger.observe(now, device_id, series):
            return False
        threading.Thread(target=self._capture, args=(device_id, info), name="profiles-capture",
                         daemon=True).start()
        return True

    def observe_indicator_output(self, now: float, frames: Frames) -> int:
        """Daemon hook: the indicator engine's output per GPU (``IndicatorFeed.latest``).
        Returns the number of captures started."""
        if not self.trigger.cfg.enabled:
            return 0
        started = 0
        for (vendor, gpu, uuid), frame in frames.items():
            series = {name: value for (name, _), value in frame.items()}
            info = {"vendor": vendor, "gpu": gpu, "uuid": uuid}
            started += self.observe_indicators(now, f"{vendor}-{gpu}", series, info)
        return started

    def _capture(self, device_id: str, info: dict[str, str] | None = None) -> None:
        res = self.trigger.run_capture(device_id, info=info)
        if res.result in ("failed", "timeout"):
            with self._lock:
                self._errors[f"capture_{res.result}"] += 1

    def _deliver(self, staging_fd: int, names: list[str], meta: dict[str, str]) -> int:
        """The trigger's files, complete (the command has exited): imported now, from its
        private staging folder straight into processing/."""
        with self._scan_lock:
            return self._keep(self.drop.adopt(staging_fd, names, meta))


def _converted(o: Outcome) -> tuple[list[Device], PollResult]:
    assert o.result is not None
    return o.result.devices, o.result.sample
