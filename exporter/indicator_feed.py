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

from .indicators import IndicatorConfig, IndicatorEngine
from .indicators.series import InputKey
from .model import IDENTITY_WIDTH, Labels, SeriesKey, device_id_of
from .store import Store

log = logging.getLogger("unified_gpu_exporter")
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
        self.engine = IndicatorEngine(config, state_dir, interval)
        self.interval = interval
        self.cloud = cloud
        self.latest: list[tuple[str, Labels, float]] = []
        self._keys: dict[SeriesKey, InputKey] = {}
        self._known: set[tuple[str, str, str]] = set()
        self._last_seen: dict[tuple[str, str, str], float] = {}
        self._next_prune = 0.0

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

    def update(self, now: float, store: Store) -> list[tuple[str, Labels, float]]:
        if not self.engine.config.enabled:
            return []
        devices: dict[tuple[str, str, str], dict[InputKey, float]] = {}
        imported: list[tuple[tuple[str, str, str], str, float]] = []
        for st in store.sources.values():
            for skey, value in st.series.items():
                labels = skey[1]
                dev_id = device_id_of(labels)
                devices.setdefault(dev_id, {})[self._key(skey)] = value
                if labels[IDENTITY_WIDTH:] and {k for k, _ in labels[IDENTITY_WIDTH:]} <= _ARTEFACT_LABELS:
                    imported.append((dev_id, skey[0], value))
        # a GPU-level value from a profiler import stands in where no live counter has one
        # (the L2 miss rate for the memory-pressure / saturation attribution)
        for dev_id, name, value in imported:
            devices[dev_id].setdefault(name, value)
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
        out: list[tuple[str, Labels, float]] = []
        for dev_id, series in devices.items():
            dl = (("vendor", dev_id[0]), ("gpu", dev_id[1]), ("uuid", dev_id[2]))
            # one device per call: the engine's samples carry only the indicator's own labels
            for name, extra, value in self.engine.update(now, {dev_id: series}):
                out.append((name, dl + tuple(sorted(extra.items())), value))
        self.latest = out
        return out

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
            self.engine.save_state()
        except Exception as exc:  # noqa: BLE001 - never take the daemon down for a state file
            log.warning("saving indicator state failed", extra={"reason": str(exc)})
