"""Learned baselines: per GPU and metric EWMA mean and variance, and their state file.

The mean and variance decay with a half-life in seconds (not in samples), so the baseline means
the same at a 100 ms and a 1 s poll interval.  Until ``1 / n`` falls below the time-based weight,
each sample weighs ``1 / n`` instead: the first samples give the plain running mean and population
variance rather than a baseline stuck near the first value.

The state file (``<state dir>/indicator-baselines.json``) is versioned JSON written atomically
(temporary file in the same directory, fsync, rename, fsync of the directory).  A file that cannot
be read or parsed is renamed to ``*.corrupt`` and the baselines start fresh with a warning; a file
from a newer format version is left alone and the baselines start fresh.  No timestamps are
stored: learning time is counted by samples and monotonic intervals only.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

log = logging.getLogger(__name__)

STATE_FILE = "indicator-baselines.json"
FORMAT = "unified-gpu-exporter/indicator-baselines"
VERSION = 1


@dataclass(slots=True)
class Ewma:
    """Exponentially weighted mean and variance of one signal."""

    mean: float = 0.0
    var: float = 0.0
    n: int = 0

    def update(self, x: float, dt: float, half_life: float) -> None:
        """Learn sample ``x`` that stands for ``dt`` seconds of signal."""
        self.n += 1
        if self.n == 1:
            self.mean, self.var = x, 0.0
            return
        alpha = max(1.0 - 2.0 ** (-dt / half_life), 1.0 / self.n)
        diff = x - self.mean
        incr = alpha * diff
        self.mean += incr
        self.var = (1.0 - alpha) * (self.var + diff * incr)

    @property
    def stddev(self) -> float:
        return math.sqrt(self.var) if self.var > 0 else 0.0

    def zscore(self, x: float, min_relative_stddev: float) -> float | None:
        """(x - mean) / stddev, the stddev floored at ``min_relative_stddev`` x |mean|; None if 0."""
        sigma = max(self.stddev, min_relative_stddev * abs(self.mean))
        if sigma <= 0:
            return None
        return (x - self.mean) / sigma


class _EwmaV1(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mean: float
    var: float = Field(ge=0)
    n: int = Field(ge=0)

    @field_validator("mean", "var")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("not a finite number")
        return v


class _StateV1(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: str
    version: int
    devices: dict[str, dict[str, _EwmaV1]]


class BaselineStore:
    """Baselines of every device and metric, optionally persisted in a state directory."""

    def __init__(self, state_dir: Path | None) -> None:
        self.path = state_dir / STATE_FILE if state_dir is not None else None
        self._data: dict[str, dict[str, Ewma]] = {}
        # save() may run in a worker thread while the poll loop adds baselines
        self._lock = threading.Lock()

    def get(self, device: str, metric: str) -> Ewma:
        """The baseline of ``metric`` on ``device``, created empty on first use."""
        ewma = self._data.get(device, {}).get(metric)
        if ewma is None:
            with self._lock:
                ewma = self._data.setdefault(device, {}).setdefault(metric, Ewma())
        return ewma

    def peek(self, device: str, metric: str) -> Ewma | None:
        return self._data.get(device, {}).get(metric)

    def prune(self, keep: set[str], max_devices: int) -> None:
        """Above ``max_devices``, drop the oldest baselines of devices not in ``keep``."""
        if len(self._data) <= max_devices:
            return
        with self._lock:
            for dev in [d for d in self._data if d not in keep][: len(self._data) - max_devices]:
                del self._data[dev]
            self._data = dict(self._data)  # a dict keeps the table it once grew to

    def to_json(self) -> dict:
        with self._lock:
            return {
                "format": FORMAT,
                "version": VERSION,
                "devices": {
                    dev: {m: {"mean": e.mean, "var": e.var, "n": e.n} for m, e in metrics.items() if e.n > 0}
                    for dev, metrics in sorted(self._data.items())
                },
            }

    def load(self) -> bool:
        """Restore baselines from the state file; False (with a warning) when starting fresh."""
        if self.path is None:
            return False
        self._remove_stale_tmp()
        if not self.path.exists():
            return False
        try:
            raw = json.loads(self.path.read_bytes())
            if not isinstance(raw, dict) or raw.get("format") != FORMAT:
                raise ValueError(f"not a baseline state file (format {raw.get('format')!r})"
                                 if isinstance(raw, dict) else "not a JSON object")
            version = raw.get("version")
            if isinstance(version, int) and version > VERSION:
                log.warning("baseline state %s has format version %d, newer than %d: "
                            "starting with fresh baselines and leaving the file alone until the next save",
                            self.path, version, VERSION)
                return False
            state = _StateV1.model_validate(raw)
        except (OSError, ValueError, ValidationError, RecursionError) as exc:
            # JSONDecodeError is a ValueError; a deeply nested file raises RecursionError
            self._set_aside(exc)
            return False
        self._data = {dev: {m: Ewma(e.mean, e.var, e.n) for m, e in metrics.items()}
                      for dev, metrics in state.devices.items()}
        log.info("restored baselines of %d devices from %s", len(self._data), self.path)
        return True

    def _remove_stale_tmp(self) -> None:
        """Temporary files of an atomic_write that a crash interrupted (never the live file)."""
        assert self.path is not None
        try:
            names = os.listdir(self.path.parent)
        except OSError:
            return
        prefix = f".{self.path.name}."
        for name in names:
            if name.startswith(prefix) and name.endswith(".tmp"):
                try:
                    os.unlink(self.path.parent / name)
                    log.info("removed a stale temporary state file %s", name)
                except OSError:
                    pass

    def _set_aside(self, exc: Exception) -> None:
        assert self.path is not None
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        aside = self.path.with_name(self.path.name + ".corrupt")
        try:
            os.replace(self.path, aside)
            where = f"moved to {aside}"
        except OSError:
            where = "left in place"
        log.warning("baseline state %s is unreadable (%s): %s, starting with fresh baselines",
                    self.path, reason, where)

    def save(self) -> bool:
        """Write the state file atomically; False (with a warning) when it cannot be written."""
        if self.path is None:
            return False
        try:
            data = json.dumps(self.to_json(), allow_nan=False, separators=(",", ":")).encode()
            atomic_write(self.path, data)
        except (OSError, ValueError) as exc:
            log.warning("cannot save baselines to %s: %s", self.path, exc)
            return False
        return True


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a reader sees the old or the new file, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
