"""Feeds the store's frames to the indicator engine and keeps its latest output (frames too).

Per source, the engine's inputs are the last full poll's frames (``SourceState.frames``) with
what fast polls refreshed since laid on top (``SourceState.fast``), only the series the engine
reads; they are selected once per poll and refreshed when the fast overlay changes.  Two sources
of one GPU: the later one's values win.

The engine's output goes back to sources that declare ``Abilities.observes_indicators`` (the
profiles source arms triggered captures from it): the daemon's indicator loop hands it over.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..indicators import USED_SERIES, IndicatorConfig, IndicatorEngine
from ..indicators.baseline import BaselineStore
from ..indicators.series import CLIENT_EVIDENCE, PROC_UTIL
from ..indicators.signals import BANDWIDTH_UTIL
from ..map.store import SourceState, Store
from ..model import DeviceId, Frames
from .baseline_file import BaselineFile, state_bytes_limit

log = logging.getLogger("unified_gpu_exporter")
# the canonical series the engine reads (exporter/indicators/signals.py; tests check that feeding
# only these gives the engine's output for every series): a poll's other series are not walked
ENGINE_INPUTS = USED_SERIES
# labels of a per-GPU (not per-kernel) series imported from a profiler artefact
_ARTEFACT_LABELS = frozenset({"source", "trace_id"})
# a device not seen for this long is forgotten (windows, price info, counters); its baselines
# stay unless more than MAX_BASELINE_DEVICES devices have one (then the oldest gone ones go)
DEVICE_TTL_SECONDS = 600.0
MAX_BASELINE_DEVICES = 64
# and at most this many devices are remembered whatever their age (an identity storm of
# thousands of new UUIDs per poll must not pile up for DEVICE_TTL_SECONDS first)
MAX_TRACKED_DEVICES = 512

# fast sampling stays on this long after the last GPU near contention (``wants_fast``)
FAST_HOLD_SECONDS = 30.0
# a calm node samples this often where its full polls are further apart (``sampling_interval``)
CALM_INTERVAL = 1.0
# states that call for samples between full polls (with the bandwidth bar of wants_fast)
_NEAR_CONTENTION = frozenset({"contended", "memory_bound", "shared"})

Imported = list[tuple[DeviceId, str, float]]  # (GPU, series name, value) from profiler artefacts


class IndicatorFeed:
    def __init__(self, config: IndicatorConfig, state_dir: Path | None, interval: float, cloud: str = "",
                 full_interval: float = 0.0):
        """``interval``: the fast interval (the indicators' step); ``full_interval``: the full
        polls', with which a calm node steps them (``wants_fast``)."""
        baselines = BaselineStore()
        # the I/O stays out of the (pure) engine
        self._file = BaselineFile(state_dir, state_bytes_limit(config, MAX_BASELINE_DEVICES))
        self._file.load(baselines)
        self.interval = interval
        self.full_interval = full_interval
        # a step's dt is capped at two calm intervals (a stall of the process is not booked whole)
        self.engine = IndicatorEngine(config, baselines, interval, self._calm())
        self._stepped: tuple[object, float] = (None, float("-inf"))  # what changed, and when, at the last step
        # fast sampling until then (monotonic); +inf with fast_bandwidth_percent 0 (always)
        self.fast_until = 0.0 if config.contention.fast_bandwidth_percent > 0 else float("inf")
        self.cloud = cloud
        self.latest: Frames = {}  # the engine's output of the last update, per GPU
        self._known: set[DeviceId] = set()
        self._last_seen: dict[DeviceId, float] = {}
        self._next_prune = 0.0
        # per source: [full-poll frames seen, fast overlay applied, inputs per GPU, artefact values,
        # GPUs whose clients it counts]
        self._by_source: dict[str, list] = {}

    def update(self, now: float, store: Store) -> Frames:
        """``advance``, then the output (``latest``)."""
        self.advance(now, store)
        return self.latest

    def advance(self, now: float, store: Store) -> None:
        """One engine step over the store's current frames; the output is kept in ``latest``."""
        if not self.engine.config.enabled:
            self.latest = {}
            return
        devices: Frames = {}
        imported: Imported = []
        # per GPU, the poll interval of the sources counting its clients (the client hold-over)
        intervals: dict[DeviceId, float] = {}
        shared: set[DeviceId] = set()  # devices whose frame is a source's cached one (copy before merging)
        for st in store.sources.values():
            per_device, from_artefacts, counting = self._inputs(st)
            imported += from_artefacts
            if st.interval > 0:
                for dev_id in counting:
                    intervals[dev_id] = max(intervals.get(dev_id, 0.0), st.interval)
            for dev_id, frame in per_device.items():
                have = devices.get(dev_id)
                if have is None:
                    devices[dev_id] = frame
                    shared.add(dev_id)
                else:  # two sources report this GPU: the later one's values win
                    if dev_id in shared:
                        have = devices[dev_id] = dict(have)
                        shared.discard(dev_id)
                    have.update(frame)
        # a GPU-level value from a profiler import stands in where no live counter has one
        # (the L2 miss rate for the memory-pressure / saturation attribution)
        for dev_id, name, value in imported:
            have = devices[dev_id]
            if (name, ()) not in have:
                if dev_id in shared:
                    have = devices[dev_id] = dict(have)
                    shared.discard(dev_id)
                have[(name, ())] = value
        for _, dev in store.info_devices():
            dev_id = dev.id
            if dev_id not in self._known:
                self._known.add(dev_id)
                self.engine.set_device_info(dev_id, model=dev.model, vendor=dev.vendor,
                                            cloud=self.cloud or None)
        for dev_id in devices:
            self._last_seen[dev_id] = now
        if now >= self._next_prune or len(self._last_seen) > MAX_TRACKED_DEVICES:
            self._next_prune = now + min(DEVICE_TTL_SECONDS / 10, 60.0)
            self.prune(now, set(devices))
        self.latest = self.engine.update(now, devices, intervals)
        self._near_contention(now, devices)

    def _calm(self) -> float:
        """The calm sampling interval: the full polls', at most CALM_INTERVAL, at least the fast one."""
        full = self.full_interval if self.full_interval > 0 else CALM_INTERVAL
        return max(self.interval, min(full, CALM_INTERVAL))

    def sampling_interval(self, now: float) -> float:
        """The indicators' step now: the fast interval while ``wants_fast``; on a calm node the
        full polls', or CALM_INTERVAL where a source's full polls are further apart (its fast
        polls then come that far apart: the variability windows keep a sample a second)."""
        return self.interval if self.wants_fast(now) else self._calm()

    def due(self, now: float, changed: object) -> bool:
        """Whether the indicator loop steps at this fast tick (then it must): at every one while
        ``wants_fast``; on a calm node once per ``sampling_interval``, after the store's values
        changed (``changed``: its full-poll and fast-poll versions; two sources' polls of a round,
        one step), or two intervals after the last step whatever changed (a late poll: the time
        it took is booked, up to the engine's cap of two calm intervals)."""
        step = self.sampling_interval(now)
        last_changed, last = self._stepped
        gap = now - last
        if step > self.interval and (gap < 0.9 * step or (changed == last_changed and gap < 1.9 * step)):
            return False
        self._stepped = (changed, now)
        return True

    def calm_wait(self, now: float, changed: object) -> float | None:
        """How long the indicator loop may wait for a poll before it steps anyway (``changed`` as
        for ``due``): a whole step after the last one where the store changed since (a poll out
        of phase with the round, or early, is stepped with the round, not 0.9 of a step after the
        last: the steps would drift ahead of the polls), two steps where it did not (``due``'s
        late poll); None while ``wants_fast`` (it steps at every fast tick)."""
        step = self.sampling_interval(now)
        if step <= self.interval:
            return None
        last_changed, last = self._stepped
        return (1.0 if changed != last_changed else 1.9) * step - (now - last)

    def wants_fast(self, now: float) -> bool:
        """Whether the indicators (and the fast polls that feed them) should sample at the fast
        interval: some GPU was near contention (``_near_contention``) within FAST_HOLD_SECONDS.
        Otherwise they step with the full polls (``sampling_interval``): contention needs
        bandwidth utilization above 70 or 85 %, and a calm GPU turning busy is seen by the next
        calm sample, which turns fast sampling on (a burst that starts and ends between two calm
        samples is not seen)."""
        return now < self.fast_until

    def _near_contention(self, now: float, devices: Frames) -> None:
        """Hold fast sampling on while a GPU's state is near contention or one of its bandwidth
        utilization series (the GPU's, or a MIG instance's) is at the bar."""
        if self.fast_until == float("inf"):
            return
        bar, engine = self.engine.config.contention.fast_bandwidth_percent, self.engine
        for dev_id, frame in devices.items():
            if engine.state(dev_id) in _NEAR_CONTENTION or any(
                    sid[0] == BANDWIDTH_UTIL and v >= bar for sid, v in frame.items()):
                self.fast_until = now + FAST_HOLD_SECONDS
                return

    def _inputs(self, st: SourceState) -> tuple[Frames, Imported, set[DeviceId]]:
        """One source's engine inputs per GPU, its per-GPU values from profiler artefacts and the
        GPUs whose clients it counts: selected from the full poll's frames once per poll, the
        inputs refreshed in place with the fast overlay when it changed."""
        cached = self._by_source.get(st.name)
        if cached is None or cached[0] is not st.frames:
            cached = self._by_source[st.name] = [st.frames, None, *_select(st.frames)]
        fast = st.fast
        if fast and cached[1] is not fast:
            cached[1] = fast
            inputs = cached[2]
            for dev_id, frame in _select(fast)[0].items():
                have = inputs.get(dev_id)
                if have is None:
                    inputs[dev_id] = frame
                else:
                    have.update(frame)
        return cached[2], cached[3], cached[4]

    def prune(self, now: float, present: set[DeviceId]) -> int:
        """Forget devices gone for DEVICE_TTL_SECONDS (an identity storm must not grow memory
        for good).  Returns how many were forgotten."""
        gone = [d for d, t in self._last_seen.items()
                if d not in present and now - t >= DEVICE_TTL_SECONDS]
        excess = len(self._last_seen) - len(gone) - MAX_TRACKED_DEVICES
        if excess > 0:  # over the cap: the least recently seen absent devices go first
            dropped = set(gone)
            older = sorted((t, d) for d, t in self._last_seen.items()
                           if d not in present and d not in dropped)
            gone += [d for _, d in older[:excess]]
        engine = self.engine
        for d in gone:
            del self._last_seen[d]
            self._known.discard(d)
        if gone:
            # rebuilt, not only emptied: a dict keeps the table it once grew to
            self._last_seen = dict(self._last_seen)
            self._known = set(self._known)
            engine.forget(set(gone))
        engine.baselines.prune({engine.baseline_key(d) for d in self._last_seen}, MAX_BASELINE_DEVICES)
        return len(gone)

    def save(self) -> None:
        try:
            self._file.save(self.engine.baselines)
        except Exception as exc:  # noqa: BLE001 - never take the daemon down for a state file
            log.warning("saving indicator state failed", extra={"reason": str(exc)})


_ARTEFACT_OF: dict[tuple, bool] = {}  # a label set -> whether it is an artefact's (few distinct sets)


def _artefact_labels(extra: tuple) -> bool:
    """Whether a series' labels are only an artefact's (``source``, ``trace_id``): worked out
    once per label set, not once per series and step."""
    hit = _ARTEFACT_OF.get(extra)
    if hit is None:
        if len(_ARTEFACT_OF) >= 65536:  # label churn (per-process series) never piles up
            _ARTEFACT_OF.clear()
        hit = _ARTEFACT_OF[extra] = {k for k, _ in extra} <= _ARTEFACT_LABELS
    return hit


def _select(frames: Frames) -> tuple[Frames, Imported, set[DeviceId]]:
    """The series of ``frames`` the engine reads (new dicts), the per-GPU values of profiler
    artefacts among them, and the GPUs whose clients they count."""
    inputs = ENGINE_INPUTS
    out: Frames = {}
    imported: Imported = []
    counting: set[DeviceId] = set()
    for dev_id, frame in frames.items():
        kept = {sid: v for sid, v in frame.items() if sid[0] in inputs}
        if kept:
            out[dev_id] = kept
            for (name, extra), value in kept.items():
                if name in (CLIENT_EVIDENCE, PROC_UTIL):
                    counting.add(dev_id)
                elif extra and _artefact_labels(extra):
                    imported.append((dev_id, name, value))
    return out, imported, counting
