"""Memory contention (seed's GPUMemoryContention) and bandwidth drop under load: pure predicates.

Memory contention: memory bandwidth utilization > 85 % while compute occupancy < 50 %.  Where the
device reports no occupancy, the best available compute signal is used instead (SM active, then
compute utilization) and named in the ``basis`` label, so a rule can tell a precise verdict from
an approximate one.
"""

from __future__ import annotations

from collections.abc import Mapping

from .config import BandwidthDropConfig, ContentionConfig

BANDWIDTH_UTIL = "gpu_memory_bandwidth_utilization_percent"
BASIS_SERIES = {
    "occupancy": "gpu_compute_occupancy_percent",
    "sm_active": "gpu_sm_active_percent",
    "utilization": "gpu_compute_utilization_percent",
}


def compute_signal(series: Mapping[str, float], order: tuple[str, ...]) -> tuple[str, float] | None:
    """The first compute signal present, as ``(basis, percent)``; None when there is none."""
    for basis in order:
        value = series.get(BASIS_SERIES[basis])
        if value is not None:
            return basis, value
    return None


def memory_contended(bandwidth_util: float, compute_percent: float, cfg: ContentionConfig) -> bool:
    """Bandwidth utilization above the threshold while the compute signal is below its threshold."""
    return bandwidth_util > cfg.bandwidth_utilization_percent and compute_percent < cfg.compute_percent


def bandwidth_drop_under_load(bandwidth: float, baseline_mean: float, utilization: float,
                              cfg: BandwidthDropConfig) -> bool:
    """Bandwidth at least ``drop_fraction`` below its baseline while utilization is above the load bar."""
    if baseline_mean <= 0:
        return False
    return utilization > cfg.utilization_percent and bandwidth <= baseline_mean * (1.0 - cfg.drop_fraction)
