"""The indicator engine end to end on canonical series, driven by a fake monotonic clock.

Scenarios are the seed document's worked examples.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.indicators import IndicatorConfig, IndicatorEngine
from exporter.schema import load_schema

DEV = ("nvidia", "0", "GPU-8f3a")
DEV2 = ("amd", "1", "")
POLL = 0.1

CAUSES = {"memory_pressure", "bandwidth_saturation", "coherency", "thermal_throttle", "power_throttle"}


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
    engine = IndicatorEngine(cfg(), None, POLL)
    engine.set_device_info(DEV, model="NVIDIA H100 80GB HBM3", vendor="nvidia")
    healthy = {"gpu_memory_bandwidth_utilization_percent": 60.0, "gpu_compute_occupancy_percent": 70.0}
    contended = {"gpu_memory_bandwidth_utilization_percent": 92.0, "gpu_compute_occupancy_percent": 35.0}
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
    engine = IndicatorEngine(cfg(cost=prices), None, POLL)
    engine.set_device_info(DEV, model="NVIDIA H100 80GB HBM3", vendor="nvidia")
    contended = {"gpu_memory_bandwidth_utilization_percent": 92.0, "gpu_compute_occupancy_percent": 35.0}
    healthy = {"gpu_memory_bandwidth_utilization_percent": 92.0, "gpu_compute_occupancy_percent": 80.0}
    t, _ = run(engine, 0.0, 36.0, contended)
    t, out = run(engine, t, 10.0, healthy)
    assert one(out, "gpu_price_dollars_per_hour") == 2.0
    # 36 s contended (the first poll counts one interval) at $2/hour
    assert one(out, "gpu_memory_contention_seconds_total", basis="occupancy") == pytest.approx(36.0)
    assert one(out, "gpu_contention_cost_dollars_total") == pytest.approx(2.0 * 36 / 3600)


def test_unpriced_gpu_has_no_cost_series():
    engine = IndicatorEngine(cfg(), None, POLL)
    out = engine.update(1.0, {DEV: {"gpu_memory_bandwidth_utilization_percent": 92.0,
                                    "gpu_compute_occupancy_percent": 35.0}})
    assert absent(out, "gpu_price_dollars_per_hour")
    assert absent(out, "gpu_contention_cost_dollars_total")


def test_basis_falls_back_and_old_counter_keeps_going():
    engine = IndicatorEngine(cfg(), None, POLL)
    t, out = run(engine, 0.0, 1.0, {"gpu_memory_bandwidth_utilization_percent": 95.0,
                                    "gpu_compute_occupancy_percent": 20.0})
    assert one(out, "gpu_memory_contention", basis="occupancy") == 1.0
    # occupancy stops being reported: utilization is the basis now
    t, out = run(engine, t, 0.5, {"gpu_memory_bandwidth_utilization_percent": 95.0,
                                  "gpu_compute_utilization_percent": 40.0})
    assert one(out, "gpu_memory_contention", basis="utilization") == 1.0
    assert absent([s for s in out if s[1].get("basis") == "occupancy" and s[0] == "gpu_memory_contention"],
                  "gpu_memory_contention")
    assert one(out, "gpu_memory_contention_seconds_total", basis="occupancy") == pytest.approx(1.0)
    assert one(out, "gpu_memory_contention_seconds_total", basis="utilization") == pytest.approx(0.5)


def test_a_stalled_poll_is_credited_at_most_two_intervals():
    engine = IndicatorEngine(cfg(), None, POLL)
    s = {"gpu_memory_bandwidth_utilization_percent": 95.0, "gpu_compute_occupancy_percent": 20.0}
    engine.update(0.0, {DEV: s})
    out = engine.update(5.0, {DEV: s})  # the daemon was stuck for 5 s
    assert one(out, "gpu_memory_contention_seconds_total", basis="occupancy") == pytest.approx(0.1 + 0.2)


def test_missing_inputs_mean_no_series_and_unknown_cause():
    engine = IndicatorEngine(cfg(), None, POLL)
    out = engine.update(1.0, {DEV: {'gpu_temperature_celsius{sensor="gpu"}': 60.0}})
    assert [n for n, _, _ in out] == ["gpu_contention_cause_info"]
    assert cause_info(out) == "unknown"


def test_disabled_engine_returns_nothing():
    engine = IndicatorEngine(cfg(enabled=False), None, POLL)
    assert engine.update(1.0, {DEV: {"gpu_memory_bandwidth_utilization_percent": 95.0}}) == []


def test_devices_are_independent_and_absent_devices_emit_nothing():
    engine = IndicatorEngine(cfg(), None, POLL)
    out = engine.update(1.0, {
        DEV: {"gpu_memory_bandwidth_utilization_percent": 95.0, "gpu_compute_occupancy_percent": 20.0},
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
    engine = IndicatorEngine(cfg(variability={"recompute_seconds": 0}), None, POLL)
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
    engine = IndicatorEngine(cfg(variability={"recompute_seconds": 0}), None, POLL)
    _, out = run(engine, 0.0, 60.0, lambda i: {"gpu_memory_bandwidth_gbps": 1800.0 + (10 if i % 2 else -10)})
    assert one(out, "gpu_metric_cov", metric="bandwidth") == pytest.approx(10 / 1800)
    assert one(out, "gpu_metric_heavy_tail", metric="bandwidth") == 0.0


def test_statistics_are_recomputed_at_the_configured_cadence():
    engine = IndicatorEngine(cfg(variability={"recompute_seconds": 1.0}), None, POLL)
    run(engine, 0.0, 2.0, {"gpu_compute_utilization_percent": 50.0})
    # 2.05 s: last recompute at 2.0 s, the new value is not in the statistics yet
    out = engine.update(2.05, {DEV: {"gpu_compute_utilization_percent": 100.0}})
    assert one(out, "gpu_metric_percentile", metric="utilization", percentile="99") == 50.0
    out = engine.update(3.0, {DEV: {"gpu_compute_utilization_percent": 100.0}})
    assert one(out, "gpu_metric_percentile", metric="utilization", percentile="99") == 100.0


# ---------------------------------------------------------------------- baseline deviation


def test_seed_bandwidth_drop_from_1800_to_1100_at_95_percent_utilization():
    engine = IndicatorEngine(cfg(baseline={"warmup_samples": 300}), None, POLL)
    loaded = lambda bw: lambda i: {  # noqa: E731
        "gpu_compute_utilization_percent": 95.0,
        "gpu_memory_bandwidth_gbps": bw + (30.0 if i % 2 else -30.0),
    }
    t, out = run(engine, 0.0, 29.9, loaded(1800.0))  # 299 samples: still warming up
    assert absent(out, "gpu_baseline_deviation")
    assert absent(out, "gpu_bandwidth_drop_under_load")
    t, out = run(engine, t, 30.0, loaded(1800.0))
    assert one(out, "gpu_baseline_mean", metric="bandwidth") == pytest.approx(1800.0, abs=0.5)
    assert one(out, "gpu_baseline_stddev", metric="bandwidth") == pytest.approx(30.0, abs=0.5)
    assert one(out, "gpu_baseline_deviation", metric="bandwidth") == 0.0
    assert one(out, "gpu_bandwidth_drop_under_load") == 0.0
    out = engine.update(t + POLL, {DEV: {"gpu_compute_utilization_percent": 95.0,
                                         "gpu_memory_bandwidth_gbps": 1100.0}})
    # z = (1100 - 1800) / 30 = -23.3
    assert one(out, "gpu_baseline_zscore", metric="bandwidth") == pytest.approx(-700 / 30, rel=0.01)
    assert one(out, "gpu_baseline_deviation", metric="bandwidth") == 1.0
    assert one(out, "gpu_bandwidth_drop_under_load") == 1.0
    # contended without an attributable cause (no miss rate, no throttle reasons)
    assert cause_info(out) == "unknown"


def test_idle_gpu_is_not_a_deviation_and_does_not_teach_the_baseline():
    engine = IndicatorEngine(cfg(baseline={"warmup_samples": 10}), None, POLL)
    t, _ = run(engine, 0.0, 5.0, {"gpu_compute_utilization_percent": 95.0, "gpu_memory_bandwidth_gbps": 1800.0})
    t, out = run(engine, t, 5.0, {"gpu_compute_utilization_percent": 3.0, "gpu_memory_bandwidth_gbps": 5.0})
    assert one(out, "gpu_baseline_deviation", metric="bandwidth") == 0.0
    assert absent(out, "gpu_baseline_zscore")
    assert one(out, "gpu_bandwidth_drop_under_load") == 0.0
    assert one(out, "gpu_baseline_mean", metric="bandwidth") == pytest.approx(1800.0)
    assert engine.baseline(DEV, "bandwidth").n == 50


def test_bandwidth_utilization_is_the_baseline_where_no_gbps_is_reported():
    engine = IndicatorEngine(cfg(baseline={"warmup_samples": 10}), None, POLL)
    t, _ = run(engine, 0.0, 2.0, {"gpu_compute_utilization_percent": 95.0,
                                  "gpu_memory_bandwidth_utilization_percent": 90.0})
    out = engine.update(t + POLL, {DEV: {"gpu_compute_utilization_percent": 95.0,
                                         "gpu_memory_bandwidth_utilization_percent": 55.0}})
    assert one(out, "gpu_baseline_mean", metric="bandwidth_utilization") == pytest.approx(90.0)
    assert one(out, "gpu_bandwidth_drop_under_load") == 1.0  # 55 <= 0.7 x 90
    assert absent([s for s in out if s[1].get("metric") == "bandwidth"], "gpu_baseline_mean")


# ------------------------------------------------------------------------------ root cause


def test_seed_multi_tenant_case_is_memory_pressure():
    """1500 + 1400 GB/s isolated, 1700 GB/s combined, L2 miss 8 % -> 35 %, controller at 65 %."""
    engine = IndicatorEngine(cfg(baseline={"warmup_samples": 100}), None, POLL)
    isolated = lambda i: {  # noqa: E731  model A and model B alternate, each alone on the GPU
        "gpu_compute_utilization_percent": 95.0,
        "gpu_compute_occupancy_percent": 60.0,
        "gpu_memory_bandwidth_gbps": 1500.0 if (i // 50) % 2 == 0 else 1400.0,
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
    _, out = run(engine, t, 1.0, combined)
    assert one(out, "gpu_contention_cause", cause="memory_pressure") == 1.0
    assert one(out, "gpu_contention_cause", cause="bandwidth_saturation") == 0.0
    assert cause_info(out) == "memory_pressure"
    # causes whose inputs the GPU does not report have no series
    assert {lab["cause"] for n, lab, _ in out if n == "gpu_contention_cause"} == {
        "memory_pressure", "bandwidth_saturation"}


def test_seed_two_dense_kernels_on_a_2tb_part_are_bandwidth_saturation():
    engine = IndicatorEngine(cfg(), None, POLL)
    peak = 2000.0
    demand = 1900.0 + 1900.0
    achieved = min(demand, peak)
    _, out = run(engine, 0.0, 1.0, {
        "gpu_compute_utilization_percent": 99.0,
        "gpu_compute_occupancy_percent": 45.0,  # kernels stall on the memory controller
        "gpu_memory_bandwidth_gbps": achieved,
        "gpu_memory_bandwidth_utilization_percent": achieved / peak * 100,
        "gpu_l2_cache_miss_rate_percent": 6.0,  # dense, contiguous: cache-friendly
    })
    assert one(out, "gpu_memory_contention", basis="occupancy") == 1.0
    assert one(out, "gpu_contention_cause", cause="bandwidth_saturation") == 1.0
    assert one(out, "gpu_contention_cause", cause="memory_pressure") == 0.0
    assert cause_info(out) == "bandwidth_saturation"


def test_throttle_reasons_from_canonical_series():
    engine = IndicatorEngine(cfg(), None, POLL)
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
    engine = IndicatorEngine(cfg(baseline={"warmup_samples": 100}), None, POLL)
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
    assert engine.baseline(DEV, "interconnect_throughput").mean == pytest.approx(150e9, rel=1e-9)
    assert one(out, "gpu_contention_cause", cause="coherency") == 0.0
    t, out = run(engine, t, 12.0, links(95.0, 90.0))
    assert one(out, "gpu_contention_cause", cause="coherency") == 1.0
    assert cause_info(out) == "coherency"
    # links quiet again: not coherency
    _, out = run(engine, t, 12.0, links(20.0, 15.0))
    assert one(out, "gpu_contention_cause", cause="coherency") == 0.0


def test_every_emitted_name_and_label_is_in_the_canonical_schema():
    schema = load_schema(Path(__file__).resolve().parent.parent / "mappings" / "canonical.yaml").metrics
    prices = {"prices": [{"dollars_per_hour": 1.0}]}
    engine = IndicatorEngine(cfg(cost=prices, baseline={"warmup_samples": 5}), None, POLL)
    engine.set_device_info(DEV, model="x")
    seen: dict[str, set[str]] = {}
    for i in range(100):
        for n, lab, _ in engine.update(i * POLL, {DEV: {
            "gpu_memory_bandwidth_utilization_percent": 90.0, "gpu_compute_occupancy_percent": 30.0,
            "gpu_compute_utilization_percent": 95.0, "gpu_memory_bandwidth_gbps": 1800.0 - i,
            "gpu_l2_cache_miss_rate_percent": 10.0, 'gpu_throttle_active{reason="power_cap"}': 0.0,
        }}):
            seen.setdefault(n, set()).update(lab)
    assert set(seen) == {
        "gpu_memory_contention", "gpu_memory_contention_seconds_total", "gpu_metric_cov",
        "gpu_metric_percentile", "gpu_metric_heavy_tail", "gpu_baseline_mean", "gpu_baseline_stddev",
        "gpu_baseline_zscore", "gpu_baseline_deviation", "gpu_bandwidth_drop_under_load",
        "gpu_contention_cause", "gpu_contention_cause_info", "gpu_price_dollars_per_hour",
        "gpu_contention_cost_dollars_total",
    }
    for name, labels in seen.items():
        assert name in schema, name
        assert labels == set(schema[name].labels), name
        assert name.endswith("_total") == (schema[name].type == "counter")
    assert schema["gpu_contention_cause_info"].type == "info"
    assert all(cause in schema["gpu_contention_cause"].help for cause in CAUSES)
