"""The indicators' learned baselines on disk: ``<state dir>/indicator-baselines.json``.

Read once at start (``IndicatorFeed``), written every minute and at exit; the data and its
format are ``indicators.baseline``'s (pure), the file is this module's.  Written atomically
(temporary file in the same directory, fsync, rename, fsync of the directory), read under the
``exporter.safefile`` rule (a symlink, FIFO or device in its place is never opened or followed;
at most ``state_bytes_limit``: what the configured windows can hold).  The state directory itself
must be the exporter's (``check_state_dir``, at start).  A file that cannot be read or parsed is renamed to ``*.corrupt``
and the baselines start fresh with a warning; a version 1 file (EWMA mean/variance, which cannot
seed a median) is renamed to ``*.v1`` and the baselines start fresh; a file from a newer format
version is left alone until the next save.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

from .. import safefile
from ..indicators.baseline import BaselineStore, NewerState, OldState, parse_state
from ..indicators.config import IndicatorConfig
from ..yamlfile import ConfigError

log = logging.getLogger("exporter.indicators.baseline")

STATE_FILE = "indicator-baselines.json"
# the least a state file may hold: the default windows give ~1.6 MB for 64 GPUs, full (measured)
MAX_STATE_BYTES = 1 << 20
_NUMBER_BYTES = 25  # a float in JSON ("-1.2345678901234567e-300") and its comma
_BASELINE_METRICS, _REFERENCE_METRICS, _OVERHEAD_BYTES = 4, 3, 1024  # per GPU


def state_bytes_limit(cfg: IndicatorConfig, devices: int) -> int:
    """The most a state file of ``devices`` GPUs can hold with every window of ``cfg`` full
    (twice: GPUs restored and not seen again, and GPUs learned since).  Default config, 64 GPUs:
    4.3 MB (a real one measures 1.6 MB); a 64 MiB file once cost hundreds of MB at start."""
    b, s = cfg.baseline, cfg.state
    numbers = (_BASELINE_METRICS * (b.fast_bins + b.long_bins + b.long_bin_bins)
               + _REFERENCE_METRICS * (2 * s.reference_bins + 1))
    return max(MAX_STATE_BYTES, 2 * devices * (_OVERHEAD_BYTES + _NUMBER_BYTES * numbers))


def check_state_dir(path: Path) -> None:
    """``--state.dir`` (created 0700 when missing) must be a directory owned by the exporter's
    user or root and writable by nobody else, under ancestors nobody else can swap, reached
    through no symlink another user could repoint (systemd's ``DynamicUser=`` makes it a
    root-owned symlink into ``/var/lib/private``: accepted): another user could otherwise plant
    or replace the state file.  ConfigError when not."""
    try:
        safefile.owned_dir(path, "--state.dir")
    except OSError as exc:
        raise ConfigError(str(exc)) from None


class BaselineFile:
    """The state file of ``state_dir``; without a state directory, nothing is read or written."""

    def __init__(self, state_dir: Path | None, max_bytes: int = MAX_STATE_BYTES) -> None:
        self.path = Path(state_dir) / STATE_FILE if state_dir is not None else None
        self.max_bytes = max_bytes

    def load(self, store: BaselineStore) -> bool:
        """Restore ``store`` from the file; False (with a warning) when starting fresh."""
        if self.path is None:
            return False
        self._remove_stale_tmp()
        try:  # never a symlink, FIFO or device, never more than max_bytes (safefile)
            data = safefile.read_path(self.path, self.max_bytes)
        except FileNotFoundError:
            return False
        except OSError as exc:
            self._set_aside(exc, ".corrupt")
            return False
        try:
            state = parse_state(json.loads(data))
        except NewerState as exc:
            log.warning("baseline state %s has format version %d, newer than this exporter's: "
                        "starting with fresh baselines and leaving the file alone until the next save",
                        self.path, exc.version)
            return False
        except OldState:
            self._set_aside(None, ".v1")
            return False
        except (OSError, ValueError, RecursionError) as exc:
            # JSONDecodeError and ValidationError are ValueErrors; deep nesting raises RecursionError
            self._set_aside(exc, ".corrupt")
            return False
        count = store.restore(state)
        log.info("restored baselines of %d devices from %s", count, self.path)
        return True

    def save(self, store: BaselineStore) -> bool:
        """Write the file atomically; False (with a warning) when it cannot be written.  Safe
        from a worker thread while the engine updates (it fsyncs: keep it off the event loop)."""
        if self.path is None:
            return False
        try:
            data = json.dumps(store.to_json(), allow_nan=False, separators=(",", ":")).encode()
            atomic_write(self.path, data)
        except (OSError, ValueError) as exc:
            log.warning("cannot save baselines to %s: %s", self.path, exc)
            return False
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
