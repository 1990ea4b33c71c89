"""CPU seconds the exporter spends per stage of its pipeline, for its self-metrics.

Each stage runs on one thread (a source's poll and mapping on that source's worker, the
indicators on the event loop, the render on the render worker) and adds the thread CPU time
(``time.thread_time``) of each pass.  One thread writes each key, so the counters need no lock.
Two more rows make the stages add up to the process's CPU:

- ``event_loop``: the event loop thread's CPU (``pthread_getcpuclockid``) outside the stages
  counted on it: asyncio's wakeups and timers, HTTP serving, handing work to the worker threads;
- ``other``: the process total (``process_cpu_seconds_total``) minus every row above: the
  worker threads outside their stages (queue hand-offs), the amdgpu ``pcie_bw`` threads, the
  state file writer, reloads, the OTLP push, the enrichers' threads.

Both are remainders of clocks read at different instants and granularities (the process total
moves in clock ticks): served as counters, each is held at the most it has shown, never less.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

clock = time.thread_time

# (stage, source) -> CPU seconds; source is "" for the daemon's own stages (indicators, render)
_seconds: Counter[tuple[str, str]] = Counter()
_on_loop = [0.0]  # CPU seconds of the stages counted on the main (event loop) thread
_MAIN = threading.main_thread().ident
_served: dict[str, float] = {}  # event_loop / other as last served (a counter never goes back)
_served_lock = threading.Lock()


def add(stage: str, source: str, seconds: float) -> None:
    _seconds[(stage, source)] += seconds
    if threading.get_ident() == _MAIN:
        _on_loop[0] += seconds


def _main_thread_cpu() -> float | None:
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(_MAIN))  # type: ignore[arg-type]
    except (AttributeError, OSError, TypeError):  # no per-thread CPU clock on this platform
        return None


def snapshot(process_cpu: float | None = None) -> list[tuple[str, str, float]]:
    """(stage, source, seconds) of every stage seen so far, sorted; with ``process_cpu`` (the
    process's CPU seconds, as served) also ``event_loop`` and the ``other`` remainder."""
    rows = sorted((stage, source, s) for (stage, source), s in list(_seconds.items()))
    if process_cpu is None:
        return rows
    main = _main_thread_cpu()
    with _served_lock:
        if main is not None:
            rows.append(("event_loop", "", _held("event_loop", main - _on_loop[0])))
        rows.append(("other", "", _held("other", process_cpu - sum(s for _, _, s in rows))))
    return sorted(rows)


def _held(stage: str, seconds: float) -> float:
    """``seconds``, or the most ``stage`` has shown when the remainder came out lower."""
    _served[stage] = max(seconds, _served.get(stage, 0.0))
    return _served[stage]
