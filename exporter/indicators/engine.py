"""The indicator engine: per device state, fed every poll, returning every indicator series.

The daemon calls ``update(now, devices)`` at its fast sampling interval with the latest canonical
series of each device; it saves ``baselines`` (``exporter.baseline_file``) periodically and on
shutdown.  Everything here runs
on monotonic time; windows are fixed-size rings, so memory does not grow with uptime.

Per device and update:
1. the memory state (``state.py``, docs/detection.md): idle, healthy, memory_bound, contended,
   throttled or unknown, from the seed's signature (bandwidth high, compute starved) and the
   evidence of interference (active clients from per-process series; the compute signal
   persistently below the GPU's own memory-bound reference).  ``gpu_memory_contention`` and
   the seconds / dollars counters follow ``contended`` only, advanced by the time since the
   previous update (capped at 2 poll intervals, so a stalled poll is not credited in full);
2. the fast samples enter the variability windows; CoV, quantiles and the heavy-tail flag are
   recomputed at most every ``variability.recompute_seconds``;
3. robust baselines (bandwidth for export; L2 miss rate and interconnect throughput for
   attribution) compare the recent median with their fast and long references, flag after a
   persistence window, and learn only while the GPU is loaded, not contended or throttled, and
   not flagged;
4. bandwidth drop under load, root-cause flags and the dominant cause (``none`` unless the GPU
   is contended, throttled or deviating).
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Mapping

from ..model import DeviceId
from .baseline import BaselineStore
from .clients import device_evidence, held_clients, say_evidence, trusted
from .config import IndicatorConfig
from .contention import BASIS_SERIES, bandwidth_drop_under_load, compute_signal
from .cost import match_price, slowdown_cost
from .device_state import _DeviceInfo, _DeviceState
from .mig import derive_gpu_state, instance_verdicts
from .robust import DeviationTracker, RobustBaseline
from .rootcause import CAUSES, classify_values, dominant_cause, miss_rate_risen, throttle_explains
from .series import InputKey, LabelledSignals, SeriesIndex
from .signals import (
    BANDWIDTH_GBPS,
    BANDWIDTH_UTIL,
    INTERCONNECT_BASELINE,
    MISS_BASELINE,
    MISS_RATE,
    PROFILING_AVAILABLE,
    REFERENCE_PREFIX,
    UTILIZATION,
    VARIABILITY_SERIES,
)
from .state import STARVATION_BASES, STATES, decide
from .variability import window_summary
from .window import RingWindow, SortedWindow, capacity_for

log = logging.getLogger(__name__)

Output = tuple[str, dict[str, str], float]  # one indicator value: (series, labels, value)

# Outputs with a fixed label set share one labels dict (the engine's callers only read them).
# gpu_memory_state: its six series, per current state
_STATE_OUT: dict[str, tuple[Output, ...]] = {
    current: tuple(("gpu_memory_state", {"state": name}, 1.0 if name == current else 0.0) for name in STATES)
    for current in STATES}
_NO_LABELS: dict[str, str] = {}
_BY_BASIS = {b: {"basis": b} for b in BASIS_SERIES}
_BY_CAUSE = {c: {"cause": c} for c in (*CAUSES, "none", "unknown")}
_MAX_LABEL_SETS = 1024  # shared label dicts kept (a fixed vocabulary: states, reasons, causes, ...)




class _LabelSets(dict):
    """One shared ``{name: value}`` (or ``{name1: v1, name2: v2}``) dict per key, made on first use."""

    def one(self, name: str, value: str) -> dict[str, str]:
        key = (name, value)
        labels = self.get(key)
        if labels is None:
            if len(self) >= _MAX_LABEL_SETS:
                self.clear()
            labels = self[key] = {name: value}
        return labels

    def many(self, *pairs: tuple[str, str]) -> dict[str, str]:
        labels = self.get(pairs)
        if labels is None:
            if len(self) >= _MAX_LABEL_SETS:
                self.clear()
            labels = self[pairs] = dict(pairs)
        return labels

    def two(self, name1: str, value1: str, name2: str, value2: str) -> dict[str, str]:
        key = (name1, value1, name2, value2)
        labels = self.get(key)
        if labels is None:
            if len(self) >= _MAX_LABEL_SETS:
                self.clear()
            labels = self[key] = {name1: value1, name2: value2}
        return labels


class IndicatorEngine:
    """Contention indicators of every device of the node."""

    def __init__(self, config: IndicatorConfig, baselines: BaselineStore | None, poll_interval: float) -> None:
        """``baselines``: what was learned before (restored by the daemon from its state file,
        ``exporter.baseline_file``); None starts fresh.  The engine reads and writes no file."""
        self.config = config
        self.poll_interval = poll_interval
        self.baselines = baselines if baselines is not None else BaselineStore()
        self._devices: dict[DeviceId, _DeviceState] = {}
        self._info: dict[DeviceId, _DeviceInfo] = {}
        self._index = SeriesIndex()
        self._labels = _LabelSets()
        self._evidence_said: set[tuple[str, str, str]] = set()  # evidence kinds logged so far
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

    def carry_over(self, prev: IndicatorEngine) -> None:
        """A reload keeps what ``prev`` learned: its baselines and the per-device counters, which
        must never go back (gpu_memory_contention_seconds_total, the cost counter), and how long
        a deviation or drop has been held (a reload neither resets nor re-raises it)."""
        self.baselines.adopt(prev.baselines)
        for device_id, st in prev._devices.items():
            fresh = self._state(device_id)
            fresh.contention_seconds = dict(st.contention_seconds)
            fresh.cost_dollars = st.cost_dollars
            fresh.flagged_seconds = dict(st.flagged_seconds)
            fresh.idle_seconds, fresh.drop_seconds, fresh.state = st.idle_seconds, st.drop_seconds, st.state

    def update(self, now: float, devices: Mapping[DeviceId, Mapping[InputKey, float]]) -> list[Output]:
        if not self.config.enabled:
            return []
        out: list[Output] = []
        for device_id, series in devices.items():
            self._update_device(now, device_id, series, out)
        return out

    # -- per device -------------------------------------------------------------------------

    def _state(self, device_id: DeviceId) -> _DeviceState:
        st = self._devices.get(device_id)
        if st is None:
            seconds = self.config.variability.window_seconds
            st = _DeviceState(
                windows={m: SortedWindow(seconds, self._window_capacity) for m, _ in VARIABILITY_SERIES},
                interconnect=RingWindow(self._ic_seconds, self._ic_capacity),
            )
            self._devices[device_id] = st
        return st

    @staticmethod
    def _baseline_key(device_id: DeviceId) -> str:
        vendor, gpu, uuid = device_id
        return uuid or f"{vendor}:{gpu}"

    def _baseline(self, key: str, metric: str) -> RobustBaseline:
        b = self.config.baseline
        return self.baselines.get(key, metric, lambda: RobustBaseline(
            b.bin_seconds, b.fast_bins, b.long_bin_bins, b.long_bins))

    def _reference(self, key: str, basis: str) -> RobustBaseline:
        s = self.config.state
        return self.baselines.get(key, REFERENCE_PREFIX + basis, lambda: RobustBaseline(
            s.reference_bin_seconds, s.reference_bins, s.reference_bins, 1))

    def _tracker(self, st: _DeviceState, key: str, metric: str) -> DeviationTracker:
        tr = st.trackers.get(metric)
        if tr is None:
            tr = DeviationTracker(self.config.baseline.persistence_seconds,
                                  flagged=self.baselines.was_flagged(key, metric))
            st.trackers[metric] = tr
        return tr

    def _recent(self, st: _DeviceState, metric: str, now: float, value: float,
                seconds: float | None = None) -> float:
        """Median of the last ``seconds`` (default ``compare_seconds``) of ``metric`` with ``value``."""
        ring = st.recent.get(metric)
        if ring is None:
            seconds = seconds or self.config.baseline.compare_seconds
            ring = SortedWindow(seconds, capacity_for(seconds, self.poll_interval, 1024))
            st.recent[metric] = ring
        ring.push(now, value)
        return ring.median(now)

    def _update_device(self, now: float, device_id: DeviceId, series: Mapping[InputKey, float],
                       out: list[Output]) -> None:
        cfg = self.config
        st = self._state(device_id)
        if st.last_update is None:
            dt = self.poll_interval
        else:
            dt = min(max(now - st.last_update, 0.0), self._max_dt)
        st.last_update = now
        info = self._info.get(device_id)
        price = info.price if info is not None else None
        key = self._baseline_key(device_id)
        bcfg = cfg.baseline
        scfg = cfg.state

        bw_util = series.get(BANDWIDTH_UTIL)
        util = series.get(UTILIZATION)
        bw_gbps = series.get(BANDWIDTH_GBPS)
        miss = series.get(MISS_RATE)
        labelled = self._gather(st, series)
        throttled = throttle_explains(labelled.throttle, labelled.clock_ratio(), cfg.rootcause)
        held = held_clients(st, labelled, now, scfg)
        evidence, ev_source, ev_reason = device_evidence(labelled)
        said = (evidence, ev_source, ev_reason)
        if said not in self._evidence_said:  # once per kind of evidence (a small vocabulary)
            self._evidence_said.add(said)
            say_evidence(device_id, evidence, ev_source, ev_reason)
        clients = trusted(evidence, held.get("", 0), scfg)

        # 1. memory state: signature, evidence, verdict
        signal = compute_signal(series, cfg.contention.basis_order)
        basis, compute = signal if signal is not None else (None, None)
        # state.signature(), without building its StateInputs
        if bw_util is None or bw_util <= cfg.contention.bandwidth_utilization_percent:
            sig = False
        elif basis in STARVATION_BASES and compute is not None:
            sig = compute < cfg.contention.compute_percent
        else:
            sig = True
        ref: RobustBaseline | None = None
        ref_median: float | None = None
        drop_cond = False
        if basis in STARVATION_BASES and compute is not None:
            ref = self._reference(key, basis)
            stats = ref.stats() if ref.bins >= scfg.reference_warmup_bins else None
            if stats is not None:
                ref_median = stats[0]
                recent_compute = self._recent(st, "compute_" + basis, now, compute, scfg.drop_compare_seconds)
                drop_cond = sig and recent_compute < ref_median * (1.0 - scfg.drop_fraction)
        if st.drop is None:
            st.drop = DeviationTracker(scfg.drop_persistence_seconds)
        throughput_drop = st.drop.update(drop_cond, dt)
        st.drop_seconds = st.drop_seconds + dt if throughput_drop and clients is None else 0.0
        unconfirmed = bool(scfg.drop_confirm_seconds) and st.drop_seconds >= scfg.drop_confirm_seconds
        verdict = decide(bw_util, util, basis, compute, throttled, clients, ref_median is not None,
                         throughput_drop, unconfirmed, scfg, cfg.contention.bandwidth_utilization_percent,
                         cfg.contention.compute_percent, series.get(PROFILING_AVAILABLE) == 0.0)
        if labelled.instances:  # MIG: a state per GPU instance, the GPU's derived from them
            inst = instance_verdicts(cfg, self._labels, labelled, held, evidence, throttled, out)
            verdict, inst_basis, inst_bw = derive_gpu_state(verdict, inst)
            if basis is None:
                basis, bw_util = inst_basis, inst_bw
            clients = None  # counted per instance: processes of two instances are no co-tenants
        state = verdict.state
        st.state = state
        contended = state == "contended"
        if ref is not None and dt > 0:
            if state == "idle":
                st.idle_seconds += dt
                if scfg.reference_reset_idle_seconds and st.idle_seconds >= scfg.reference_reset_idle_seconds \
                        and ref.learned_seconds > 0:
                    ref.reset()  # the next job gets its own reference
            else:
                st.idle_seconds = 0.0
            if sig and state in ("memory_bound", "unknown") and not drop_cond and not throughput_drop \
                    and verdict.reason != "profiling_unavailable":
                ref.learn(compute, dt)  # type: ignore[arg-type]
        labels = self._labels
        by_basis = _BY_BASIS
        out.extend(_STATE_OUT[state] if state in _STATE_OUT else
                   [("gpu_memory_state", {"state": name}, 1.0 if name == state else 0.0) for name in STATES])
        out.append(("gpu_memory_state_info", labels.two("state", state, "reason", verdict.reason), 1.0))
        out.append(("gpu_contention_evidence_info", labels.many(
            ("evidence", "clients" if clients is not None or (labelled.instances and evidence != "none")
             else "none"), ("reason", ev_reason), ("source", ev_source)), 1.0))
        if clients is not None:
            out.append(("gpu_active_clients", _NO_LABELS, float(clients)))
            top = labelled.top_process(scfg.client_active_percent)
            if top:
                out.append(("gpu_top_process_info", {"process": top[:128]}, 1.0))
        if ref_median is not None:
            out.append(("gpu_memory_bound_reference_percent", labels.one("basis", basis), ref_median))  # type: ignore[arg-type]

        # contention seconds and the slowdown-based cost
        slowdown = 0.0
        if contended:
            if ref_median and compute is not None:
                slowdown = min(max(1.0 - compute / ref_median, 0.0), 1.0)
            else:
                slowdown = cfg.cost.default_slowdown
        if basis is not None and bw_util is not None:
            seconds = st.contention_seconds.get(basis, 0.0)
            if contended:
                seconds += dt
            st.contention_seconds[basis] = seconds
            out.append(("gpu_memory_contention", by_basis.get(basis) or labels.one("basis", basis),
                        1.0 if contended else 0.0))
        for b_name, seconds in st.contention_seconds.items():
            out.append(("gpu_memory_contention_seconds_total", by_basis.get(b_name) or labels.one("basis", b_name),
                        seconds))
        if contended:
            out.append(("gpu_contention_slowdown_ratio", _NO_LABELS, slowdown))
        elif state != "unknown":
            out.append(("gpu_contention_slowdown_ratio", _NO_LABELS, 0.0))
        if price is not None:
            if contended:
                st.cost_dollars += slowdown_cost(price, slowdown, dt, cfg.cost.surcharge_dollars,
                                                 cfg.cost.surcharge_step)
            out.append(("gpu_price_dollars_per_hour", _NO_LABELS, price))
            out.append(("gpu_contention_cost_dollars_total", _NO_LABELS, st.cost_dollars))

        # 2. variability windows
        for metric, name in VARIABILITY_SERIES:
            value = series.get(name)
            if value is not None:
                st.windows[metric].push(now, value)
        recompute = cfg.variability.recompute_seconds
        if st.stats_at is None or now - st.stats_at >= recompute or now < st.stats_at:
            st.stats_at = now
            self._variability(st, now)
        out.extend(st.stats_out)

        # 3. robust baselines: compare the recent median, flag after persistence, learn when clean
        loaded = util is None or util > bcfg.load_utilization_percent
        clean_state = state not in ("contended", "throttled")
        deviating = False
        drop: bool | None = None
        bw_metric, bw_value = ("bandwidth", bw_gbps) if bw_gbps is not None else ("bandwidth_utilization", bw_util)
        if bw_value is not None:
            b = self._baseline(key, bw_metric)
            tracker = self._tracker(st, key, bw_metric)
            stats = b.stats() if b.bins >= bcfg.warmup_bins else None
            # the protected level (highest hourly median): a slow decline does not drag it along
            long_ref = b.long_peak() if len(b.long) >= bcfg.long_warmup_bins else None
            cond = False
            recent = self._recent(st, bw_metric, now, bw_value) if loaded else None
            if recent is not None and stats is not None:
                z = b.zscore(recent, bcfg.min_relative_stddev)
                cond = z is not None and z < -bcfg.deviation_sigma
            if recent is not None and long_ref is not None and long_ref > 0:
                cond = cond or recent <= long_ref * (1.0 - bcfg.long_drop_fraction)
            deviating = tracker.update(cond, dt)
            held = st.flagged_seconds.get(bw_metric, 0.0) + dt if deviating else 0.0
            st.flagged_seconds[bw_metric] = held
            if deviating and bcfg.relearn_after_seconds and held >= bcfg.relearn_after_seconds:
                # an event an operator sees (counter and log), never a silent clear
                log.warning("bandwidth of %s has been below its baseline for %.0f s: relearned, the low "
                            "level is the new normal (gpu_baseline_relearned_total)", key, held)
                st.relearned[bw_metric] = st.relearned.get(bw_metric, 0) + 1
                b.reset()
                tracker.flagged = deviating = cond = False
                st.flagged_seconds[bw_metric] = 0.0
                stats = long_ref = None
            self.baselines.set_flag(key, bw_metric, deviating)
            metric_labels = labels.one("metric", bw_metric)
            if stats is not None:
                center, sigma = stats
                out.append(("gpu_baseline_mean", metric_labels, center))
                out.append(("gpu_baseline_stddev", metric_labels, sigma))
                if loaded:
                    z_now = b.zscore(bw_value, bcfg.min_relative_stddev)
                    if z_now is not None:
                        out.append(("gpu_baseline_zscore", metric_labels, z_now))
            if long_ref is not None:
                out.append(("gpu_baseline_long_mean", metric_labels, long_ref))
            if stats is not None or long_ref is not None:
                out.append(("gpu_baseline_deviation", metric_labels, 1.0 if deviating else 0.0))
            if bw_metric in st.relearned:
                out.append(("gpu_baseline_relearned_total", metric_labels, float(st.relearned[bw_metric])))
            if stats is not None and util is not None:
                # against the fast reference or the protected level, whichever is higher (a slow
                # decline is in the first and not in the second)
                drop = bandwidth_drop_under_load(recent if recent is not None else bw_value,
                                                 max(stats[0], long_ref or 0.0), util, cfg.bandwidth_drop)
                out.append(("gpu_bandwidth_drop_under_load", _NO_LABELS, 1.0 if drop else 0.0))
            if loaded and clean_state and not cond and not deviating and not drop and dt > 0:
                b.learn(bw_value, dt)

        miss_baseline: float | None = None
        if miss is not None:
            mb = self._baseline(key, MISS_BASELINE)
            mstats = mb.stats() if mb.bins >= bcfg.warmup_bins else None
            if mstats is not None:
                miss_baseline = mstats[0]
            risen = miss > cfg.rootcause.pressure_miss_percent or miss_rate_risen(miss, miss_baseline, cfg.rootcause)
            if loaded and clean_state and not risen and dt > 0:
                mb.learn(miss, dt)

        # 4. root cause
        throughput = self._interconnect_rate(now, st, labelled.interconnect_bytes, labelled.interconnect_series)
        ic_baseline: float | None = None
        if throughput is not None and labelled.link_util is not None:
            ib = self._baseline(key, INTERCONNECT_BASELINE)
            istats = ib.stats() if ib.bins >= bcfg.warmup_bins else None
            if istats is not None:
                ic_baseline = istats[0]
            degraded = ic_baseline is not None and \
                throughput <= ic_baseline * (1.0 - cfg.rootcause.coherency_throughput_drop_fraction)
            if dt > 0 and labelled.link_util >= cfg.rootcause.coherency_link_utilization_percent \
                    and not degraded and not contended and not throttled:
                ib.learn(throughput, dt)
        flags = classify_values(bw_util, miss, miss_baseline, labelled.link_util, throughput, ic_baseline,
                                labelled.throttle, cfg.rootcause)
        by_cause = _BY_CAUSE
        for cause, active in flags.items():
            out.append(("gpu_contention_cause", by_cause.get(cause) or labels.one("cause", cause),
                        1.0 if active else 0.0))
        if state == "unknown":
            cause = "unknown"
        elif contended or state == "throttled" or deviating or drop:
            cause = dominant_cause(flags, True, cfg.rootcause.priority)
        else:
            cause = "none"
        out.append(("gpu_contention_cause_info", by_cause.get(cause) or labels.one("cause", cause), 1.0))

    def _gather(self, st: _DeviceState, series: Mapping[InputKey, float]) -> LabelledSignals:
        """The device's labelled signals; which of its keys are labelled is worked out again only
        when its keys changed (or the index started over)."""
        index = self._index
        keys = list(series)  # in order: the signals sum and collect in series order
        if st.labelled is None or st.labelled_epoch != index.epoch or keys != st.labelled_keys:
            st.labelled = index.labelled(series)
            st.labelled_keys = keys  # the feed hands the same key objects: compared by identity
            st.labelled_epoch = index.epoch
        return index.gather(series, st.labelled)

    def _variability(self, st: _DeviceState, now: float) -> None:
        """Recompute the variability statistics (a window whose values are those of the last
        computation keeps its result) and their output."""
        vcfg = self.config.variability
        labels = self._labels
        out: list[Output] = []
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
            out.append(("gpu_metric_cov", labels.one("metric", metric), stats.cov))
            for q, value in stats.quantiles:
                out.append(("gpu_metric_percentile", labels.two("metric", metric, "percentile", q), value))
            out.append(("gpu_metric_heavy_tail", labels.one("metric", metric), 1.0 if stats.heavy_tail else 0.0))
        st.stats_out = out

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

    def state(self, device_id: DeviceId) -> str | None:
        st = self._devices.get(device_id)
        return st.state if st is not None else None

    def baseline(self, device_id: DeviceId, metric: str) -> RobustBaseline | None:
        return self.baselines.peek(self._baseline_key(device_id), metric)
