"""The indicator engine: per device state, fed every poll, returning every indicator series.

The daemon calls ``update(now, frames)`` at its fast sampling interval with the latest canonical
series of each device (``model.Frames``) and gets each device's indicator series back as a frame
too; the feed saves ``baselines`` (``exporter.run.baseline_file``) periodically and on shutdown.
Everything here runs on monotonic time; windows are fixed-size rings, so memory does not grow.

Per device and update, ``_update_device`` runs one step per stage:
1. ``_memory_state``: idle, healthy, memory_bound, contended, shared, throttled or unknown
   (``state.decide``, docs/detection.md) from the seed's signature (bandwidth high, compute
   starved) and the evidence of interference (busy clients; compute persistently below the
   GPU's own memory-bound reference);
2. ``_contention``: ``gpu_memory_contention`` and its seconds / dollars counters follow
   ``contended``, advanced by the time since the previous update (at most 2 poll intervals);
3. ``device_state.variability_stage``: fast samples enter the windows; CoV, quantiles and the
   heavy-tail flag (raised on a busy GPU only) are recomputed at most every
   ``variability.recompute_seconds``, and at once when the GPU turns busy or idle;
4. ``_bandwidth_baseline``: robust baselines compare the recent median with their fast and long
   references, flag after a persistence window, and learn only while the GPU is loaded, not
   contended, throttled or flagged; bandwidth drop under load;
5. ``_root_cause``: the L2 miss rate and interconnect baselines, root-cause flags and the
   dominant cause (``none`` unless the GPU is contended, throttled or deviating).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from ..model import DeviceId, Frame, Frames, SeriesId
from .baseline import BaselineStore
from .clients import (
    UNCOUNTED,
    book_contention,
    device_evidence,
    evidence_key,
    held_clients,
    held_only,
    say_evidence,
    trusted,
)
from .config import IndicatorConfig
from .contention import bandwidth_drop_under_load, compute_signal
from .cost import match_price, slowdown_cost
from .device_state import _DeviceInfo, _DeviceState, _Tick, interconnect_rate, variability_stage
from .mig import mig_state
from .outputs import BY_BASIS, BY_CAUSE, NO_LABELS, LabelSets, state_series
from .robust import DeviationTracker, RobustBaseline
from .rootcause import classify_values, dominant_cause, miss_rate_risen, throttle_explains
from .series import LabelledSignals, SeriesIndex
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
from .state import STARVATION_BASES, decide, signature
from .window import RingWindow, SortedWindow, capacity_for

log = logging.getLogger(__name__)


class IndicatorEngine:
    """Contention indicators of every device of the node."""

    def __init__(self, config: IndicatorConfig, baselines: BaselineStore | None, poll_interval: float,
                 slowest: float = 0.0) -> None:
        """``baselines``: what was learned before (restored by the daemon from its state file,
        ``exporter.run.baseline_file``); None starts fresh.  The engine reads and writes no file.
        ``poll_interval``: the step (the fast interval); ``slowest``: the longest regular one (a
        calm node's, ``IndicatorFeed.sampling_interval``); a step's dt is capped at twice that."""
        self.config = config
        self.poll_interval = poll_interval
        self.baselines = baselines if baselines is not None else BaselineStore()
        self._devices: dict[DeviceId, _DeviceState] = {}
        self._info: dict[DeviceId, _DeviceInfo] = {}
        self._index = SeriesIndex()
        self._labels = LabelSets()
        self._evidence_said: set[tuple[str, str, str]] = set()  # evidence kinds logged so far
        var = config.variability
        self._window_capacity = capacity_for(var.window_seconds, poll_interval, var.max_samples)
        # the interconnect ring spans two rate spans, so an idle link always has two points
        self._ic_seconds = 2.0 * config.rootcause.interconnect_rate_seconds
        self._ic_capacity = capacity_for(self._ic_seconds, poll_interval, var.max_samples)
        self._max_dt = 2.0 * max(poll_interval, slowest) if poll_interval > 0 else float("inf")

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
            fresh.flagged_seconds, fresh.relearned = dict(st.flagged_seconds), dict(st.relearned)
            fresh.idle_seconds, fresh.drop_seconds, fresh.state = st.idle_seconds, st.drop_seconds, st.state

    def update(self, now: float, frames: Mapping[DeviceId, Mapping[SeriesId, float]],
               client_intervals: Mapping[DeviceId, float] | None = None) -> Frames:
        """One step for every device of ``frames`` (its canonical series); the indicator series
        per device (``{(name, own labels): value}``, the GPU's identity not among the labels).
        ``client_intervals``: the poll interval of the source counting each device's clients."""
        if not self.config.enabled:
            return {}
        intervals = client_intervals or {}
        return {device_id: self._update_device(now, device_id, series, intervals.get(device_id, 0.0))
                for device_id, series in frames.items()}

    # -- per device -------------------------------------------------------------------------

    def _state(self, device_id: DeviceId) -> _DeviceState:
        st = self._devices.get(device_id)
        if st is None:
            seconds, capacity = self.config.variability.window_seconds, self._window_capacity
            st = self._devices[device_id] = _DeviceState(
                windows={m: SortedWindow(seconds, capacity) for m, _ in VARIABILITY_SERIES},
                interconnect=RingWindow(self._ic_seconds, self._ic_capacity))
        return st

    @staticmethod
    def baseline_key(device_id: DeviceId) -> str:
        """The GPU's key in the baseline state file (its uuid; vendor:gpu without one)."""
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

    def _update_device(self, now: float, device_id: DeviceId, series: Mapping[SeriesId, float],
                       client_interval: float) -> Frame:
        """The device's indicator series after this update: the stages of the module doc.
        ``client_interval``: the poll interval of the source counting its clients (0: unknown)."""
        cfg = self.config
        st = self._state(device_id)
        dt = self.poll_interval if st.last_update is None else min(max(now - st.last_update, 0.0), self._max_dt)
        st.last_update = now
        plain = {sid[0]: v for sid, v in series.items() if not sid[1]}  # the GPU-level series
        labelled = self._gather(st, series)
        t = _Tick(now, dt, st, self.baseline_key(device_id), plain, labelled, {},
                  throttle_explains(labelled.throttle, labelled.clock_ratio(), cfg.rootcause))
        t.held = held_clients(st, labelled, now, cfg.state, client_interval)
        t.evidence, ev_source, ev_reason = device_evidence(labelled)
        say_evidence(self._evidence_said, device_id, t.evidence, ev_source, ev_reason)
        t.clients = trusted(t.evidence, t.held.get("", 0), cfg.state)
        t.bw_util = plain.get(BANDWIDTH_UTIL)
        self._memory_state(t, ev_source, ev_reason)
        info = self._info.get(device_id)
        self._contention(t, info.price if info is not None else None)
        variability_stage(t, self.config.variability, self._labels)
        deviating, drop = self._bandwidth_baseline(t)
        self._root_cause(t, deviating or bool(drop))
        return t.out

    def _memory_state(self, t: _Tick, ev_source: str, ev_reason: str) -> None:
        """1. the memory state: the signature, the evidence of interference, the verdict."""
        cfg, st, scfg = self.config, t.st, self.config.state
        signal = compute_signal(t.plain, cfg.contention.basis_order)
        t.basis, t.compute = signal if signal is not None else (None, None)
        basis, compute = t.basis, t.compute
        sig = signature(t.bw_util, basis, compute, cfg.contention.bandwidth_utilization_percent,
                         cfg.contention.compute_percent)
        ref: RobustBaseline | None = None
        drop_cond = False
        if basis in STARVATION_BASES and compute is not None:
            ref = self._reference(t.key, basis)
            stats = ref.stats() if ref.bins >= scfg.reference_warmup_bins else None
            if stats is not None:
                t.ref_median = stats[0]
                recent_compute = st.recent_median("compute_" + basis, t.now, compute,
                                                  scfg.drop_compare_seconds or self.config.baseline.compare_seconds,
                                                  self.poll_interval)
                drop_cond = sig and recent_compute < t.ref_median * (1.0 - scfg.drop_fraction)
        if st.drop is None:
            st.drop = DeviationTracker(scfg.drop_persistence_seconds)
        throughput_drop = st.drop.update(drop_cond, t.dt)
        st.drop_seconds = st.drop_seconds + t.dt if throughput_drop and t.clients is None else 0.0
        unconfirmed = bool(scfg.drop_confirm_seconds) and st.drop_seconds >= scfg.drop_confirm_seconds
        verdict = decide(t.bw_util, t.plain.get(UTILIZATION), basis, compute, t.throttled, t.clients,
                         t.ref_median is not None, throughput_drop, unconfirmed, scfg,
                         cfg.contention.bandwidth_utilization_percent, cfg.contention.compute_percent,
                         t.plain.get(PROFILING_AVAILABLE) == 0.0,
                         uncounted=ev_reason if ev_reason in UNCOUNTED and t.clients is None else "")
        out, labelled = t.out, t.labelled
        counted = t.clients is not None
        if labelled.instances or labelled.contexts:  # MIG: a state per GPU instance, the GPU's from them
            verdict, counted = mig_state(cfg, self._labels, t, verdict)
        t.state = st.state = verdict.state
        t.busy = verdict.state != "idle" and verdict.reason != "no_load_signal"
        if ref is not None and t.dt > 0:
            if t.state == "idle":
                st.idle_seconds += t.dt
                if scfg.reference_reset_idle_seconds and st.idle_seconds >= scfg.reference_reset_idle_seconds \
                        and ref.learned_seconds > 0:
                    ref.reset()  # the next job gets its own reference
            else:
                st.idle_seconds = 0.0
            if sig and t.state in ("memory_bound", "unknown") and not drop_cond and not throughput_drop \
                    and verdict.reason != "profiling_unavailable":
                ref.learn(compute, t.dt)  # type: ignore[arg-type]
        labels = self._labels
        out.update(state_series(t.state))
        out[("gpu_memory_state_info", labels.two("state", t.state, "reason", verdict.reason))] = 1.0
        out[evidence_key(labels, counted, ev_reason, ev_source)] = 1.0
        if t.clients is not None:
            out[("gpu_active_clients", NO_LABELS)] = float(t.clients)
            top = labelled.top_process(scfg.client_active_percent)
            if top:
                out[("gpu_top_process_info", (("process", top[:128]),))] = 1.0
        if t.ref_median is not None:
            out[("gpu_memory_bound_reference_percent", labels.one("basis", basis))] = t.ref_median  # type: ignore[arg-type]

    def _contention(self, t: _Tick, price: float | None) -> None:
        """2. contention seconds and the slowdown-based cost, following ``contended``."""
        cfg, st, out, labels = self.config, t.st, t.out, self._labels
        contended = t.state == "contended"
        slowdown: float | None = 0.0  # None: n/a, nothing measures it (no reference) and none assumed
        if contended:
            if t.ref_median and t.compute is not None:
                slowdown = min(max(1.0 - t.compute / t.ref_median, 0.0), 1.0)
            else:
                slowdown = cfg.cost.default_slowdown or None
        basis = t.basis if t.basis is not None and t.bw_util is not None else None
        dollars = slowdown_cost(price, slowdown, t.dt, cfg.cost.surcharge_dollars, cfg.cost.surcharge_step) \
            if price is not None and slowdown is not None and contended else 0.0
        book_contention(st, basis, contended, held_only(st, t.held, cfg.state.min_clients), t.dt, dollars)
        if basis is not None:
            st.contention_seconds.setdefault(basis, 0.0)
            out[("gpu_memory_contention", BY_BASIS.get(basis) or labels.one("basis", basis))] = \
                1.0 if contended else 0.0
        for b_name, seconds in st.contention_seconds.items():
            out[("gpu_memory_contention_seconds_total", BY_BASIS.get(b_name) or labels.one("basis", b_name))] = seconds
        if slowdown is not None and t.state != "unknown":  # absent while n/a or unknown
            out[("gpu_contention_slowdown_ratio", NO_LABELS)] = slowdown
        if price is not None:
            out[("gpu_price_dollars_per_hour", NO_LABELS)] = price
            out[("gpu_contention_cost_dollars_total", NO_LABELS)] = st.cost_dollars

    def _bandwidth_baseline(self, t: _Tick) -> tuple[bool, bool | None]:
        """4. the bandwidth baseline: compare the recent median, flag after persistence, learn
        when clean; (deviating, bandwidth drop under load) for the root cause."""
        cfg, bcfg, st, key, dt, out = self.config, self.config.baseline, t.st, t.key, t.dt, t.out
        util, bw_gbps, bw_util = t.plain.get(UTILIZATION), t.plain.get(BANDWIDTH_GBPS), t.bw_util
        t.loaded = util is None or util > bcfg.load_utilization_percent
        t.clean = t.state not in ("contended", "throttled")
        deviating = False
        drop: bool | None = None
        bw_metric, bw_value = ("bandwidth", bw_gbps) if bw_gbps is not None else ("bandwidth_utilization", bw_util)
        if bw_value is None:
            return deviating, drop
        b = self._baseline(key, bw_metric)
        tracker = self._tracker(st, key, bw_metric)
        stats = b.stats() if b.bins >= bcfg.warmup_bins else None
        # the protected level (highest hourly median): a slow decline does not drag it along
        long_ref = b.long_peak() if len(b.long) >= bcfg.long_warmup_bins else None
        cond = False
        recent = st.recent_median(bw_metric, t.now, bw_value, bcfg.compare_seconds,
                                  self.poll_interval) if t.loaded else None
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
        metric_labels = self._labels.one("metric", bw_metric)
        if stats is not None:
            center, sigma = stats
            out[("gpu_baseline_mean", metric_labels)] = center
            out[("gpu_baseline_stddev", metric_labels)] = sigma
            if t.loaded:
                z_now = b.zscore(bw_value, bcfg.min_relative_stddev)
                if z_now is not None:
                    out[("gpu_baseline_zscore", metric_labels)] = z_now
        if long_ref is not None:
            out[("gpu_baseline_long_mean", metric_labels)] = long_ref
        if stats is not None or long_ref is not None:
            out[("gpu_baseline_deviation", metric_labels)] = 1.0 if deviating else 0.0
            st.relearned.setdefault(bw_metric, 0)  # 0 once warm: increase() sees the first relearning
        if bw_metric in st.relearned:
            out[("gpu_baseline_relearned_total", metric_labels)] = float(st.relearned[bw_metric])
        if stats is not None and util is not None:
            # against the fast reference or the protected level, whichever is higher (a slow
            # decline is in the first and not in the second)
            drop = bandwidth_drop_under_load(recent if recent is not None else bw_value,
                                             max(stats[0], long_ref or 0.0), util, cfg.bandwidth_drop)
            out[("gpu_bandwidth_drop_under_load", NO_LABELS)] = 1.0 if drop else 0.0
        if t.loaded and t.clean and not cond and not deviating and not drop and dt > 0:
            b.learn(bw_value, dt)
        return deviating, drop

    def _root_cause(self, t: _Tick, deviating: bool) -> None:
        """5. the L2 miss-rate and interconnect baselines, root-cause flags and the
        dominant cause (``none`` unless the GPU is contended, throttled or deviating)."""
        cfg, bcfg, rc, dt, key = self.config, self.config.baseline, self.config.rootcause, t.dt, t.key
        contended = t.state == "contended"
        miss = t.plain.get(MISS_RATE)
        miss_baseline: float | None = None
        if miss is not None:
            mb = self._baseline(key, MISS_BASELINE)
            mstats = mb.stats() if mb.bins >= bcfg.warmup_bins else None
            if mstats is not None:
                miss_baseline = mstats[0]
            risen = miss > rc.pressure_miss_percent or miss_rate_risen(miss, miss_baseline, rc)
            if t.loaded and t.clean and not risen and dt > 0:
                mb.learn(miss, dt)
        labelled = t.labelled
        throughput = interconnect_rate(t.now, t.st, labelled.interconnect_bytes, labelled.interconnect_series,
                                       rc.interconnect_rate_seconds)
        ic_baseline: float | None = None
        if throughput is not None and labelled.link_util is not None:
            ib = self._baseline(key, INTERCONNECT_BASELINE)
            istats = ib.stats() if ib.bins >= bcfg.warmup_bins else None
            if istats is not None:
                ic_baseline = istats[0]
            degraded = ic_baseline is not None and \
                throughput <= ic_baseline * (1.0 - rc.coherency_throughput_drop_fraction)
            if dt > 0 and labelled.link_util >= rc.coherency_link_utilization_percent \
                    and not degraded and not contended and not t.throttled:
                ib.learn(throughput, dt)
        flags = classify_values(t.bw_util, miss, miss_baseline, labelled.link_util, throughput, ic_baseline,
                                labelled.throttle, rc)
        out, labels = t.out, self._labels
        for cause, active in flags.items():
            out[("gpu_contention_cause", BY_CAUSE.get(cause) or labels.one("cause", cause))] = 1.0 if active else 0.0
        if t.state == "unknown":
            cause = "unknown"
        elif contended or t.state == "throttled" or deviating:
            cause = dominant_cause(flags, True, cfg.rootcause.priority)
        else:
            cause = "none"
        out[("gpu_contention_cause_info", BY_CAUSE.get(cause) or labels.one("cause", cause))] = 1.0

    def _gather(self, st: _DeviceState, series: Mapping[SeriesId, float]) -> LabelledSignals:
        """The device's labelled signals; which of its keys are labelled is worked out again only
        when its keys changed (or the index started over)."""
        index = self._index
        keys = list(series)  # in order: the signals sum and collect in series order
        if st.labelled is None or st.labelled_epoch != index.epoch or keys != st.labelled_keys:
            st.labelled = index.labelled(series)
            st.labelled_keys = keys  # the feed hands the same key objects: compared by identity
            st.labelled_epoch = index.epoch
        return index.gather(series, st.labelled)

    def forget(self, gone: set[DeviceId]) -> None:
        """Drop ``gone`` devices' state (tables rebuilt: a dict keeps the size it once grew to)."""
        self._devices = {d: s for d, s in self._devices.items() if d not in gone}
        self._info = {d: i for d, i in self._info.items() if d not in gone}

    # -- introspection for tests and the bench --------------------------------------------

    def state(self, device_id: DeviceId) -> str | None:
        st = self._devices.get(device_id)
        return st.state if st is not None else None

    def baseline(self, device_id: DeviceId, metric: str) -> RobustBaseline | None:
        return self.baselines.peek(self.baseline_key(device_id), metric)
