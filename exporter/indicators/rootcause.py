"""Root-cause class of contention, after the seed's attribution framework: pure functions.

- memory_pressure: L2 miss rate high (> 40 %) or risen sharply vs its learned baseline (>= 2x and
  >= 10 points), with memory bandwidth utilization below saturation (<= 90 %).  Seed: "high miss
  rates combined with low memory bandwidth utilization".
- bandwidth_saturation: memory bandwidth utilization > 90 % with a low miss rate (<= 40 %).
- coherency: interconnect link utilization high (>= 80 %) while interconnect throughput is >= 30 %
  below its learned baseline.  Seed: "high utilization with low throughput indicates coherency
  traffic overhead".
- thermal_throttle / power_throttle: any of the configured canonical throttle reasons is active.

A cause is evaluated only when all of its inputs exist; otherwise it is absent (not 0).  The
dominant cause is the first active one in the configured priority; with none active it is
``unknown`` while the GPU is contended (or when neither contention nor any cause could be
evaluated for lack of inputs) and ``none`` otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .config import RootCauseConfig

# every cause ``classify`` can report
CAUSES = ("memory_pressure", "bandwidth_saturation", "coherency", "thermal_throttle", "power_throttle")


@dataclass(frozen=True, slots=True)
class RootCauseInputs:
    bandwidth_util: float | None = None  # gpu_memory_bandwidth_utilization_percent
    miss_rate: float | None = None  # gpu_l2_cache_miss_rate_percent
    miss_baseline: float | None = None  # warm baseline mean of the miss rate
    link_util: float | None = None  # highest gpu_interconnect_utilization_percent of the device
    interconnect_throughput: float | None = None  # bytes/s over all interconnect links
    interconnect_baseline: float | None = None  # warm baseline mean of that throughput
    throttle: Mapping[str, bool] = field(default_factory=dict)  # reported reasons -> active


def miss_rate_risen(miss: float, baseline: float | None, cfg: RootCauseConfig) -> bool:
    if baseline is None:
        return False
    return miss >= baseline * cfg.pressure_miss_rise_factor and miss - baseline >= cfg.pressure_miss_rise_points


def classify(inp: RootCauseInputs, cfg: RootCauseConfig) -> dict[str, bool]:
    """Each cause whose inputs exist -> whether it is active now."""
    return classify_values(inp.bandwidth_util, inp.miss_rate, inp.miss_baseline, inp.link_util,
                           inp.interconnect_throughput, inp.interconnect_baseline, inp.throttle, cfg)


def classify_values(bw: float | None, miss: float | None, miss_baseline: float | None,
                    link_util: float | None, throughput: float | None, ic_baseline: float | None,
                    throttle: Mapping[str, bool], cfg: RootCauseConfig) -> dict[str, bool]:
    """``classify`` of the fields of a ``RootCauseInputs``, without building one (the engine
    classifies every device at every indicator step)."""
    out: dict[str, bool] = {}
    if bw is not None and miss is not None:
        high_miss = miss > cfg.pressure_miss_percent or miss_rate_risen(miss, miss_baseline, cfg)
        out["memory_pressure"] = high_miss and bw <= cfg.saturation_bandwidth_percent
        out["bandwidth_saturation"] = bw > cfg.saturation_bandwidth_percent and miss <= cfg.saturation_max_miss_percent
    elif bw is not None and cfg.saturation_without_miss_rate:
        out["bandwidth_saturation"] = bw > cfg.saturation_bandwidth_percent
    if link_util is not None and throughput is not None and ic_baseline is not None:
        degraded = throughput <= ic_baseline * (1.0 - cfg.coherency_throughput_drop_fraction)
        out["coherency"] = link_util >= cfg.coherency_link_utilization_percent and degraded
    if throttle:
        for cause, reasons in (("thermal_throttle", cfg.thermal_reasons), ("power_throttle", cfg.power_reasons)):
            reported = [throttle[r] for r in reasons if r in throttle]
            if reported:
                out[cause] = any(reported)
    return out


def throttle_explains(throttle: Mapping[str, bool], clock_ratio: float | None, cfg: RootCauseConfig) -> bool:
    """Whether the active throttle reasons explain a loss of throughput (the state ``throttled``):
    a hardware / thermal slowdown reason, or a power reason with the compute clock at least
    ``power_clock_drop_fraction`` below its maximum.  A power cap at the board limit alone does
    not: loaded GPUs sit there for hours, and a neighbour must still be seen."""
    if not throttle:
        return False
    for r in cfg.slowdown_reasons:
        if throttle.get(r):
            return True
    if clock_ratio is None or clock_ratio > 1.0 - cfg.power_clock_drop_fraction:
        return False
    return any(throttle.get(r) for r in cfg.power_reasons)


def dominant_cause(flags: Mapping[str, bool], contended: bool, priority: tuple[str, ...],
                   evaluated: bool = True) -> str:
    """The first active cause in ``priority``; else ``unknown`` (contended, or nothing could be
    evaluated) or ``none``."""
    for cause in priority:
        if flags.get(cause):
            return cause
    return "unknown" if contended or not (evaluated or flags) else "none"
