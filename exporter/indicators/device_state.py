"""What the engine keeps per device between updates: windows, trackers, counters, identity."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .robust import DeviationTracker
from .series import LabelledKeys
from .variability import WindowSummary
from .window import RingWindow, SortedWindow


@dataclass(slots=True)
class _DeviceState:
    windows: dict[str, SortedWindow]
    interconnect: RingWindow
    stats: dict[str, WindowSummary | None] = field(default_factory=dict)
    stats_at: float | None = None
    stats_of: dict[str, bytes] = field(default_factory=dict)  # the sorted values they are of
    stats_out: list[tuple[str, dict[str, str], float]] = field(default_factory=list)  # their output
    # the labelled series among this device's keys (the keys seen last, and the index's epoch)
    labelled_keys: list[Any] = field(default_factory=list)
    labelled: LabelledKeys | None = None
    labelled_epoch: int = -1
    last_update: float | None = None
    interconnect_series: int = 0
    interconnect_anchored: bool = False
    contention_seconds: dict[str, float] = field(default_factory=dict)
    cost_dollars: float = 0.0
    recent: dict[str, SortedWindow] = field(default_factory=dict)  # metric -> last compare_seconds
    trackers: dict[str, DeviationTracker] = field(default_factory=dict)
    drop: DeviationTracker | None = None  # throughput drop vs the memory-bound reference
    idle_seconds: float = 0.0
    drop_seconds: float = 0.0  # throughput drop held without per-process data
    state: str = "unknown"
    client_seen: dict[tuple[str, str], float] = field(default_factory=dict)  # client -> last busy
    flagged_seconds: dict[str, float] = field(default_factory=dict)  # metric -> deviation held
    relearned: dict[str, int] = field(default_factory=dict)  # metric -> deviations accepted as normal


@dataclass(slots=True)
class _DeviceInfo:
    vendor: str = ""
    model: str = ""
    cloud: str = ""
    price: float | None = None
