"""The amdgpu ``pcie_bw`` readers: one daemon thread per card, because every read of that file
sleeps about 1 s in the kernel (it counts PCIe messages over that second).

A thread reads its card's file, integrates the bytes estimate (messages x max payload size x the
seconds since its previous sample), waits ``interval`` and reads again; the source's poll takes
the last values and the errors counted since.  A card whose file says not supported (an APU,
-ENODATA), is gone, or is absent stops its thread.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .amdgpu_text import parse_pcie_bw

# what a thread keeps, in the order ``take`` returns it
PCIE_BW_FIELDS = ("pcie_bw.received", "pcie_bw.sent", "pcie_bw.max_payload_size",
                  "pcie_bw.received_bytes", "pcie_bw.sent_bytes")

ReadText = Callable[[Path, Counter], "str | None"]


@dataclass
class PcieBw:
    received: int = 0
    sent: int = 0
    mps: int = 0
    received_bytes: float = 0.0
    sent_bytes: float = 0.0
    last_t: float | None = None
    valid: bool = False


@dataclass
class PcieBwThreads:
    lock: threading.Lock = field(default_factory=threading.Lock)
    values: dict[str, PcieBw] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)
    ready: dict[str, threading.Event] = field(default_factory=dict)


class PcieBwReaders:
    """The per-card threads of one opened source (``stop`` ends them; a reopen makes new ones)."""

    def __init__(self, clock: Callable[[], float], interval: float = 1.0):
        self._clock = clock
        self._interval = interval
        self._state = PcieBwThreads()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self, key: str, number: int, path: Path, read_text: ReadText,
              done: Callable[[], None] = lambda: None) -> None:
        """A thread reading ``path`` with ``read_text`` (its own: a kept descriptor is never shared
        between threads); ``done`` runs when the thread ends."""
        with self._state.lock:
            self._state.values[key] = PcieBw()
            self._state.ready[key] = threading.Event()
        t = threading.Thread(target=self._loop, args=(key, path, read_text, done),
                             name=f"amdgpu-pcie_bw-card{number}", daemon=True)
        self._threads.append(t)
        t.start()

    def stop(self, timeout: float = 3.0) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=timeout)
        self._threads = []

    def ready(self, timeout: float = 5.0) -> bool:
        """True once every card's thread has finished its first read (for tests, --once)."""
        deadline = time.monotonic() + timeout
        for ev in list(self._state.ready.values()):
            if not ev.wait(max(deadline - time.monotonic(), 0.0)):
                return False
        return True

    def take(self) -> tuple[Counter[str], dict[str, tuple[float, ...]]]:
        """The errors counted since the last call, and each card's last values (PCIE_BW_FIELDS)."""
        state = self._state
        with state.lock:
            errors = Counter(state.errors)
            state.errors.clear()
            values = {k: (v.received, v.sent, v.mps, v.received_bytes, v.sent_bytes)
                      for k, v in state.values.items() if v.valid}
        return errors, values

    def _loop(self, key: str, path: Path, read_text: ReadText, done: Callable[[], None]) -> None:
        try:
            self._read_until_stopped(key, path, read_text)
        finally:
            done()

    def _read_until_stopped(self, key: str, path: Path, read_text: ReadText) -> None:
        state = self._state
        while not self._stop.is_set():
            local: Counter[str] = Counter()
            text = read_text(path, local)  # blocks ~1 s in the kernel
            now = self._clock()
            parsed = parse_pcie_bw(text) if text is not None else None
            if text is not None and parsed is None:
                local["malformed_value"] += 1
            with state.lock:
                state.errors.update(local)
                if parsed is not None:
                    st = state.values[key]
                    dt = 1.0 if st.last_t is None else max(now - st.last_t, 0.0)
                    st.received, st.sent, st.mps = parsed
                    st.received_bytes += parsed[0] * parsed[2] * dt
                    st.sent_bytes += parsed[1] * parsed[2] * dt
                    st.last_t, st.valid = now, True
            state.ready[key].set()
            if local["not_supported"] or local["device_lost"] or text is None and not local:
                return  # APU (-ENODATA), gone, or absent: stop reading this card
            self._stop.wait(self._interval)
