"""Feeds the store's canonical series to the indicator engine and keeps its latest output.

The engine wants, per device, ``{key: value}`` where the key is the series name, or
``(name, extra labels)`` for a series with labels beyond the GPU's identity (structured: a label
value with ``"`` or ``\\`` in it reaches the engine as it is).  Keys are memoised per series key.

The engine's output goes back to sources that declare ``Abilities.observes_indicators`` (the
profiles source arms triggered captures from it): the daemon's indicator loop hands it over.
"""

from __future__ import annotations

import logging
from pathlib import Path

from .baseline_file import BaselineFile
from .indicators import USED_SERIES, IndicatorConfig, IndicatorEngine
from .indicators.baseline import BaselineStore
from .indicators.series import InputKey
from .model import IDENTITY_WIDTH, DeviceId, Labels, SeriesKey, device_id_of
from .store import SourceState, Store

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


class IndicatorFeed:
    def __init__(self, config: IndicatorConfig, state_dir: Path | None, interval: float, cloud: str = ""):
        baselines = BaselineStore()
        self._file = BaselineFile(state_dir)  # the I/O stays out of the (pure) engine
        self._file.load(baselines)
        self.engine = IndicatorEngine(config, baselines, interval)
        self.interval = interval
        self.cloud = cloud
        # the engine's output of the last update, per device; ``latest`` labels it when read
        self._raw: list[tuple[DeviceId, list[tuple[str, dict[str, str], float]]]] = []
        self._latest: list[tuple[str, Labels, float]] | None = []
        self._keys: dict[SeriesKey, InputKey] = {}
        self._known: set[tuple[str, str, str]] = set()
        self._last_seen: dict[tuple[str, str, str], float] = {}
        self._next_prune = 0.0
        # per source: [full-poll series seen, fast overlay applied, inputs per device, artefact values]
        self._by_source: dict[str, list] = {}

    def _key(self, skey: SeriesKey) -> InputKey:
        k = self._keys.get(skey)
        if k is None:
            name, labels = skey
            extra = labels[IDENTITY_WIDTH:]
            k = (name, extra) if extra else name
            if len(self._keys) > 200_000:  # bounded: devices and links come and go
                self._keys.clear()
            self._keys[skey] = k
        return k

    @property
    def latest(self) -> list[tuple[str, Labels, float]]:
        """The last update's output as series (GPU identity labels first, then the indicator's
        own, sorted).  Built when read: the engine runs at the fast interval, the render reads
        once per poll cycle."""
        out = self._latest
        if out is None:
            out = []
            for dev_id, samples in self._raw:
                dl = (("vendor", dev_id[0]), ("gpu", dev_id[1]), ("uuid", dev_id[2]))
                for name, extra, value in samples:
                    out.append((name, dl + tuple(sorted(extra.items())) if extra else dl, value))
            self._latest = out
        return out

    def update(self, now: float, store: Store) -> list[tuple[str, Labels, float]]:
        """``advance``, then the output as series (``latest``)."""
        self.advance(now, store)
        return self.latest

    def advance(self, now: float, store: Store) -> None:
        """One engine step over the store's current series; the output is kept for ``latest``."""
        if not self.engine.config.enabled:
            self._raw, self._latest = [], []
            return
        devices: dict[DeviceId, dict[InputKey, float]] = {}
        imported: list[tuple[DeviceId, str, float]] = []
        shared: set[DeviceId] = set()  # devices whose dict is a source's cached one (copy before merging)
        for st in store.sources.values():
            per_device, from_artefacts = self._inputs(st)
            imported += from_artefacts
            for dev_id, series in per_device.items():
                have = devices.get(dev_id)
                if have is None:
                    devices[dev_id] = series
                    shared.add(dev_id)
                else:  # two sources report this GPU: the later one's values win, as before
                    if dev_id in shared:
                        have = devices[dev_id] = dict(have)
                        shared.discard(dev_id)
                    have.update(series)
        # a GPU-level value from a profiler import stands in where no live counter has one
        # (the L2 miss rate for the memory-pressure / saturation attribution)
        for dev_id, name, value in imported:
            have = devices[dev_id]
            if name not in have:
                if dev_id in shared:
                    have = devices[dev_id] = dict(have)
                    shared.discard(dev_id)
                have[name] = value
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
        # one device per call: the engine's samples carry only the indicator's own labels
        self._raw = [(dev_id, self.engine.update(now, {dev_id: series})) for dev_id, series in devices.items()]
        self._latest = None

    def _inputs(self, st: SourceState) -> tuple[dict[DeviceId, dict[InputKey, float]],
                                                 list[tuple[DeviceId, str, float]]]:
        """One source's engine inputs per device, and its per-GPU values from profiler artefacts.

        Built from the last full poll (``st.polled``) once per poll, then refreshed in place
        with what fast polls changed since (``st.fast``); a source state without ``polled``
        (a test's, a reload's carried one) is read from ``series`` each time.
        """
        base = st.polled if st.polled is not None else st.series
        overlay = st.fast if st.polled is not None else None
        cached = self._by_source.get(st.name)
        if cached is None or cached[0] is not base:
            per_device, imported = self._group(base.items())
            cached = [base, None, per_device, imported]
            self._by_source[st.name] = cached
        if overlay and cached[1] is not overlay:
            cached[1] = overlay
            fresh, _ = self._group(overlay.items())
            for dev_id, series in fresh.items():
                cached[2].setdefault(dev_id, {}).update(series)
        return cached[2], cached[3]

    def _group(self, items) -> tuple[dict[DeviceId, dict[InputKey, float]], list[tuple[DeviceId, str, float]]]:
        per_device: dict[DeviceId, dict[InputKey, float]] = {}
        imported: list[tuple[DeviceId, str, float]] = []
        inputs = ENGINE_INPUTS
        for skey, value in items:
            if skey[0] not in inputs:
                continue  # the engine does not read it
            labels = skey[1]
            dev_id = device_id_of(labels)
            series = per_device.get(dev_id)
            if series is None:
                series = per_device[dev_id] = {}
            series[self._key(skey)] = value
            if labels[IDENTITY_WIDTH:] and {k for k, _ in labels[IDENTITY_WIDTH:]} <= _ARTEFACT_LABELS:
                imported.append((dev_id, skey[0], value))
        return per_device, imported

    def prune(self, now: float, present: set[tuple[str, str, str]]) -> int:
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
            engine._devices.pop(d, None)
            engine._info.pop(d, None)
        if gone:
            # rebuilt, not only emptied: a dict keeps the table it once grew to
            self._keys = {k: v for k, v in self._keys.items()
                          if device_id_of(k[1]) in self._last_seen}
            self._last_seen = dict(self._last_seen)
            self._known = set(self._known)
            engine._devices = dict(engine._devices)
            engine._info = dict(engine._info)
        engine.baselines.prune({engine._baseline_key(d) for d in self._last_seen}, MAX_BASELINE_DEVICES)
        return len(gone)

    def save(self) -> None:
        try:
            self._file.save(self.engine.baselines)
        except Exception as exc:  # noqa: BLE001 - never take the daemon down for a state file
            log.warning("saving indicator state failed", extra={"reason": str(exc)})
