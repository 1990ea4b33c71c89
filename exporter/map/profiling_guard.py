"""A zero is not always a value: the profiling guard of a mapping file, applied per GPU and poll.

Profiling counters (DCGM DCP fields, NVML GPM metrics) read 0 on a busy GPU when another
profiler (Nsight, CUPTI) holds the counters or the profiling module is not loaded (dcgm-exporter
#662, DCGM #303).  Exported as they are, a GPU at 99 % utilization would show occupancy and
bandwidth 0 and read ``idle``.  The ``Mapper`` holds back the values of rules marked
``profiling: true`` and hands them here with the GPU's other candidates:

- every profiling value of the GPU (all MIG instances included) is 0 while the file's
  ``profiling_guard.busy_metric``, fed by its non-profiling rules at GPU level, is at least
  ``busy_above``: the values are dropped (a lower-priority rule of the same series, such as
  MEM_COPY_UTIL for bandwidth, takes over) and counted as ``profiling_unavailable``;
- a blank profiling reading (a value in the rule's ``invalid`` list: DCGM's sentinels) is
  counted as ``profiling_unavailable``, and a GPU whose profiling readings are all blank has no
  profiling values;
- otherwise the values are kept.

``gpu_profiling_available`` (1/0) is written for every GPU that had profiling readings in the
poll: 0 when its profiling values were dropped or all blank.  The indicator engine reads it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from ..model import Device, DeviceId, SeriesId

AVAILABLE = "gpu_profiling_available"
REASON = "profiling_unavailable"

# one held-back profiling value: ((GPU, series), rule order, combine, value)
Held = tuple[tuple[DeviceId, SeriesId], int, str, float]


def apply_guard(held: dict[str, list[Held]], blanks: dict[str, int], devices: dict[str, Device],
                gauges: dict, guard_of: Callable[[Device], object | None], errors: Counter[str],
                combine: Callable[[list[tuple[int, str, float]]], float]) -> dict[DeviceId, float]:
    """Move the kept profiling values into ``gauges`` (keyed by (GPU, series)); return the
    availability per GPU."""
    available: dict[DeviceId, float] = {}
    for key in held.keys() | blanks.keys():
        dev = devices.get(key)
        if dev is None:
            continue
        values = held.get(key, ())
        blank = blanks.get(key, 0)
        dev_id = dev.id
        guard = guard_of(dev)
        dropped = not values
        if values and guard is not None and all(v[3] == 0.0 for v in values):
            have = gauges.get((dev_id, (guard.busy_metric, ())))  # type: ignore[attr-defined]
            if have is not None:
                busy = have[2] if type(have) is tuple else combine(list(have))
                dropped = busy >= guard.busy_above  # type: ignore[attr-defined]
        if dropped:
            blank += len(values)
        else:
            for skey, order, how, value in values:
                cand = (order, how, value)
                have = gauges.get(skey)
                if have is None:
                    gauges[skey] = cand
                elif type(have) is tuple:
                    gauges[skey] = [have, cand]
                else:
                    have.append(cand)
        if blank:
            errors[REASON] += blank
        available[dev_id] = 0.0 if dropped else 1.0
    return available
