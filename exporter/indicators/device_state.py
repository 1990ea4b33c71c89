"""What the engine keeps per device between updates: windows, trackers, counters, identity."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

from .config import VariabilityConfig
from .robust import DeviationTracker
from .series import LabelledKeys, LabelledSignals
from .signals import VARIABILITY_SERIES
from .variability import WindowSummary, window_summary
from .window import RingWindow, SortedWindow, capacity_for


@dataclass(slots=True)
class _DeviceState:
    windows: dict[str, SortedWindow]
    interconnect: RingWindow
    stats: dict[str, WindowSummary | None] = field(default_factory=dict)
    stats_at: float | None = None
    stats_of: dict[str, bytes] = field(default_factory=dict)  # the sorted values they are of
    stats_out: dict[tuple[str, tuple], float] = field(default_factory=dict)  # their output (a frame)
    stats_busy: bool = False  # the GPU was busy when they were computed (the heavy-tail flag needs it)
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
    # client -> the clients busy together with it when it was last seen busy (clients.held_clients)
    client_partners: dict[tuple[str, str], frozenset] = field(default_factory=dict)
    seen_counts: dict[str, int] = field(default_factory=dict)  # clients seen busy this poll, per instance
    # contention booked on held-over clients only, until they are seen again: (seconds per
    # basis, dollars); dropped when the hold-over ends without them (clients.book_contention)
    pending_seconds: dict[str, float] = field(default_factory=dict)
    pending_dollars: float = 0.0
    flagged_seconds: dict[str, float] = field(default_factory=dict)  # metric -> deviation held
    relearned: dict[str, int] = field(default_factory=dict)  # metric -> deviations accepted as normal

    def recent_median(self, metric: str, now: float, value: float, seconds: float, interval: float) -> float:
        """Median of the last ``seconds`` of ``metric``, ``value`` (read at ``now``) included."""
        ring = self.recent.get(metric)
        if ring is None:
            ring = self.recent[metric] = SortedWindow(seconds, capacity_for(seconds, interval, 1024))
        ring.push(now, value)
        return ring.median(now)


@dataclass(slots=True)
class _DeviceInfo:
    vendor: str = ""
    model: str = ""
    cloud: str = ""
    price: float | None = None


@dataclass(slots=True)
class _Tick:
    """One device's update in progress: what the engine's stages hand each other."""

    now: float
    dt: float  # seconds since the device's previous update (capped)
    st: _DeviceState
    key: str  # the device's baseline key
    plain: dict[str, float]  # its series without labels beyond identity, by name
    labelled: LabelledSignals
    out: dict[tuple[str, tuple], float]  # the indicator series (a frame)
    throttled: bool  # a throttle reason that explains a loss
    held: dict[str, int] = field(default_factory=dict)  # busy clients per GPU instance
    evidence: str = "none"
    clients: int | None = None  # busy clients the state may use
    bw_util: float | None = None  # bandwidth utilization (a MIG GPU's: its worst instance's)
    basis: str | None = None
    compute: float | None = None
    ref_median: float | None = None  # the memory-bound reference, when warm
    state: str = "unknown"
    busy: bool = False  # neither idle nor without any load signal
    loaded: bool = True
    clean: bool = True  # not contended, not throttled: the baselines may learn


def interconnect_rate(now: float, st: _DeviceState, total: float | None, n_series: int,
                      span: float) -> float | None:
    """Bytes/s over all interconnect counters, over up to 2 x ``interconnect_rate_seconds``.

    A sample enters the ring when the summed counter changed (counters may refresh slower
    than the fast poll, so a change marks the time the value belongs to) or after a full
    span without change (idle links give a rate of 0).  A counter that went down or a
    changed set of links starts the ring over.
    """
    ring = st.interconnect
    if total is None:
        return None
    last = ring.last()
    if last is not None and (total < last[1] or n_series != st.interconnect_series):
        ring.clear()
        last = None
    st.interconnect_series = n_series
    if last is None:
        ring.push(now, total)
        st.interconnect_anchored = False
    elif total != last[1]:
        if not st.interconnect_anchored:
            # the first value may be older than the time it was read at: measure from
            # the first change on
            ring.clear()
            st.interconnect_anchored = True
        ring.push(now, total)
    elif now - last[0] >= span:
        ring.push(now, total)
    ring.prune(now)
    first, last = ring.first(), ring.last()
    if first is None or last is None or last[0] <= first[0]:
        return None
    return (last[1] - first[1]) / (last[0] - first[0])


def variability_stage(t: _Tick, vcfg: VariabilityConfig, labels: Any) -> None:
    """The fast samples enter the device's variability windows; the statistics are recomputed at
    most every ``recompute_seconds``, and at once when the GPU turns busy or idle."""
    st, now = t.st, t.now
    for metric, name in VARIABILITY_SERIES:
        value = t.plain.get(name)
        if value is not None:
            st.windows[metric].push(now, value)
    if st.stats_at is None or not 0.0 <= now - st.stats_at < vcfg.recompute_seconds or t.busy != st.stats_busy:
        st.stats_at, st.stats_busy = now, t.busy
        st.stats_out = variability_series(st, now, vcfg, labels, t.busy)
    t.out.update(st.stats_out)


def variability_series(st: _DeviceState, now: float, vcfg: VariabilityConfig, labels: Any,
                       busy: bool) -> dict:
    """The variability statistics of the device's windows as series (a window whose values are
    those of the last computation keeps its result).  The heavy-tail flag is 0 unless the GPU is
    ``busy``: an idle GPU's near-zero noise is bimodal or heavy-tailed without meaning anything."""
    out: dict[tuple[str, tuple], float] = {}
    for metric, window in st.windows.items():
        ordered = window.ordered(now)
        # the statistics are a function of the sorted values alone; compared bit for bit
        # (0.0 and -0.0 are equal but export differently)
        bits = array("d", ordered).tobytes()
        if metric in st.stats and st.stats_of.get(metric) == bits:
            stats = st.stats[metric]
        else:
            stats = st.stats[metric] = window_summary(ordered, vcfg, ordered)
            st.stats_of[metric] = bits
        if stats is None:
            continue
        out[("gpu_metric_cov", labels.one("metric", metric))] = stats.cov
        for q, value in stats.quantiles:
            out[("gpu_metric_percentile", labels.two("metric", metric, "percentile", q))] = value
        out[("gpu_metric_heavy_tail", labels.one("metric", metric))] = 1.0 if busy and stats.heavy_tail else 0.0
    return out
