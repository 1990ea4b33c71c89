"""CPU seconds the exporter spends per stage of its pipeline, for its self-metrics.

Each stage runs on one thread (a source's poll and mapping on that source's worker, the
indicators on the event loop, the render on the render worker) and adds the thread CPU time
(``time.thread_time``) of each pass.  One thread writes each key, so the counters need no lock.
What is not counted here (the event loop, the HTTP server, the garbage collector, the amdgpu
``pcie_bw`` threads) is the process total (``process_cpu_seconds_total``) minus their sum.
"""

from __future__ import annotations

import time
from collections import Counter

clock = time.thread_time

# (stage, source) -> CPU seconds; source is "" for the daemon's own stages (indicators, render)
_seconds: Counter[tuple[str, str]] = Counter()


def add(stage: str, source: str, seconds: float) -> None:
    _seconds[(stage, source)] += seconds


def snapshot() -> list[tuple[str, str, float]]:
    """(stage, source, seconds) of every stage seen so far, sorted."""
    return sorted((stage, source, s) for (stage, source), s in list(_seconds.items()))
