"""The canonical series the engine reads, and the names of its internal baselines."""

from __future__ import annotations

from .contention import BANDWIDTH_UTIL, BASIS_SERIES
from .series import (
    CLIENT_CONTEXTS,
    CLIENT_EVIDENCE,
    CLIENT_UTIL,
    CLOCK,
    CLOCK_MAX,
    IC_BYTES,
    IC_UTIL,
    PROC_UTIL,
    THROTTLE,
)

UTILIZATION = "gpu_compute_utilization_percent"
BANDWIDTH_GBPS = "gpu_memory_bandwidth_gbps"
MISS_RATE = "gpu_l2_cache_miss_rate_percent"
# 0: the profiling counters read zero / blank on a busy GPU (sources' profiling guard, issue 25)
PROFILING_AVAILABLE = "gpu_profiling_available"

# metric label -> canonical series feeding the variability windows
VARIABILITY_SERIES = (
    ("utilization", UTILIZATION),
    ("bandwidth", BANDWIDTH_GBPS),
    ("bandwidth_utilization", BANDWIDTH_UTIL),
)
# internal baselines (persisted, not exported)
MISS_BASELINE = "l2_miss_rate"
INTERCONNECT_BASELINE = "interconnect_throughput"
REFERENCE_PREFIX = "memory_bound_"  # + basis: the compute signal while memory-bound, alone
THROTTLE_CAUSES = ("thermal_throttle", "power_throttle")

# every series name the engine reads: a feed may hand it only these (same output, less work)
USED_SERIES = frozenset({
    UTILIZATION, BANDWIDTH_GBPS, BANDWIDTH_UTIL, MISS_RATE, PROFILING_AVAILABLE, *BASIS_SERIES.values(),
    *(name for _, name in VARIABILITY_SERIES), THROTTLE, IC_BYTES, IC_UTIL, PROC_UTIL,
    CLIENT_UTIL, CLIENT_CONTEXTS, CLIENT_EVIDENCE, CLOCK, CLOCK_MAX,
})
