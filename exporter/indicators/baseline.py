"""Learned baselines of every GPU and metric, and their state as versioned JSON data.

The baselines themselves are robust (``robust.py``: medians of time bins, a fast and a long
reference).  Their state (``to_json`` / ``parse_state``) holds, per device and metric, the
closed bins of both references and the learned seconds, and the metrics whose deviation was
flagged at save time (a restart keeps them flagged, so it neither relearns the problem as normal
nor resolves and re-raises the flag).  No timestamps are stored: learning time is counted by
learned seconds only.

Pure: reading and writing the state file (``<state dir>/indicator-baselines.json``, atomically,
under the ``safefile`` rule) is ``exporter.run.baseline_file``'s, on the daemon's side.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .robust import RobustBaseline

FORMAT = "unified-gpu-exporter/indicator-baselines"
VERSION = 2
MAX_BINS = 10080


def _finite_list(v: list[float]) -> list[float]:
    if not all(math.isfinite(x) for x in v):
        raise ValueError("not a finite number")
    return v


class _RobustV2(BaseModel):
    model_config = ConfigDict(extra="forbid")
    fast: list[float] = Field(max_length=MAX_BINS)
    long: list[float] = Field(default=[], max_length=MAX_BINS)
    long_cur: list[float] = Field(default=[], max_length=MAX_BINS)
    learned_seconds: float = Field(ge=0)

    @field_validator("fast", "long", "long_cur")
    @classmethod
    def _finite(cls, v: list[float]) -> list[float]:
        return _finite_list(v)

    @field_validator("learned_seconds")
    @classmethod
    def _finite_seconds(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("not a finite number")
        return v


class _StateV2(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: str
    version: int
    devices: dict[str, dict[str, _RobustV2]]
    flagged: dict[str, list[str]] = {}


class NewerState(ValueError):
    """State of a newer format version than this code reads."""

    def __init__(self, version: int) -> None:
        super().__init__(f"format version {version}, newer than {VERSION}")
        self.version = version


class OldState(ValueError):
    """State of format version 1 (EWMA mean/variance, which cannot seed a median)."""


def parse_state(raw: object) -> _StateV2:
    """Validated baseline state; ``NewerState``, ``OldState`` or another ValueError (a
    pydantic ValidationError is one) when it is not state this code can start from."""
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ValueError(f"not a baseline state file (format {raw.get('format')!r})"
                         if isinstance(raw, dict) else "not a JSON object")
    version = raw.get("version")
    if isinstance(version, int) and version > VERSION:
        raise NewerState(version)
    if version == 1:
        raise OldState("format version 1")
    return _StateV2.model_validate(raw)


class BaselineStore:
    """Baselines of every device and metric (``restore`` starts from saved state)."""

    def __init__(self) -> None:
        self._data: dict[str, dict[str, RobustBaseline]] = {}
        self._restored: dict[str, dict[str, _RobustV2]] = {}
        self.flagged: dict[str, set[str]] = {}
        # save() may run in a worker thread while the poll loop adds baselines
        self._lock = threading.Lock()

    def get(self, device: str, metric: str, factory: Callable[[], RobustBaseline]) -> RobustBaseline:
        """The baseline of ``metric`` on ``device``, created by ``factory`` (and filled from the
        state file when it held one) on first use."""
        b = self._data.get(device, {}).get(metric)
        if b is None:
            b = factory()
            saved = self._restored.get(device, {}).pop(metric, None)
            if saved is not None:
                b.restore(saved.fast, saved.long, saved.long_cur, saved.learned_seconds)
            with self._lock:
                b = self._data.setdefault(device, {}).setdefault(metric, b)
        return b

    def adopt(self, other: BaselineStore) -> None:
        """Continue with what ``other`` learned (a reload: newer in memory than in any file)."""
        with self._lock:
            self._data = other._data
            self._restored = other._restored
            self.flagged = other.flagged

    def peek(self, device: str, metric: str) -> RobustBaseline | None:
        return self._data.get(device, {}).get(metric)

    def set_flag(self, device: str, metric: str, flagged: bool) -> None:
        have = self.flagged.get(device)
        if flagged:
            if have is None or metric not in have:
                with self._lock:
                    self.flagged.setdefault(device, set()).add(metric)
        elif have is not None and metric in have:
            with self._lock:
                have.discard(metric)

    def was_flagged(self, device: str, metric: str) -> bool:
        return metric in self.flagged.get(device, ())

    def prune(self, keep: set[str], max_devices: int) -> None:
        """Above ``max_devices``, drop the oldest baselines of devices not in ``keep``."""
        if len(self._data) <= max_devices:
            return
        with self._lock:
            for dev in [d for d in self._data if d not in keep][: len(self._data) - max_devices]:
                del self._data[dev]
                self.flagged.pop(dev, None)
            self._data = dict(self._data)  # a dict keeps the table it once grew to

    def to_json(self) -> dict:
        with self._lock:
            devices: dict[str, dict[str, dict]] = {}
            for dev, metrics in sorted(self._restored.items()):  # not (yet) seen since the restart
                if metrics:
                    devices[dev] = {m: r.model_dump() for m, r in metrics.items()}
            for dev, metrics in sorted(self._data.items()):
                kept = {m: b.to_json() for m, b in metrics.items() if b.fast or b.long or b.long_cur}
                if kept:
                    devices.setdefault(dev, {}).update(kept)
            return {
                "format": FORMAT,
                "version": VERSION,
                "devices": devices,
                "flagged": {dev: sorted(ms) for dev, ms in sorted(self.flagged.items()) if ms},
            }

    def restore(self, state: _StateV2) -> int:
        """Start from saved state (``parse_state``): each baseline is filled when first used.
        Returns the number of devices restored."""
        with self._lock:
            self._restored = {dev: dict(metrics) for dev, metrics in state.devices.items()}
            self.flagged = {dev: set(ms) for dev, ms in state.flagged.items()}
        return len(self._restored)
