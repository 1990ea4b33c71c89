"""Table tests of the pure indicator functions (window, variability, contention, root cause, cost).

Inputs come from the seed document's worked examples where it gives one.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest
from pydantic import ValidationError

from exporter.indicators.config import (
    BandwidthDropConfig,
    ContentionConfig,
    IndicatorConfig,
    PriceEntry,
    RootCauseConfig,
    StateConfig,
    VariabilityConfig,
)
from exporter.indicators.contention import bandwidth_drop_under_load, compute_signal
from exporter.indicators.cost import match_price
from exporter.indicators.rootcause import RootCauseInputs, classify, dominant_cause
from exporter.indicators.series import SeriesIndex
from exporter.indicators.state import decide
from exporter.indicators.variability import bimodality_coefficient, tail_to_body, window_stats
from exporter.indicators.window import RingWindow, capacity_for, coefficient_of_variation, quantile_sorted
from tests.engine_frames import frame, parse_key

# ---------------------------------------------------------------------------------- window


def test_capacity_covers_window_with_slack_and_is_capped():
    assert capacity_for(60, 0.1, 4096) == 751  # ceil(600 * 1.25) + 1
    assert capacity_for(60, 1.0, 4096) == 76
    assert capacity_for(60, 0.001, 4096) == 4096


def test_ring_keeps_fixed_memory_and_only_the_window():
    w = RingWindow(seconds=60, capacity=751)
    for i in range(100_000):  # 10 000 s of 100 ms samples
        w.push(i * 0.1, float(i))
    assert len(w) == 751
    vals = w.values(now=9999.9)
    # samples at t >= 9939.9 remain: i from 99399 to 99999
    assert len(vals) == 601
    assert vals[0] == 99399.0 and vals[-1] == 99999.0


def test_ring_ignores_samples_from_the_past_and_prunes_by_time():
    w = RingWindow(seconds=10, capacity=100)
    w.push(5.0, 1.0)
    w.push(4.0, 99.0)  # older than the last sample: ignored
    w.push(12.0, 3.0)
    assert list(w.values(now=12.0)) == [1.0, 3.0]
    assert list(w.values(now=15.5)) == [3.0]  # 5.0 < 15.5 - 10
    assert w.mean(now=15.5) == 3.0


def test_window_mean_cov_quantile():
    w = RingWindow(seconds=60, capacity=100)
    for i, v in enumerate([1.0, 2.0, 3.0, 4.0]):
        w.push(float(i), v)
    assert w.mean(3.0) == 2.5
    # population stddev of 1..4 = sqrt(1.25)
    assert w.cov(3.0) == pytest.approx(math.sqrt(1.25) / 2.5)
    assert w.quantile(3.0, 0.95) == pytest.approx(3.85)  # rank 2.85: 3 + 0.85 x (4 - 3)


@pytest.mark.parametrize(("values", "q", "expected"), [
    ([10.0], 0.99, 10.0),
    ([1.0, 2.0, 3.0, 4.0], 0.5, 2.5),
    ([1.0, 2.0, 3.0, 4.0], 0.0, 1.0),
    ([1.0, 2.0, 3.0, 4.0], 1.0, 4.0),
    ([0.0, 10.0, 20.0, 30.0, 40.0], 0.99, 39.6),
])
def test_quantile_linear_interpolation(values, q, expected):
    assert quantile_sorted(values, q) == pytest.approx(expected)


def test_cov_of_idle_signal_is_zero_not_nan():
    assert coefficient_of_variation([0.0, 0.0, 0.0]) == 0.0


# ------------------------------------------------------------------------------ variability

VCFG = VariabilityConfig()


def _normal(n: int, mean: float, sd: float) -> list[float]:
    nd = NormalDist(mean, sd)
    return [nd.inv_cdf((i + 0.5) / n) for i in range(n)]


def test_seed_runs_10ms_with_15_percent_at_25ms_is_heavy_tailed():
    values = [10.0] * 85 + [25.0] * 15
    s = window_stats(values, VCFG)
    assert s is not None
    # mean 12.25; variance 0.85 x 0.15 x 15^2 = 28.6875
    assert s.mean == pytest.approx(12.25)
    assert s.cov == pytest.approx(math.sqrt(28.6875) / 12.25)
    assert s.quantiles == {"50": 10.0, "95": 25.0, "99": 25.0}
    assert s.bimodality == pytest.approx(1.0)  # any two-point mixture
    assert s.tail_to_body == math.inf  # the inter-quartile range is 0
    assert s.heavy_tail


@pytest.mark.parametrize(("name", "values", "heavy"), [
    # seed: a clean run has CoV < 0.05: +-1 around 100
    ("clean", [99.0, 101.0] * 50, False),
    # wide but normal: CoV 0.1, bimodality 1/3, tail/body 1.7
    ("normal", _normal(200, 100.0, 10.0), False),
    # uniform: bimodality 5/9 (< 0.6), tail/body ~1
    ("uniform", [50.0 + i for i in range(100)], False),
    # exponential: tail/body ~3.5 > 3
    ("exponential", [-math.log(1 - (i + 0.5) / 200) for i in range(200)], True),
    # busy/idle half and half: bimodality 1
    ("bimodal", [95.0] * 50 + [20.0] * 50, True),
    # a clean signal with one outlier: CoV stays below 0.05
    ("one_outlier", [100.0] * 99 + [130.0], False),
])
def test_heavy_tail_flag(name, values, heavy):
    s = window_stats(values, VCFG)
    assert s is not None
    assert s.heavy_tail is heavy, (name, s)


def test_reference_shapes_of_the_flag_statistics():
    normal = sorted(_normal(1000, 0.0, 1.0))
    assert bimodality_coefficient(normal, 0.0) == pytest.approx(1 / 3, abs=0.02)
    assert tail_to_body(normal) == pytest.approx(2.326 / 1.349, rel=0.02)


def test_too_few_samples_gives_no_statistics():
    assert window_stats([1.0] * 9, VCFG) is None
    assert window_stats([1.0] * 10, VCFG) is not None


# ------------------------------------------------------------------------------- contention

CCFG = ContentionConfig()


@pytest.mark.parametrize(("series", "expected"), [
    ({"gpu_compute_occupancy_percent": 30, "gpu_sm_active_percent": 70,
      "gpu_compute_utilization_percent": 99}, ("occupancy", 30)),
    ({"gpu_sm_active_percent": 40, "gpu_compute_utilization_percent": 99}, ("sm_active", 40)),
    ({"gpu_compute_utilization_percent": 45}, ("utilization", 45)),
    ({"gpu_memory_bandwidth_utilization_percent": 95}, None),
])
def test_compute_signal_prefers_occupancy(series, expected):
    assert compute_signal(series, CCFG.basis_order) == expected


@pytest.mark.parametrize(("bw", "compute", "basis", "expected"), [
    (90, 30, "occupancy", True),   # the seed's GPUMemoryContention
    (85, 30, "occupancy", False),  # > 85, not >=
    (86, 49.9, "occupancy", True),
    (90, 50, "occupancy", False),  # < 50, not <=
    (60, 10, "occupancy", False),
    # utilization is no starvation signal: bandwidth alone is the signature (evidence decides)
    (91, 80, "utilization", True),
])
def test_memory_contention_thresholds(bw, compute, basis, expected):
    """The signature as the engine decides it (``state.decide``, the seed's thresholds)."""
    verdict = decide(bw, 99.0, basis, compute, False, None, False, False, False, StateConfig(),
                     CCFG.bandwidth_utilization_percent, CCFG.compute_percent)
    assert verdict.signature is expected


@pytest.mark.parametrize(("bw", "baseline", "util", "expected"), [
    (1100, 1800, 95, True),   # seed: 1.8 -> 1.1 TB/s at 95 % utilization (-39 %)
    (1260, 1800, 95, True),   # exactly 30 % below
    (1300, 1800, 95, False),  # 27.8 % below
    (1100, 1800, 85, False),  # utilization must be > 85
    (1100, 0, 95, False),     # no baseline
])
def test_bandwidth_drop_under_load(bw, baseline, util, expected):
    assert bandwidth_drop_under_load(bw, baseline, util, BandwidthDropConfig()) is expected


# ------------------------------------------------------------------------------- root cause

RCFG = RootCauseConfig()


@pytest.mark.parametrize(("name", "inputs", "expected"), [
    # seed multi-tenant case: miss 8 % -> 35 %, memory controller at 65 %
    ("seed_multi_tenant", RootCauseInputs(bandwidth_util=65, miss_rate=35, miss_baseline=8),
     {"memory_pressure": True, "bandwidth_saturation": False}),
    # the same without a learned baseline: 35 % is below the absolute 40 %
    ("seed_multi_tenant_no_baseline", RootCauseInputs(bandwidth_util=65, miss_rate=35),
     {"memory_pressure": False, "bandwidth_saturation": False}),
    # seed workload A: sparse inference, 60 % L2 misses
    ("seed_sparse_60_miss", RootCauseInputs(bandwidth_util=55, miss_rate=60),
     {"memory_pressure": True, "bandwidth_saturation": False}),
    # seed workload B: dense kernels at 1900 GB/s on a 2 TB/s part (95 %), cache-friendly
    ("seed_dense_1900_of_2000", RootCauseInputs(bandwidth_util=95, miss_rate=6),
     {"memory_pressure": False, "bandwidth_saturation": True}),
    # two of them: demand 3800 GB/s, the controller pegged at 100 %
    ("seed_two_dense_kernels", RootCauseInputs(bandwidth_util=100, miss_rate=6, miss_baseline=6),
     {"memory_pressure": False, "bandwidth_saturation": True}),
    # a rise that is only 1.5x is not large
    ("small_rise", RootCauseInputs(bandwidth_util=60, miss_rate=30, miss_baseline=20),
     {"memory_pressure": False, "bandwidth_saturation": False}),
    # high bandwidth and high misses: neither signature
    ("high_high", RootCauseInputs(bandwidth_util=95, miss_rate=60),
     {"memory_pressure": False, "bandwidth_saturation": False}),
    # no miss rate: neither pressure nor saturation can be claimed
    ("no_miss_rate", RootCauseInputs(bandwidth_util=95), {}),
    # seed: P2P throughput 150 -> 95 GB/s with the links busy
    ("seed_coherency", RootCauseInputs(link_util=90, interconnect_throughput=95e9,
                                       interconnect_baseline=150e9), {"coherency": True}),
    ("coherency_links_not_busy", RootCauseInputs(link_util=50, interconnect_throughput=95e9,
                                                 interconnect_baseline=150e9), {"coherency": False}),
    ("coherency_small_drop", RootCauseInputs(link_util=90, interconnect_throughput=120e9,
                                             interconnect_baseline=150e9), {"coherency": False}),
    ("coherency_without_baseline", RootCauseInputs(link_util=90, interconnect_throughput=95e9), {}),
    ("thermal", RootCauseInputs(throttle={"hw_thermal": True, "sw_power_cap": False}),
     {"thermal_throttle": True, "power_throttle": False}),
    ("power", RootCauseInputs(throttle={"sw_power_cap": True}), {"power_throttle": True}),
    ("hw_slowdown_alone_is_neither", RootCauseInputs(throttle={"hw_slowdown": True}), {}),
])
def test_classify(name, inputs, expected):
    assert classify(inputs, RCFG) == expected


def test_saturation_from_bandwidth_alone_is_opt_in():
    cfg = RootCauseConfig(saturation_without_miss_rate=True)
    assert classify(RootCauseInputs(bandwidth_util=95), cfg) == {"bandwidth_saturation": True}


@pytest.mark.parametrize(("flags", "contended", "evaluated", "expected"), [
    ({"memory_pressure": True, "thermal_throttle": True}, True, True, "thermal_throttle"),
    ({"memory_pressure": True, "thermal_throttle": False}, False, True, "memory_pressure"),
    ({"memory_pressure": False}, True, True, "unknown"),
    ({"memory_pressure": False}, False, True, "none"),
    ({}, False, True, "none"),
    ({}, False, False, "unknown"),
])
def test_dominant_cause(flags, contended, evaluated, expected):
    assert dominant_cause(flags, contended, RCFG.priority, evaluated) == expected


def test_priority_must_name_every_cause():
    with pytest.raises(ValidationError):
        RootCauseConfig(priority=("memory_pressure",))
    with pytest.raises(ValidationError):
        ContentionConfig(basis_order=("warp_occupancy",))


# ------------------------------------------------------------------------------------- cost

PRICES = (
    PriceEntry(dollars_per_hour=1.00),
    PriceEntry(vendor="nvidia", model="*h100*", dollars_per_hour=2.00),
    PriceEntry(vendor="nvidia", model="*H100*", cloud="gcp", dollars_per_hour=2.85),
    PriceEntry(vendor="nvidia", model="*A100*", cloud="aws", dollars_per_hour=3.06),
    PriceEntry(vendor="amd", model="*MI250X*", cloud="azure", dollars_per_hour=2.50),
)


@pytest.mark.parametrize(("vendor", "model", "cloud", "expected"), [
    ("nvidia", "NVIDIA H100 80GB HBM3", "gcp", 2.85),  # most specific
    ("nvidia", "NVIDIA H100 80GB HBM3", "aws", 2.00),  # vendor + model
    ("nvidia", "NVIDIA A100-SXM4-40GB", "aws", 3.06),
    ("nvidia", "NVIDIA A100-SXM4-40GB", "", 1.00),     # cloud unknown: catch-all
    ("AMD", "AMD Instinct MI250X", "Azure", 2.50),     # case-insensitive
])
def test_price_table_most_specific_match(vendor, model, cloud, expected):
    assert match_price(PRICES, vendor, model, cloud) == expected


def test_no_price_without_a_matching_entry():
    assert match_price(PRICES[1:], "intel", "Data Center GPU Max 1550", "") is None


def test_defaults_are_the_seeds_numbers():
    cfg = IndicatorConfig()
    assert cfg.contention.bandwidth_utilization_percent == 85
    assert cfg.contention.compute_percent == 50
    assert cfg.variability.cov_clean == 0.05
    assert cfg.variability.window_seconds == 60
    assert cfg.baseline.deviation_sigma == 2
    assert cfg.bandwidth_drop.drop_fraction == 0.30
    assert cfg.bandwidth_drop.utilization_percent == 85
    assert cfg.rootcause.pressure_miss_percent == 40
    assert cfg.rootcause.saturation_bandwidth_percent == 90


def test_config_rejects_unknown_keys():
    with pytest.raises(ValidationError):
        IndicatorConfig.model_validate({"contention": {"bandwidth_percent": 80}})


# ------------------------------------------------------------------------------ series keys


def test_parse_key():
    assert parse_key("gpu_power_watts") == ("gpu_power_watts", {})
    assert parse_key('gpu_interconnect_bytes_total{interconnect="nvlink",direction="tx",link="0"}') == (
        "gpu_interconnect_bytes_total", {"interconnect": "nvlink", "direction": "tx", "link": "0"})
    assert parse_key('x{a="q\\"uote"}') == ("x", {"a": 'q"uote'})


def test_series_index_gathers_labelled_signals():
    series = {
        "gpu_compute_utilization_percent": 50.0,
        'gpu_throttle_active{reason="hw_thermal"}': 0.0,
        'gpu_throttle_active{gt="0",reason="thermal"}': 0.0,
        'gpu_throttle_active{gt="1",reason="thermal"}': 1.0,
        'gpu_interconnect_bytes_total{interconnect="nvlink",direction="tx",link="0"}': 100.0,
        'gpu_interconnect_bytes_total{interconnect="nvlink",direction="rx",link="0"}': 50.0,
        'gpu_interconnect_utilization_percent{interconnect="nvlink",link="0"}': 40.0,
        'gpu_interconnect_utilization_percent{interconnect="nvlink",link="1"}': 85.0,
        'gpu_temperature_celsius{sensor="gpu"}': 60.0,
    }
    idx = SeriesIndex()
    for _ in range(2):  # second pass is served from the cache
        got = idx.gather(frame(series))
        assert got.throttle == {"hw_thermal": False, "thermal": True}
        assert got.interconnect_bytes == 150.0
        assert got.interconnect_series == 2
        assert got.link_util == 85.0
