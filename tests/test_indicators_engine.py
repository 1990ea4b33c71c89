"""The indicator engine end to end on canonical series, driven by a fake monotonic clock.

Scenarios are the seed document's worked examples.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.indicators import IndicatorConfig
from exporter.map.schema import load_schema
from tests.engine_frames import TextEngine

DEV = ("nvidia", "0", "GPU-8f3a")
DEV2 = ("amd", "1", "")
POLL = 0.1

CAUSES = {"memory_pressure", "bandwidth_saturation", "coherency", "thermal_throttle", "power_throttle"}


# per-process evidence: two active clients on the GPU
TWO = {'gpu_process_utilization_percent{pid="101",process="train"}': 45.0,
       'gpu_process_utilization_percent{pid="202",process="infer"}': 40.0}
ONE = {'gpu_process_utilization_percent{pid="101",process="train"}': 90.0}
# fast baselines for tests: 1 s bins, warm after 5 bins, 1 s persistence
FAST = {"bin_seconds": 1.0, "warmup_bins": 5, "persistence_seconds": 1.0, "compare_seconds": 0.5}


def cfg(**sections) -> IndicatorConfig:
    return IndicatorConfig.model_validate(sections)


def one(out, name, **labels) -> float:
    hits = [v for n, lab, v in out if n == name and all(lab.get(k) == x for k, x in labels.items())]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


def absent(out, name) -> bool:
    return not [1 for n, _, _ in out if n == name]


def cause_info(out) -> str:
    (cause,) = [lab["cause"] for n, lab, _ in out if n == "gpu_contention_cause_info"]
    return cause


def run(engine, t0, seconds, series, dev=DEV):
    """Feed the same series every POLL for ``seconds``; return (last time, last output)."""
    steps = round(seconds / POLL)
    out: list = []
    t = t0
    for i in range(1, steps + 1):
        t = t0 + i * POLL
        out = engine.update(t, {dev: series(i) if callable(series) else series})
    return t, out


# ------------------------------------------------------------------------------ contention


def test_three_second_episode_between_15s_scrapes_is_visible_in_the_counter():
    engine = TextEngine(cfg(), None, POLL)
    engine.set_device_info(DEV, model="NVIDIA H100 80GB HBM3", vendor="nvidia")
    healthy = {"gpu_memory_bandwidth_utilization_percent": 60.0, "gpu_compute_occupancy_percent": 70.0}
    contended = {"gpu_memory_bandwidth_utilization_percent": 92.0, "gpu_compute_occupancy_percent": 35.0,
                 **TWO}
    scrapes = {}
    t = 0.0
    out = engine.update(t, {DEV: healthy})
    scrapes[0] = out
    # polls at 0.1 .. 15.0; contended for the polls in (5, 8]
    for i in range(1, 151):
        t = i * POLL
        out = engine.update(t, {DEV: contended if 50 < i <= 80 else healthy})
    scrapes[15] = out
    # the gauge is 0 at both scrapes: the episode is invisible to a 15 s scrape of the gauge
    assert one(scrapes[0], "gpu_memory_contention", basis="occupancy") == 0.0
    assert one(scrapes[15], "gpu_memory_contention", basis="occupancy") == 0.0
    # but the counter grew by 3 s: rate over the scrape window = 0.2
    before = one(scrapes[0], "gpu_memory_contention_seconds_total", basis="occupancy")
    after = one(scrapes[15], "gpu_memory_contention_seconds_total", basis="occupancy")
    assert before == 0.0
    assert after == pytest.approx(3.0)


def test_contention_cost_counts_only_contended_time():
    prices = {"prices": [{"vendor": "nvidia", "model": "*H100*", "dollars_per_hour": 2.0}]}
    # no client hold-over: the second tenant's last 3 s would count (tested on its own)
    engine = TextEngine(cfg(cost=prices, state={"client_holdover_seconds": 0}), None, POLL)
    engine.set_device_info(DEV, model="NVIDIA H100 80GB HBM3", vendor="nvidia")
    alone = {"gpu_memory_bandwidth_utilization_percent": 92.0, "gpu_compute_occupancy_percent": 40.0, **ONE}
    contended = {"gpu_memory_bandwidth_utilization_percent": 92.0, "gpu_compute_occupancy_percent": 30.0, **TWO}
    healthy = {"gpu_memory_bandwidth_utilization_percent": 92.0, "gpu_compute_occupancy_percent": 80.0, **ONE}
    t, out = run(engine, 0.0, 60.0, alone)  # memory-bound alone: no cost, reference 40 %
    assert one(out, "gpu_memory_state", state="memory_bound") == 1.0
    assert one(out, "gpu_contention_cost_dollars_total") == 0.0
    assert one(out, "gpu_memory_bound_reference_percent", basis="occupancy") == pytest.approx(40.0)
    t, out = run(engine, t, 36.0, contended)
    assert one(out, "gpu_contention_slowdown_ratio") == pytest.approx(0.25)  # 1 - 30/40
    t, out = run(engine, t, 10.0, healthy)
    assert one(out, "gpu_price_dollars_per_hour") == 2.0
    assert one(out, "gpu_contention_slowdown_ratio") == 0.0
    assert one(out, "gpu_memory_contention_seconds_total", basis="occupancy") == pytest.approx(36.0)
    # seed: (baseline time - actual time) x price = 25 % of 36 s at $2/hour
    assert one(out, "gpu_contention_cost_dollars_total") == pytest.approx(2.0 * 0.25 * 36 / 3600)


def test_surcharge_per_ten_percent_of_loss():
    prices = {"prices": [{"dollars_per_hour": 4.0}], "surcharge_dollars": 0.20}
    engine = TextEngine(cfg(cost=prices), None, POLL)
    engine.set_device_info(DEV, model="x")
    alone = {"gpu_memory_bandwidth_utilization_percent": 92.0, "gpu_compute_occupancy_percent": 40.0, **ONE}
    t, _ = run(engine, 0.0, 60.0, alone)
    _, out = run(engine, t, 3600.0, {"gpu_memory_bandwidth_utilization_percent": 95.0,
                                     "gpu_compute_occupancy_percent": 30.0, **TWO})
    # one hour at 25 % loss: $4 x 0.25 + $0.20 x 2 full steps of 10 %
    assert one(out, "gpu_contention_cost_dollars_total") == pytest.approx(1.0 + 0.4, rel=1e-6)


def test_busiest_process_names_the_workload_of_last_resort():
    engine = TextEngine(cfg(), None, POLL)
    out = engine.update(1.0, {DEV: {"gpu_compute_utilization_percent": 90.0, **TWO,
                                    'gpu_process_utilization_percent{pid="other",process="other"}': 99.0}})
    assert one(out, "gpu_top_process_info", process="train") == 1.0
    assert one(out, "gpu_active_clients") == 3.0
    # the other two missing from one poll while "train" goes on: held over client_holdover_seconds
    # (3 s), since they were seen busy together with it (issue 36: a gap in a co-tenancy)
    gap = {"gpu_compute_utilization_percent": 90.0, **ONE}
    out = engine.update(1.1, {DEV: gap})
    assert one(out, "gpu_active_clients") == 3.0
    idle_list = {"gpu_compute_utilization_percent": 90.0, 'gpu_process_utilization_percent{pid="7",process="x"}': 1.0}
    out = engine.update(1.2, {DEV: idle_list})
    assert one(out, "gpu_active_clients") == 0.0  # nobody busy: no gap to bridge
    assert absent(out, "gpu_top_process_info")


def test_throughput_drop_without_process_data_is_contended_then_unconfirmed():
    """GPM only: a second tenant (or a new job) halves occupancy.  Contended after the
    persistence window; after drop_confirm_seconds without per-process data, unknown."""
    engine = TextEngine(cfg(state={"drop_confirm_seconds": 60.0}), None, POLL)
    alone = {"gpu_compute_utilization_percent": 99.0, "gpu_memory_bandwidth_utilization_percent": 92.0,
             "gpu_compute_occupancy_percent": 40.0}
    t, out = run(engine, 0.0, 20.0, alone)
    assert one(out, "gpu_memory_state_info", state="unknown", reason="reference_warming") == 1.0
    t, out = run(engine, t, 20.0, alone)
    # a reference learned without process data is no proof the GPU is alone: no verdict
    assert one(out, "gpu_memory_state_info", state="unknown", reason="no_process_data") == 1.0
    squeezed = {**alone, "gpu_memory_bandwidth_utilization_percent": 96.0, "gpu_compute_occupancy_percent": 24.0}
    t, out = run(engine, t, 5.0, squeezed)  # the 5 s median and 10 s persistence: not yet
    assert one(out, "gpu_memory_state", state="contended") == 0.0
    t, out = run(engine, t, 15.0, squeezed)
    assert one(out, "gpu_memory_state_info", state="contended", reason="throughput_drop") == 1.0
    assert one(out, "gpu_contention_slowdown_ratio") == pytest.approx(0.4)
    t, out = run(engine, t, 60.0, squeezed)
    assert one(out, "gpu_memory_state_info", state="unknown", reason="throughput_drop_unconfirmed") == 1.0
    # the reference never learned the squeezed level
    assert one(out, "gpu_memory_bound_reference_percent", basis="occupancy") == pytest.approx(40.0)
    # the neighbour leaves: the reference holds again (still no verdict without process data)
    _, out = run(engine, t, 15.0, alone)
    assert one(out, "gpu_memory_state_info", state="unknown", reason="no_process_data") == 1.0


def test_unpriced_gpu_has_no_cost_series():
    engine = TextEngine(cfg(), None, POLL)
    out = engine.update(1.0, {DEV: {"gpu_memory_bandwidth_utilization_percent": 92.0,
                                    "gpu_compute_occupancy_percent": 35.0}})
    assert absent(out, "gpu_price_dollars_per_hour")
    assert absent(out, "gpu_contention_cost_dollars_total")


def test_basis_falls_back_and_old_counter_keeps_going():
    engine = TextEngine(cfg(), None, POLL)
    t, out = run(engine, 0.0, 1.0, {"gpu_memory_bandwidth_utilization_percent": 95.0,
                                    "gpu_compute_occupancy_percent": 20.0, **TWO})
    assert one(out, "gpu_memory_contention", basis="occupancy") == 1.0
    # occupancy stops being reported: utilization is the basis now
    t, out = run(engine, t, 0.5, {"gpu_memory_bandwidth_utilization_percent": 95.0,
                                  "gpu_compute_utilization_percent": 40.0, **TWO})
    assert one(out, "gpu_memory_contention", basis="utilization") == 1.0
    assert absent([s for s in out if s[1].get("basis") == "occupancy" and s[0] == "gpu_memory_contention"],
                  "gpu_memory_contention")
    assert one(out, "gpu_memory_contention_seconds_total", basis="occupancy") == pytest.approx(1.0)
    assert one(out, "gpu_memory_contention_seconds_total", basis="utilization") == pytest.approx(0.5)


def test_a_stalled_poll_is_credited_at_most_two_intervals():
    engine = TextEngine(cfg(), None, POLL)
    s = {"gpu_memory_bandwidth_utilization_percent": 95.0, "gpu_compute_occupancy_percent": 20.0, **TWO}
    engine.update(0.0, {DEV: s})
    out = engine.update(5.0, {DEV: s})  # the daemon was stuck for 5 s
    assert one(out, "gpu_memory_contention_seconds_total", basis="occupancy") == pytest.approx(0.1 + 0.2)


def test_missing_inputs_mean_no_series_and_unknown_cause():
    engine = TextEngine(cfg(), None, POLL)
    out = engine.update(1.0, {DEV: {'gpu_temperature_celsius{sensor="gpu"}': 60.0}})
    assert sorted({n for n, _, _ in out}) == ["gpu_contention_cause_info", "gpu_contention_evidence_info",
                                               "gpu_memory_state", "gpu_memory_state_info"]
    assert one(out, "gpu_contention_evidence_info", evidence="none", reason="no_client_source") == 1.0
    assert one(out, "gpu_memory_state", state="unknown") == 1.0
    assert one(out, "gpu_memory_state_info", state="unknown", reason="no_load_signal") == 1.0
    assert cause_info(out) == "unknown"


def test_disabled_engine_returns_nothing():
    engine = TextEngine(cfg(enabled=False), None, POLL)
    assert engine.update(1.0, {DEV: {"gpu_memory_bandwidth_utilization_percent": 95.0}}) == []


def test_devices_are_independent_and_absent_devices_emit_nothing():
    engine = TextEngine(cfg(), None, POLL)
    out = engine.update(1.0, {
        DEV: {"gpu_memory_bandwidth_utilization_percent": 95.0, "gpu_compute_occupancy_percent": 20.0, **TWO},
        DEV2: {"gpu_memory_bandwidth_utilization_percent": 50.0, "gpu_compute_utilization_percent": 20.0},
    })
    assert sorted((n, tuple(sorted(lab.items())), v) for n, lab, v in out if n == "gpu_memory_contention") == [
        ("gpu_memory_contention", (("basis", "occupancy"),), 1.0),
        ("gpu_memory_contention", (("basis", "utilization"),), 0.0),
    ]
    out = engine.update(1.1, {DEV2: {"gpu_memory_bandwidth_utilization_percent": 50.0,
                                     "gpu_compute_utilization_percent": 20.0}})
    assert [lab.get("basis") for n, lab, _ in out if n == "gpu_memory_contention"] == ["utilization"]


# ----------------------------------------------------------------------------- variability


def test_variability_of_fast_samples_over_the_window():
    engine = TextEngine(cfg(variability={"recompute_seconds": 0}), None, POLL)
    # 120 s of 100 ms samples; only the last 60 s count: 85 % at 10, 15 % at 25 (seed's shape)
    def series(i):
        if i <= 600:
            return {"gpu_compute_utilization_percent": 99.0}
        return {"gpu_compute_utilization_percent": 25.0 if i % 20 < 3 else 10.0}
    _, out = run(engine, 0.0, 120.0, series)
    # the window at t=120 holds samples at t >= 60, i.e. i = 600 .. 1200: one 99 plus 600 new
    assert one(out, "gpu_metric_percentile", metric="utilization", percentile="50") == 10.0
    assert one(out, "gpu_metric_percentile", metric="utilization", percentile="95") == 25.0
    assert one(out, "gpu_metric_heavy_tail", metric="utilization") == 1.0
    assert one(out, "gpu_metric_cov", metric="utilization") > 0.4
    assert absent([s for s in out if s[1].get("metric") == "bandwidth"], "gpu_metric_cov")


def test_clean_signal_is_not_flagged():
    engine = TextEngine(cfg(variability={"recompute_seconds": 0}), None, POLL)
    _, out = run(engine, 0.0, 60.0, lambda i: {"gpu_memory_bandwidth_gbps": 1800.0 + (10 if i % 2 else -10)})
    assert one(out, "gpu_metric_cov", metric="bandwidth") == pytest.approx(10 / 1800)
    assert one(out, "gpu_metric_heavy_tail", metric="bandwidth") == 0.0


def test_heavy_tail_flag_needs_a_busy_gpu():
    """An idle GPU's noise (0 % with 2 % blips: CoV above 2, a tail with no body) has the heavy-tail
    shape without meaning anything: the flag stays 0 while the GPU is idle, is raised once the same
    shape comes from a busy GPU, and drops at once when the GPU goes idle again (issue 27)."""
    engine = TextEngine(cfg(variability={"recompute_seconds": 5.0}), None, POLL)
    t, out = run(engine, 0.0, 60.0, lambda i: {"gpu_compute_utilization_percent": 2.0 if i % 20 < 3 else 0.0})
    assert one(out, "gpu_memory_state", state="idle") == 1.0
    assert one(out, "gpu_metric_cov", metric="utilization") > 2.0
    assert one(out, "gpu_metric_heavy_tail", metric="utilization") == 0.0
    t, out = run(engine, t, 60.0, lambda i: {"gpu_compute_utilization_percent": 25.0 if i % 20 < 3 else 10.0})
    assert one(out, "gpu_memory_state", state="idle") == 0.0
    assert one(out, "gpu_metric_heavy_tail", metric="utilization") == 1.0
    # idle again: within one poll, not at the next recompute 5 s later
    out = engine.update(t + POLL, {DEV: {"gpu_compute_utilization_percent": 0.0}})
    assert one(out, "gpu_metric_heavy_tail", metric="utilization") == 0.0


def test_statistics_are_recomputed_at_the_configured_cadence():
    engine = TextEngine(cfg(variability={"recompute_seconds": 1.0}), None, POLL)
    run(engine, 0.0, 2.0, {"gpu_compute_utilization_percent": 50.0})
    # 2.05 s: last recompute at 2.0 s, the new value is not in the statistics yet
    out = engine.update(2.05, {DEV: {"gpu_compute_utilization_percent": 100.0}})
    assert one(out, "gpu_metric_percentile", metric="utilization", percentile="99") == 50.0
    out = engine.update(3.0, {DEV: {"gpu_compute_utilization_percent": 100.0}})
    assert one(out, "gpu_metric_percentile", metric="utilization", percentile="99") == 100.0


# ---------------------------------------------------------------------- baseline deviation


def test_seed_bandwidth_drop_from_1800_to_1100_at_95_percent_utilization():
    engine = TextEngine(cfg(baseline=FAST), None, POLL)
    loaded = lambda bw: lambda i: {  # noqa: E731
        "gpu_compute_utilization_percent": 95.0,
        "gpu_memory_bandwidth_gbps": bw + (30.0 if (i // 20) % 2 else -30.0),
    }
    t, out = run(engine, 0.0, 4.9, loaded(1800.0))  # 4 bins: still warming up
    assert absent(out, "gpu_baseline_deviation")
    assert absent(out, "gpu_bandwidth_drop_under_load")
    t, out = run(engine, t, 20.0, loaded(1800.0))
    assert one(out, "gpu_baseline_mean", metric="bandwidth") == pytest.approx(1800.0, abs=30.5)
    # robust spread of the bin medians (1.4826 x MAD), at most the spread of the samples
    assert one(out, "gpu_baseline_stddev", metric="bandwidth") <= 30 * 1.4826 + 0.01
    assert one(out, "gpu_baseline_deviation", metric="bandwidth") == 0.0
    assert one(out, "gpu_bandwidth_drop_under_load") == 0.0
    drop = {"gpu_compute_utilization_percent": 95.0, "gpu_memory_bandwidth_gbps": 1100.0}
    t, out = run(engine, t, 0.5, drop)  # a single half second: persistence not reached
    assert one(out, "gpu_baseline_zscore", metric="bandwidth") < -7  # sigma floored at 5 % of 1800
    assert one(out, "gpu_baseline_deviation", metric="bandwidth") == 0.0
    t, out = run(engine, t, 1.5, drop)
    assert one(out, "gpu_baseline_deviation", metric="bandwidth") == 1.0
    assert one(out, "gpu_bandwidth_drop_under_load") == 1.0
    # deviating without an attributable cause (no miss rate, no throttle reasons)
    assert cause_info(out) == "unknown"
    # the drop is not learned: the baseline stays at 1800 however long it lasts
    t, out = run(engine, t, 30.0, drop)
    assert one(out, "gpu_baseline_mean", metric="bandwidth") == pytest.approx(1800.0, abs=30.5)
    assert one(out, "gpu_baseline_deviation", metric="bandwidth") == 1.0


def test_idle_gpu_is_not_a_deviation_and_does_not_teach_the_baseline():
    engine = TextEngine(cfg(baseline=FAST), None, POLL)
    t, _ = run(engine, 0.0, 5.0, {"gpu_compute_utilization_percent": 95.0, "gpu_memory_bandwidth_gbps": 1800.0})
    learned = engine.baseline(DEV, "bandwidth").learned_seconds
    t, out = run(engine, t, 5.0, {"gpu_compute_utilization_percent": 3.0, "gpu_memory_bandwidth_gbps": 5.0})
    assert one(out, "gpu_baseline_deviation", metric="bandwidth") == 0.0
    assert absent(out, "gpu_baseline_zscore")
    assert one(out, "gpu_bandwidth_drop_under_load") == 0.0
    assert one(out, "gpu_baseline_mean", metric="bandwidth") == pytest.approx(1800.0)
    assert engine.baseline(DEV, "bandwidth").learned_seconds == pytest.approx(learned)
    assert one(out, "gpu_memory_state", state="idle") == 1.0
    assert cause_info(out) == "none"


def test_bandwidth_utilization_is_the_baseline_where_no_gbps_is_reported():
    engine = TextEngine(cfg(baseline=FAST), None, POLL)
    t, _ = run(engine, 0.0, 6.0, {"gpu_compute_utilization_percent": 95.0,
                                  "gpu_memory_bandwidth_utilization_percent": 90.0, **ONE})
    _, out = run(engine, t, 1.0, {"gpu_compute_utilization_percent": 95.0,
                                  "gpu_memory_bandwidth_utilization_percent": 55.0, **ONE})
    assert one(out, "gpu_baseline_mean", metric="bandwidth_utilization") == pytest.approx(90.0)
    assert one(out, "gpu_bandwidth_drop_under_load") == 1.0  # 55 <= 0.7 x 90
    assert absent([s for s in out if s[1].get("metric") == "bandwidth"], "gpu_baseline_mean")


# ------------------------------------------------------------------------------ root cause


def test_seed_multi_tenant_case_is_memory_pressure():
    """1500 + 1400 GB/s isolated, 1700 GB/s combined, L2 miss 8 % -> 35 %, controller at 65 %."""
    engine = TextEngine(cfg(baseline=FAST), None, POLL)
    isolated = lambda i: {  # noqa: E731  model A and model B alternate, each alone on the GPU
        "gpu_compute_utilization_percent": 95.0,
        "gpu_compute_occupancy_percent": 60.0,
        "gpu_memory_bandwidth_gbps": 1500.0 if (i // 3) % 2 == 0 else 1400.0,
        "gpu_memory_bandwidth_utilization_percent": 57.0,
        "gpu_l2_cache_miss_rate_percent": 8.0,
    }
    t, out = run(engine, 0.0, 30.0, isolated)
    assert one(out, "gpu_contention_cause", cause="memory_pressure") == 0.0
    assert cause_info(out) == "none"
    combined = {
        "gpu_compute_utilization_percent": 95.0,
        "gpu_compute_occupancy_percent": 60.0,
        "gpu_memory_bandwidth_gbps": 1700.0,
        "gpu_memory_bandwidth_utilization_percent": 65.0,
        "gpu_l2_cache_miss_rate_percent": 35.0,
    }
    t, out = run(engine, t, 1.0, combined)
    assert one(out, "gpu_contention_cause", cause="memory_pressure") == 1.0
    # the rise was not learned: 8 % is still the miss-rate baseline
    assert engine.baseline(DEV, "l2_miss_rate").stats()[0] == pytest.approx(8.0)
    # the cause is named once the GPU is in trouble: here the second tenant shows up in the
    # process list while the memory-bound signature holds
    t, out = run(engine, t, 1.0, {**combined, "gpu_memory_bandwidth_utilization_percent": 88.0,
                                  "gpu_compute_occupancy_percent": 35.0, **TWO})
    assert one(out, "gpu_memory_state", state="contended") == 1.0
    assert one(out, "gpu_contention_cause", cause="memory_pressure") == 1.0
    assert one(out, "gpu_contention_cause", cause="bandwidth_saturation") == 0.0
    assert cause_info(out) == "memory_pressure"
    # causes whose inputs the GPU does not report have no series
    assert {lab["cause"] for n, lab, _ in out if n == "gpu_contention_cause"} == {
        "memory_pressure", "bandwidth_saturation"}


def test_seed_two_dense_kernels_on_a_2tb_part_are_bandwidth_saturation():
    engine = TextEngine(cfg(), None, POLL)
    peak = 2000.0
    demand = 1900.0 + 1900.0
    achieved = min(demand, peak)
    _, out = run(engine, 0.0, 1.0, {
        "gpu_compute_utilization_percent": 99.0,
        "gpu_compute_occupancy_percent": 45.0,  # kernels stall on the memory controller
        "gpu_memory_bandwidth_gbps": achieved,
        "gpu_memory_bandwidth_utilization_percent": achieved / peak * 100,
        "gpu_l2_cache_miss_rate_percent": 6.0,  # dense, contiguous: cache-friendly
        **TWO,
    })
    assert one(out, "gpu_memory_contention", basis="occupancy") == 1.0
    assert one(out, "gpu_contention_cause", cause="bandwidth_saturation") == 1.0
    assert one(out, "gpu_contention_cause", cause="memory_pressure") == 0.0
    assert cause_info(out) == "bandwidth_saturation"


def test_throttle_reasons_from_canonical_series():
    engine = TextEngine(cfg(), None, POLL)
    out = engine.update(1.0, {DEV: {
        "gpu_memory_bandwidth_utilization_percent": 92.0,
        "gpu_compute_occupancy_percent": 30.0,
        'gpu_throttle_active{reason="hw_thermal"}': 1.0,
        'gpu_throttle_active{reason="sw_thermal"}': 0.0,
        'gpu_throttle_active{reason="sw_power_cap"}': 0.0,
        'gpu_throttle_active{reason="idle"}': 0.0,
    }})
    assert one(out, "gpu_contention_cause", cause="thermal_throttle") == 1.0
    assert one(out, "gpu_contention_cause", cause="power_throttle") == 0.0
    assert cause_info(out) == "thermal_throttle"


def test_coherency_from_interconnect_counters():
    """Seed: peer-to-peer throughput 150 -> 95 GB/s while the links stay busy."""
    engine = TextEngine(cfg(baseline=FAST), None, POLL)
    counters = {"tx": 0.0, "rx": 0.0}

    def links(rate_gbps: float, util: float):
        def series(i):
            # counters refresh once a second (slower than the fast poll), half tx half rx
            if i % 10 == 0:
                counters["tx"] += rate_gbps * 1e9 / 2
                counters["rx"] += rate_gbps * 1e9 / 2
            return {
                'gpu_interconnect_bytes_total{interconnect="nvlink",direction="tx",link="0"}': counters["tx"],
                'gpu_interconnect_bytes_total{interconnect="nvlink",direction="rx",link="0"}': counters["rx"],
                'gpu_interconnect_utilization_percent{interconnect="nvlink",link="0"}': util,
            }
        return series

    t, out = run(engine, 0.0, 30.0, links(150.0, 90.0))
    assert engine.baseline(DEV, "interconnect_throughput").stats()[0] == pytest.approx(150e9, rel=1e-9)
    assert one(out, "gpu_contention_cause", cause="coherency") == 0.0
    t, out = run(engine, t, 12.0, links(95.0, 90.0))
    assert one(out, "gpu_contention_cause", cause="coherency") == 1.0
    assert cause_info(out) == "unknown"  # no load signal at all: the state is unknown
    # links quiet again: not coherency
    _, out = run(engine, t, 12.0, links(20.0, 15.0))
    assert one(out, "gpu_contention_cause", cause="coherency") == 0.0


def test_every_emitted_name_and_label_is_in_the_canonical_schema():
    schema = load_schema(Path(__file__).resolve().parent.parent / "mappings" / "canonical.yaml").metrics
    prices = {"prices": [{"dollars_per_hour": 1.0}]}
    engine = TextEngine(cfg(cost=prices, baseline={**FAST, "long_bin_bins": 2, "long_warmup_bins": 1},
                                 state={"reference_bin_seconds": 1.0}), None, POLL)
    engine.set_device_info(DEV, model="x")
    seen: dict[str, set[str]] = {}
    for i in range(300):
        for n, lab, _ in engine.update(i * POLL, {DEV: {
            "gpu_memory_bandwidth_utilization_percent": 90.0,
            "gpu_compute_occupancy_percent": 60.0 if i < 100 else 30.0,
            "gpu_compute_utilization_percent": 95.0, "gpu_memory_bandwidth_gbps": 1800.0 - i,
            "gpu_l2_cache_miss_rate_percent": 10.0, 'gpu_throttle_active{reason="power_cap"}': 0.0,
            **(ONE if i < 200 else TWO),
        }}):
            seen.setdefault(n, set()).update(lab)
    assert set(seen) == {
        "gpu_memory_contention", "gpu_memory_contention_seconds_total", "gpu_metric_cov",
        "gpu_metric_percentile", "gpu_metric_heavy_tail", "gpu_baseline_mean", "gpu_baseline_stddev",
        "gpu_baseline_zscore", "gpu_baseline_deviation", "gpu_bandwidth_drop_under_load",
        "gpu_contention_cause", "gpu_contention_cause_info", "gpu_price_dollars_per_hour",
        "gpu_contention_cost_dollars_total", "gpu_memory_state", "gpu_memory_state_info",
        "gpu_active_clients", "gpu_contention_slowdown_ratio", "gpu_baseline_long_mean",
        "gpu_top_process_info", "gpu_memory_bound_reference_percent", "gpu_contention_evidence_info",
        "gpu_baseline_relearned_total",  # 0 once the baseline is warm
    }
    for name, labels in seen.items():
        assert name in schema, name
        assert labels == set(schema[name].labels), name
        assert name.endswith("_total") == (schema[name].type == "counter")
    assert schema["gpu_contention_cause_info"].type == "info"
    assert all(cause in schema["gpu_contention_cause"].help for cause in CAUSES)


# ------------------------------------------------------------------------ client hold-over


def _flicker_states(client_interval: float | None) -> list[str]:
    """60 s of time-sliced saturation as the engine sees it at 0.5 s fast updates when the client
    count comes from a source polled every 5 s: each full poll's process list stays in place for
    5 s, and one poll in six lists only one of the two tenants."""
    engine = TextEngine(cfg(), None, 0.5)
    states = []
    for k in range(120):
        poll = k // 10  # a full poll every 10 fast updates
        clients = dict(TWO) if poll % 6 != 5 else dict(ONE)
        out = engine.update(k * 0.5, {DEV: {
            "gpu_memory_bandwidth_utilization_percent": 95.0, "gpu_compute_occupancy_percent": 25.0,
            "gpu_compute_utilization_percent": 99.0, **clients}},
            None if client_interval is None else {DEV: client_interval})
        states.append(next(lab["state"] for n, lab, v in out if n == "gpu_memory_state" and v == 1.0))
    return states


def test_one_poll_in_six_missing_a_tenant_at_a_5_s_poll_interval_does_not_flip_the_state():
    """The hold-over is at least two poll intervals of the source that counted the clients: a
    tenant missing from one 5 s poll is still held (10 s); with the fixed 3 s alone (no interval
    known, the behaviour before) the same flicker reads memory_bound for 2 s of every 30."""
    assert set(_flicker_states(5.0)) == {"contended"}
    assert "memory_bound" in _flicker_states(None)


def test_the_feed_hands_the_engine_the_interval_of_the_source_counting_the_clients():
    from exporter.map.store import SourceState, Store
    from exporter.model import SourceStats
    from exporter.run.feed import IndicatorFeed

    feed = IndicatorFeed(cfg(), None, 0.5)
    seen: list = []
    real_update = feed.engine.update
    feed.engine.update = lambda now, frames, intervals=None: seen.append(dict(intervals or {})) or \
        real_update(now, frames, intervals)
    store = Store()
    counting = SourceState("nvml", interval=5.0, stats=SourceStats(up=True, state="up"))
    other = SourceState("amdgpu", interval=15.0, stats=SourceStats(up=True, state="up"))  # reports the GPU, counts nothing
    counting.frames = {DEV: {("gpu_client_evidence", (("evidence", "nvml"), ("reason", ""))): 1.0,
                             ("gpu_memory_bandwidth_utilization_percent", ()): 90.0}}
    other.frames = {DEV: {("gpu_compute_utilization_percent", ()): 99.0},
                    DEV2: {("gpu_compute_utilization_percent", ()): 99.0}}
    store.add(counting)
    store.add(other)
    feed.advance(1.0, store)
    assert seen[-1] == {DEV: 5.0}


# ------------------------------------------------ hold-over without phantoms (issue 36)
SAT = {"gpu_memory_bandwidth_utilization_percent": 95.0, "gpu_compute_occupancy_percent": 25.0,
       "gpu_compute_utilization_percent": 99.0}


def _timeline(clients_at, seconds: float, step: float = 0.5, price: bool = False):
    """The engine over ``seconds`` at ``step`` updates, the busy clients at each time given by
    ``clients_at(t)``; (states, contended seconds, cost) at the end."""
    # $3600 per hour: $1 per contended second at the default slowdown 0.5 (no reference warms)
    costs = {"prices": [{"dollars_per_hour": 3600.0}], "default_slowdown": 0.5} if price else {}
    engine = TextEngine(cfg(cost=costs, state={"reference_warmup_bins": 100000}), None, step)
    engine.set_device_info(DEV, model="x")
    states, out = [], []
    for k in range(int(seconds / step) + 1):
        t = k * step
        procs = {f'gpu_process_utilization_percent{{pid="{pid}",process="p{pid}"}}': 60.0 for pid in clients_at(t)}
        out = engine.update(t, {DEV: {**SAT, **procs}})
        states.append(next(lab["state"] for n, lab, v in out if n == "gpu_memory_state" and v == 1.0))
    secs = sum(v for n, _, v in out if n == "gpu_memory_contention_seconds_total")
    cost = sum(v for n, _, v in out if n == "gpu_contention_cost_dollars_total")
    return states, secs, cost


def test_sequential_jobs_are_never_co_tenants():
    """A runner that starts a fresh process per task, never two at once (a new pid every 4 s):
    before, the 3 s hold-over kept the finished pid as a client of its successor (contended)."""
    states, secs, _ = _timeline(lambda t: [str(1000 + int(t // 4))], 120.0)
    assert set(states[2:]) == {"memory_bound"}, set(states)
    assert secs == 0.0


@pytest.mark.parametrize("episode", [10.0, 20.0, 40.0])
def test_contended_seconds_and_cost_follow_the_episode_actually_seen(episode):
    """A neighbour for ``episode`` seconds beside a memory-bound job: the contended-seconds
    counter within 5 % of the episode (before: +3 s of hold-over after it, +30 % on 10 s), the
    cost booked for the same seconds; the state may read contended during the hold-over, but no
    second of it is booked."""
    start = 20.0
    states, secs, cost = _timeline(lambda t: ["1"] + (["2"] if start <= t < start + episode else []),
                                   start + episode + 20.0, price=True)
    assert abs(secs - episode) <= 0.05 * episode, secs
    assert cost == pytest.approx(0.5 * secs, rel=1e-6)
    assert states[-1] == "memory_bound"


def test_flicker_seconds_are_booked_once_the_tenant_is_seen_again():
    """The second tenant missing from one poll in six (as in the detection case): the state
    stays contended throughout and every second of it is booked (held-over seconds confirmed)."""
    states, secs, _ = _timeline(lambda t: ["1"] + (["2"] if int(t) % 6 != 5 else []), 60.0)
    assert set(states) == {"contended"}
    assert secs == pytest.approx(60.0, abs=0.6)


# ------------------------------------------------ slowdown n/a (issue 39)
@pytest.mark.parametrize("default_slowdown", [0.0, 0.5])
def test_contended_without_a_reference_has_no_slowdown_and_books_nothing_unless_one_is_assumed(default_slowdown):
    """An AMD GPU (utilization basis: no compute-starvation signal, so no memory-bound reference)
    contended by two clients: nothing sizes the slowdown, so gpu_contention_slowdown_ratio is
    absent and no dollar is booked (before: "slowdown 0", $0 booked as if contention were free);
    with indicators.cost.default_slowdown set, that assumption sizes both."""
    costs = {"prices": [{"dollars_per_hour": 3600.0}], "default_slowdown": default_slowdown}
    engine = TextEngine(cfg(cost=costs), None, POLL)
    engine.set_device_info(DEV, model="AMD Instinct MI300X", vendor="amd")
    frame = {"gpu_memory_bandwidth_utilization_percent": 95.0, "gpu_compute_utilization_percent": 99.0, **TWO}
    t, out = run(engine, 0.0, 30.0, frame)
    assert one(out, "gpu_memory_state", state="contended") == 1.0
    assert absent(out, "gpu_memory_bound_reference_percent")
    if default_slowdown:
        assert one(out, "gpu_contention_slowdown_ratio") == 0.5
        assert one(out, "gpu_contention_cost_dollars_total") > 0
    else:
        assert absent(out, "gpu_contention_slowdown_ratio")
        assert one(out, "gpu_contention_cost_dollars_total") == 0.0
    assert sum(v for n, _, v in out if n == "gpu_memory_contention_seconds_total") > 20  # the seconds still count
