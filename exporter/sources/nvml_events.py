"""XID events: a background thread waiting on an NVML event set, counting per XID code.

dcgm-exporter exposes only the last XID code as a gauge (repeats invisible, never resets: its
issues #190 and #500).  Here every XID critical-error event increments a per-(GPU, code) count
and stamps the wall-clock time; ``poll`` reads a snapshot.  The wait uses a timeout
(``nvmlEventSetWait_v2``) so the thread notices ``stop()`` within one timeout.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections import Counter
from typing import Any

from .nvml_calls import LOST_CODES, TIMEOUT, UNSUPPORTED_CODES


def handle_token(handle: Any) -> Any:
    """A hashable identity of a device handle (ctypes pointer address, else the object)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


class XidWatcher:
    def __init__(self, nvml: Any, timeout_ms: int = 500, clock=time.time) -> None:
        self.nvml = nvml
        self.timeout_ms = int(timeout_ms)
        self.clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._set: Any = None
        self._tokens: dict[Any, str] = {}        # handle token -> device key
        self._uuids: dict[str, str] = {}         # uuid -> device key
        self.counts: dict[str, Counter[int]] = {}
        self.last: dict[str, float] = {}
        self.errors: Counter[str] = Counter()    # drained into the next PollResult
        self.unsupported: set[str] = set()
        self._mask = int(getattr(nvml, "nvmlEventTypeXidCriticalError", 0x8))

    # -- setup -----------------------------------------------------------------------------
    def register(self, key: str, handle: Any, uuid: str = "") -> bool:
        """Add one GPU to the event set (creating the set and thread on first use)."""
        nv = self.nvml
        if key in self.unsupported:
            return False
        try:
            if self._set is None:
                self._set = nv.nvmlEventSetCreate()
            nv.nvmlDeviceRegisterEvents(handle, self._mask, self._set)
        except nv.NVMLError as exc:
            with self._lock:
                if exc.value in UNSUPPORTED_CODES:
                    self.unsupported.add(key)
                    self.errors["not_supported"] += 1
                else:
                    self.errors["read_error"] += 1
            return False
        self._tokens[handle_token(handle)] = key
        if uuid:
            self._uuids[uuid] = key
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="nvml-xid-events", daemon=True)
            self._thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_ms / 1000.0 + 2.0)
            self._thread = None
        if self._set is not None:
            try:
                self.nvml.nvmlEventSetFree(self._set)
            except Exception:  # noqa: BLE001 - teardown
                pass
            self._set = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- the thread ------------------------------------------------------------------------
    def _wait(self) -> Any:
        nv = self.nvml
        fn = getattr(nv, "nvmlEventSetWait_v2", None) or nv.nvmlEventSetWait
        return fn(self._set, self.timeout_ms)

    def _key_of(self, dev: Any) -> str | None:
        key = self._tokens.get(handle_token(dev))
        if key is None:
            try:
                key = self._uuids.get(self.nvml.nvmlDeviceGetUUID(dev))
            except Exception:  # noqa: BLE001
                key = None
        return key

    def _run(self) -> None:
        nv = self.nvml
        while not self._stop.is_set():
            try:
                data = self._wait()
            except nv.NVMLError as exc:
                if exc.value == TIMEOUT:
                    continue
                with self._lock:
                    self.errors["device_lost" if exc.value in LOST_CODES else "read_error"] += 1
                self._stop.wait(1.0)  # do not spin on a persistent error
                continue
            except Exception:  # noqa: BLE001 - the thread must survive anything
                with self._lock:
                    self.errors["read_error"] += 1
                self._stop.wait(1.0)
                continue
            if not int(data.eventType) & self._mask:
                continue
            key = self._key_of(data.device)
            with self._lock:
                if key is None:
                    self.errors["read_error"] += 1
                    continue
                self.counts.setdefault(key, Counter())[int(data.eventData)] += 1
                self.last[key] = self.clock()

    # -- reading ---------------------------------------------------------------------------
    def snapshot(self) -> tuple[dict[str, dict[int, int]], dict[str, float], Counter[str]]:
        """(counts per device and code, last event time per device, errors since last call)."""
        with self._lock:
            counts = {k: dict(v) for k, v in self.counts.items()}
            last = dict(self.last)
            errs, self.errors = self.errors, Counter()
        return counts, last, errs
