"""What the engine keeps per device between updates: windows, trackers, counters, identity."""

from __future__ import annotations

from dataclasses import dataclass, field

from .robust import DeviationTracker
from .variability import VariabilityStats
from .window import RingWindow


@dataclass(slots=True)
class _DeviceState:
    windows: dict[str, RingWindow]
    interconnect: RingWindow
    stats: dict[str, VariabilityStats | None] = field(default_factory=dict)
    stats_at: float | None = None
    last_update: float | None = None
    interconnect_series: int = 0
    interconnect_anchored: bool = False
    contention_seconds: dict[str, float] = field(default_factory=dict)
    cost_dollars: float = 0.0
    recent: dict[str, RingWindow] = field(default_factory=dict)  # metric -> last compare_seconds
    trackers: dict[str, DeviationTracker] = field(default_factory=dict)
    drop: DeviationTracker | None = None  # throughput drop vs the memory-bound reference
    idle_seconds: float = 0.0
    drop_seconds: float = 0.0  # throughput drop held without per-process data
    state: str = "unknown"
    flagged_seconds: dict[str, float] = field(default_factory=dict)  # metric -> deviation held


@dataclass(slots=True)
class _DeviceInfo:
    vendor: str = ""
    model: str = ""
    cloud: str = ""
    price: float | None = None
