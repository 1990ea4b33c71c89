"""One poll -> resolve -> map cycle of one source: the path every reading takes to a series.

The daemon's runner, the fast loop, ``exporter.testing``, the benchmarks and the tests all call
``poll_and_map``, so what is measured and tested is what the daemon runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ..map.mapper import Mapper, MapResult
from ..map.store import SourceState, Store
from ..model import Device, PollResult, Reading

cpu_clock = time.thread_time
# keeps a reading (given the resolved devices) before mapping; the fast loop maps only its inputs
ReadingFilter = Callable[[Reading, dict[str, Device]], bool]


@dataclass(slots=True)
class Cycle:
    """What one cycle produced: the raw poll, the devices under their canonical identity, the
    mapped series, and how long the poll and the resolve+map took (by ``timer``)."""

    sample: PollResult
    devices: dict[str, Device]
    result: MapResult
    poll_seconds: float
    map_seconds: float
    poll_cpu: float = 0.0  # CPU seconds of this thread in the poll, and in resolve + map
    map_cpu: float = 0.0


def poll_and_map(poll: Callable[[], PollResult], store: Store, state: SourceState, mapper: Mapper,
                 *, now: float | None = None, keep: ReadingFilter | None = None,
                 timer: Callable[[], float] = time.perf_counter) -> Cycle:
    """Call ``poll`` (a source's ``poll`` or ``poll_fast``), give its devices their canonical
    identity through ``store`` (upstream duplicates of native GPUs drop out here), and map the
    raw readings with ``mapper`` (whose counter and rate state belong to this source).

    ``now`` stamps the poll (a test's fake clock); otherwise a source that left ``monotonic`` at
    0 is stamped with ``time.monotonic()``.  Nothing in ``state`` or ``store`` is changed: the
    caller publishes the result (the daemon does that on the event loop)."""
    c0 = cpu_clock()
    t0 = timer()
    sample = poll()
    t1 = timer()
    c1 = cpu_clock()
    if now is not None:
        sample.monotonic = now
    elif not sample.monotonic:
        sample.monotonic = time.monotonic()
    devices = store.resolve_devices(state, sample.devices)
    if keep is not None:
        sample.readings = [r for r in sample.readings if keep(r, devices)]
    result = mapper.map(sample, devices)
    t2 = timer()
    return Cycle(sample, devices, result, t1 - t0, t2 - t1, c1 - c0, cpu_clock() - c1)
