"""The compute signal the memory state is decided on, and bandwidth drop under load: pure.

``compute_signal`` picks the best compute signal a device reports: occupancy, else SM active,
else compute utilization, named in the ``basis`` label so a rule can tell a precise verdict from
an approximate one.  The memory-bound signature (bandwidth utilization > 85 % while a starvation
signal, occupancy or SM active, is < 50 %) and the contention verdict are ``state.decide``'s.
"""

from __future__ import annotations

from collections.abc import Mapping

from .config import BandwidthDropConfig

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


def bandwidth_drop_under_load(bandwidth: float, baseline_mean: float, utilization: float,
                              cfg: BandwidthDropConfig) -> bool:
    """Bandwidth at least ``drop_fraction`` below its baseline while utilization is above the load bar."""
    if baseline_mean <= 0:
        return False
    return utilization > cfg.utilization_percent and bandwidth <= baseline_mean * (1.0 - cfg.drop_fraction)
