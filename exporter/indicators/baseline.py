"""Learned baselines of every GPU and metric, and their state file.

The baselines themselves are robust (``robust.py``: medians of time bins, a fast and a long
reference).  The state file (``<state dir>/indicator-baselines.json``) is versioned JSON written
atomically (temporary file in the same directory, fsync, rename, fsync of the directory).  It
holds, per device and metric, the closed bins of both references and the learned seconds, and
the metrics whose deviation was flagged at save time (a restart keeps them flagged, so it
neither relearns the problem as normal nor resolves and re-raises the flag).

The file is read under the ``exporter.safefile`` rule (a symlink, FIFO or device in its place is
never opened or followed; at most ``MAX_STATE_BYTES``).  A file that cannot be read or parsed
is renamed to ``*.corrupt`` and the baselines start fresh
with a warning; a version 1 file (EWMA mean/variance, which cannot seed a median) is renamed to
``*.v1`` and the baselines start fresh; a file from a newer format version is left alone until
the next save.  No timestamps are stored: learning time is counted by learned seconds only.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .. import safefile
from .robust import RobustBaseline

log = logging.getLogger(__name__)

STATE_FILE = "indicator-baselines.json"
FORMAT = "unified-gpu-exporter/indicator-baselines"
VERSION = 2
MAX_BINS = 10080
MAX_STATE_BYTES = 64 << 20  # far above any real state file (tens of KB per GPU)


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


class BaselineStore:
    """Baselines of every device and metric, optionally persisted in a state directory."""

    def __init__(self, state_dir: Path | None) -> None:
        self.path = state_dir / STATE_FILE if state_dir is not None else None
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

    def load(self) -> bool:
        """Restore baselines from the state file; False (with a warning) when starting fresh."""
        if self.path is None:
            return False
        self._remove_stale_tmp()
        try:  # never a symlink, FIFO or device, never more than MAX_STATE_BYTES (safefile)
            data = safefile.read_path(self.path, MAX_STATE_BYTES)
        except FileNotFoundError:
            return False
        except OSError as exc:
            self._set_aside(exc, ".corrupt")
            return False
        try:
            raw = json.loads(data)
            if not isinstance(raw, dict) or raw.get("format") != FORMAT:
                raise ValueError(f"not a baseline state file (format {raw.get('format')!r})"
                                 if isinstance(raw, dict) else "not a JSON object")
            version = raw.get("version")
            if isinstance(version, int) and version > VERSION:
                log.warning("baseline state %s has format version %d, newer than %d: "
                            "starting with fresh baselines and leaving the file alone until the next save",
                            self.path, version, VERSION)
                return False
            if version == 1:
                self._set_aside(None, ".v1")
                return False
            state = _StateV2.model_validate(raw)
        except (OSError, ValueError, ValidationError, RecursionError) as exc:
            # JSONDecodeError is a ValueError; a deeply nested file raises RecursionError
            self._set_aside(exc, ".corrupt")
            return False
        self._restored = {dev: dict(metrics) for dev, metrics in state.devices.items()}
        self.flagged = {dev: set(ms) for dev, ms in state.flagged.items()}
        log.info("restored baselines of %d devices from %s", len(self._restored), self.path)
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

    def _set_aside(self, exc: Exception | None, suffix: str) -> None:
        assert self.path is not None
        aside = self.path.with_name(self.path.name + suffix)
        try:
            os.replace(self.path, aside)
            where = f"moved to {aside}"
        except OSError:
            where = "left in place"
        if exc is None:
            log.warning("baseline state %s is format version 1 (EWMA), which the robust baselines "
                        "cannot start from: %s, starting with fresh baselines", self.path, where)
            return
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
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
