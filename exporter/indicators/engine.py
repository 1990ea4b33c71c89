"""The indicator engine: per device state, fed every poll, returning every indicator series.

The daemon calls ``update(now, devices)`` at its fast sampling interval with the latest canonical
series of each device, and ``save_state()`` periodically and on shutdown.  Everything here runs
on monotonic time; windows are fixed-size rings, so memory does not grow with uptime.

Per device and update:
1. memory contention (``contention.py``) -> gauge and seconds/dollars counters advanced by the
   time since the previous update (capped at 2 poll intervals, so a stalled poll is not credited
   in full);
2. the fast samples enter the variability windows; CoV, quantiles and the heavy-tail flag are
   recomputed at most every ``variability.recompute_seconds``;
3. baselines (bandwidth for export; L2 miss rate and interconnect throughput for attribution)
   are compared with the sample, then learn it when the GPU is loaded;
4. bandwidth drop under load, root-cause flags and the dominant cause.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .baseline import BaselineStore, Ewma
from .config import IndicatorConfig
from .contention import (
    BANDWIDTH_UTIL,
    bandwidth_drop_under_load,
    compute_signal,
    memory_contended,
)
from .cost import match_price
from .rootcause import RootCauseInputs, classify, dominant_cause
from .series import SeriesIndex
from .variability import VariabilityStats, window_stats
from .window import RingWindow, capacity_for

log = logging.getLogger(__name__)

DeviceId = tuple[str, str, str]  # (vendor, gpu, uuid)
Sample = tuple[str, dict[str, str], float]

UTILIZATION = "gpu_compute_utilization_percent"
BANDWIDTH_GBPS = "gpu_memory_bandwidth_gbps"
MISS_RATE = "gpu_l2_cache_miss_rate_percent"

# metric label -> canonical series feeding the variability windows
VARIABILITY_SERIES = (
    ("utilization", UTILIZATION),
    ("bandwidth", BANDWIDTH_GBPS),
    ("bandwidth_utilization", BANDWIDTH_UTIL),
)
# internal baselines (persisted, not exported)
MISS_BASELINE = "l2_miss_rate"
INTERCONNECT_BASELINE = "interconnect_throughput"


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


@dataclass(slots=True)
class _DeviceInfo:
    vendor: str = ""
    model: str = ""
    cloud: str = ""
    price: float | None = None


class IndicatorEngine:
    """Contention indicators of every device of the node."""

    def __init__(self, config: IndicatorConfig, state_dir: Path | None, poll_interval: float) -> None:
        self.config = config
        self.poll_interval = poll_interval
        self.baselines = BaselineStore(state_dir)
        self.baselines.load()
        self._devices: dict[DeviceId, _DeviceState] = {}
        self._info: dict[DeviceId, _DeviceInfo] = {}
        self._index = SeriesIndex()
        var = config.variability
        self._window_capacity = capacity_for(var.window_seconds, poll_interval, var.max_samples)
        # the interconnect ring spans two rate spans, so an idle link always has two points
        self._ic_seconds = 2.0 * config.rootcause.interconnect_rate_seconds
        self._ic_capacity = capacity_for(self._ic_seconds, poll_interval, var.max_samples)
        self._max_dt = 2.0 * poll_interval if poll_interval > 0 else float("inf")

    # -- daemon interface -------------------------------------------------------------------

    def set_device_info(self, device_id: DeviceId, model: str = "", vendor: str = "",
                        cloud: str | None = None) -> None:
        """Identity used for the price table; ``cloud`` defaults to ``cost.cloud`` of the config."""
        vendor = vendor or device_id[0]
        cloud = self.config.cost.cloud if cloud is None else cloud
        price = match_price(self.config.cost.prices, vendor, model, cloud)
        self._info[device_id] = _DeviceInfo(vendor, model, cloud, price)

    def save_state(self) -> None:
        """Persist the learned baselines (no-op without a state directory; never raises).

        Safe to call from a worker thread while ``update`` runs (it fsyncs: keep it off the loop).
        """
        self.baselines.save()

    def update(self, now: float, devices: Mapping[DeviceId, Mapping[str, float]]) -> list[Sample]:
        if not self.config.enabled:
            return []
        out: list[Sample] = []
        for device_id, series in devices.items():
            self._update_device(now, device_id, series, out)
        return out

    # -- per device -------------------------------------------------------------------------

    def _state(self, device_id: DeviceId) -> _DeviceState:
        st = self._devices.get(device_id)
        if st is None:
            seconds = self.config.variability.window_seconds
            st = _DeviceState(
                windows={m: RingWindow(seconds, self._window_capacity) for m, _ in VARIABILITY_SERIES},
                interconnect=RingWindow(self._ic_seconds, self._ic_capacity),
            )
            self._devices[device_id] = st
        return st

    @staticmethod
    def _baseline_key(device_id: DeviceId) -> str:
        vendor, gpu, uuid = device_id
        return uuid or f"{vendor}:{gpu}"

    def _update_device(self, now: float, device_id: DeviceId, series: Mapping[str, float],
                       out: list[Sample]) -> None:
        cfg = self.config
        st = self._state(device_id)
        if st.last_update is None:
            dt = self.poll_interval
        else:
            dt = min(max(now - st.last_update, 0.0), self._max_dt)
        st.last_update = now
        info = self._info.get(device_id)
        price = info.price if info is not None else None

        bw_util = series.get(BANDWIDTH_UTIL)
        util = series.get(UTILIZATION)
        bw_gbps = series.get(BANDWIDTH_GBPS)
        miss = series.get(MISS_RATE)

        # 1. memory contention, seconds and dollars counters
        contended = False
        evaluated = False
        signal = compute_signal(series, cfg.contention.basis_order)
        if bw_util is not None and signal is not None:
            basis, compute = signal
            contended = memory_contended(bw_util, compute, cfg.contention)
            evaluated = True
            seconds = st.contention_seconds.get(basis, 0.0)
            if contended:
                seconds += dt
                if price is not None:
                    st.cost_dollars += price * dt / 3600.0
            st.contention_seconds[basis] = seconds
            out.append(("gpu_memory_contention", {"basis": basis}, 1.0 if contended else 0.0))
        for basis, seconds in st.contention_seconds.items():
            out.append(("gpu_memory_contention_seconds_total", {"basis": basis}, seconds))
        if price is not None:
            out.append(("gpu_price_dollars_per_hour", {}, price))
            out.append(("gpu_contention_cost_dollars_total", {}, st.cost_dollars))

        # 2. variability windows
        for metric, name in VARIABILITY_SERIES:
            value = series.get(name)
            if value is not None:
                st.windows[metric].push(now, value)
        recompute = cfg.variability.recompute_seconds
        if st.stats_at is None or now - st.stats_at >= recompute or now < st.stats_at:
            st.stats_at = now
            st.stats = {m: window_stats(w.values(now), cfg.variability) for m, w in st.windows.items()}
        for metric, stats in st.stats.items():
            if stats is None:
                continue
            out.append(("gpu_metric_cov", {"metric": metric}, stats.cov))
            for q, value in stats.quantiles.items():
                out.append(("gpu_metric_percentile", {"metric": metric, "percentile": q}, value))
            out.append(("gpu_metric_heavy_tail", {"metric": metric}, 1.0 if stats.heavy_tail else 0.0))

        # 3. baselines: compare, then learn while loaded
        bcfg = cfg.baseline
        key = self._baseline_key(device_id)
        loaded = util is None or util > bcfg.load_utilization_percent
        learn = loaded and dt > 0
        deviating = False
        drop: bool | None = None
        bw_metric, bw_value = ("bandwidth", bw_gbps) if bw_gbps is not None else ("bandwidth_utilization", bw_util)
        if bw_value is not None:
            b = self.baselines.get(key, bw_metric)
            if b.n >= bcfg.warmup_samples:
                z = b.zscore(bw_value, bcfg.min_relative_stddev)
                deviating = loaded and z is not None and z < -bcfg.deviation_sigma
                labels = {"metric": bw_metric}
                out.append(("gpu_baseline_mean", labels, b.mean))
                out.append(("gpu_baseline_stddev", dict(labels), b.stddev))
                if loaded and z is not None:
                    out.append(("gpu_baseline_zscore", dict(labels), z))
                out.append(("gpu_baseline_deviation", dict(labels), 1.0 if deviating else 0.0))
                if util is not None:
                    drop = bandwidth_drop_under_load(bw_value, b.mean, util, cfg.bandwidth_drop)
                    out.append(("gpu_bandwidth_drop_under_load", {}, 1.0 if drop else 0.0))
            if learn:
                b.update(bw_value, dt, bcfg.half_life_seconds)

        miss_baseline: float | None = None
        if miss is not None:
            mb = self.baselines.get(key, MISS_BASELINE)
            if mb.n >= bcfg.warmup_samples:
                miss_baseline = mb.mean
            if learn:
                mb.update(miss, dt, bcfg.half_life_seconds)

        # 4. root cause
        labelled = self._index.gather(series)
        throughput = self._interconnect_rate(now, st, labelled.interconnect_bytes, labelled.interconnect_series)
        ic_baseline: float | None = None
        if throughput is not None and labelled.link_util is not None:
            ib = self.baselines.get(key, INTERCONNECT_BASELINE)
            if ib.n >= bcfg.warmup_samples:
                ic_baseline = ib.mean
            if dt > 0 and labelled.link_util >= cfg.rootcause.coherency_link_utilization_percent:
                ib.update(throughput, dt, bcfg.half_life_seconds)
        flags = classify(RootCauseInputs(
            bandwidth_util=bw_util, miss_rate=miss, miss_baseline=miss_baseline,
            link_util=labelled.link_util, interconnect_throughput=throughput,
            interconnect_baseline=ic_baseline, throttle=labelled.throttle,
        ), cfg.rootcause)
        for cause, active in flags.items():
            out.append(("gpu_contention_cause", {"cause": cause}, 1.0 if active else 0.0))
        any_contention = contended or deviating or bool(drop)
        out.append(("gpu_contention_cause_info",
                    {"cause": dominant_cause(flags, any_contention, cfg.rootcause.priority, evaluated)}, 1.0))

    def _interconnect_rate(self, now: float, st: _DeviceState, total: float | None,
                           n_series: int) -> float | None:
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
        span = self.config.rootcause.interconnect_rate_seconds
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

    # -- introspection for tests and the bench --------------------------------------------

    def baseline(self, device_id: DeviceId, metric: str) -> Ewma | None:
        return self.baselines.peek(self._baseline_key(device_id), metric)
