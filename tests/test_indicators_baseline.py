"""EWMA baselines and their state file: restart keeps the baseline, a bad file is survived."""

from __future__ import annotations

import json
import logging
import math

import pytest

from exporter.indicators import IndicatorConfig, IndicatorEngine
from exporter.indicators.baseline import FORMAT, STATE_FILE, BaselineStore, Ewma, atomic_write

DEV = ("nvidia", "0", "GPU-8f3a")


def test_first_samples_give_running_mean_and_population_variance():
    e = Ewma()
    for x in (10.0, 20.0, 30.0, 40.0):
        e.update(x, dt=0.1, half_life=3600)
    # 1/n weighting while it exceeds the time-based weight
    assert e.n == 4
    assert e.mean == pytest.approx(25.0)
    assert e.var == pytest.approx(125.0)  # population variance of 10, 20, 30, 40


def test_half_life_in_seconds():
    e = Ewma(mean=0.0, var=0.0, n=10**9)  # old baseline: time-based weight applies
    e.update(100.0, dt=60.0, half_life=60.0)  # one half-life in one step
    assert e.mean == pytest.approx(50.0)
    # same elapsed time in 600 steps of 0.1 s gives the same weight on a constant signal
    f = Ewma(mean=0.0, var=0.0, n=10**9)
    for _ in range(600):
        f.update(100.0, dt=0.1, half_life=60.0)
    assert f.mean == pytest.approx(50.0, rel=1e-9)


def test_zscore_and_floor():
    e = Ewma(mean=1800.0, var=30.0**2, n=500)
    assert e.zscore(1740.0, 0.01) == pytest.approx(-2.0)
    # a constant baseline: stddev floored at 1 % of the mean
    flat = Ewma(mean=1800.0, var=0.0, n=500)
    assert flat.zscore(1100.0, 0.01) == pytest.approx(-700 / 18)
    assert Ewma(mean=0.0, var=0.0, n=5).zscore(1.0, 0.01) is None


def _learn(engine: IndicatorEngine, samples: int, bandwidth: float, t0: float = 0.0) -> float:
    t = t0
    for i in range(samples):
        t = t0 + i * 0.1
        engine.update(t, {DEV: {
            "gpu_compute_utilization_percent": 95.0,
            "gpu_memory_bandwidth_utilization_percent": bandwidth / 20.0,
            "gpu_memory_bandwidth_gbps": bandwidth + (20.0 if i % 2 else -20.0),
            "gpu_l2_cache_miss_rate_percent": 8.0,
        }})
    return t


def _series(out, name, **labels):
    return [v for n, lab, v in out if n == name and all(lab.get(k) == x for k, x in labels.items())]


def test_restart_keeps_the_learned_baseline(tmp_path):
    cfg = IndicatorConfig.model_validate({"baseline": {"warmup_samples": 50}})
    first = IndicatorEngine(cfg, tmp_path, poll_interval=0.1)
    _learn(first, 100, 1800.0)
    learned = first.baseline(DEV, "bandwidth")
    assert learned is not None and learned.n == 100
    assert learned.mean == pytest.approx(1800.0)
    assert learned.stddev == pytest.approx(20.0)
    first.save_state()
    saved = json.loads((tmp_path / STATE_FILE).read_text())
    assert saved["format"] == FORMAT and saved["version"] == 1
    assert saved["devices"]["GPU-8f3a"]["bandwidth"]["n"] == 100

    # a new process: monotonic time starts over
    second = IndicatorEngine(cfg, tmp_path, poll_interval=0.1)
    out = second.update(5.0, {DEV: {"gpu_compute_utilization_percent": 95.0,
                                    "gpu_memory_bandwidth_gbps": 1100.0}})
    assert _series(out, "gpu_baseline_mean", metric="bandwidth") == [pytest.approx(1800.0)]
    assert _series(out, "gpu_baseline_stddev", metric="bandwidth") == [pytest.approx(20.0)]
    assert _series(out, "gpu_baseline_zscore", metric="bandwidth") == [pytest.approx(-35.0)]
    assert _series(out, "gpu_baseline_deviation", metric="bandwidth") == [1.0]
    assert second.baseline(DEV, "l2_miss_rate").mean == pytest.approx(8.0)


def test_fresh_engine_without_state_has_no_baseline_series(tmp_path):
    engine = IndicatorEngine(IndicatorConfig(), tmp_path, poll_interval=0.1)
    out = engine.update(1.0, {DEV: {"gpu_compute_utilization_percent": 95.0,
                                    "gpu_memory_bandwidth_gbps": 1100.0}})
    assert _series(out, "gpu_baseline_mean") == []
    assert _series(out, "gpu_baseline_deviation") == []


@pytest.mark.parametrize("content", [
    b"{\"format\": \"unified-gpu-exporter/indicator-baselines\", \"version\": 1, \"devi",  # torn write
    b"\x00\x01\x02 not json",
    b"[1, 2, 3]",
    b"{\"format\": \"something-else\", \"version\": 1, \"devices\": {}}",
    json.dumps({"format": FORMAT, "version": 1,
                "devices": {"GPU-1": {"bandwidth": {"mean": 1.0, "var": -4.0, "n": 3}}}}).encode(),
    json.dumps({"format": FORMAT, "version": 1,
                "devices": {"GPU-1": {"bandwidth": {"mean": "fast", "var": 1.0, "n": 3}}}}).encode(),
    b"{\"format\": \"unified-gpu-exporter/indicator-baselines\", \"version\": 1, "
    b"\"devices\": {\"GPU-1\": {\"bandwidth\": {\"mean\": NaN, \"var\": 1, \"n\": 3}}}}",
])
def test_corrupt_state_file_is_survived(tmp_path, caplog, content):
    (tmp_path / STATE_FILE).write_bytes(content)
    cfg = IndicatorConfig.model_validate({"baseline": {"warmup_samples": 5}})
    with caplog.at_level(logging.WARNING, logger="exporter.indicators.baseline"):
        engine = IndicatorEngine(cfg, tmp_path, poll_interval=0.1)
    assert "unreadable" in caplog.text and "fresh baselines" in caplog.text
    assert (tmp_path / (STATE_FILE + ".corrupt")).read_bytes() == content
    assert engine.baseline(DEV, "bandwidth") is None
    # it learns and saves again
    _learn(engine, 10, 1500.0)
    engine.save_state()
    restored = BaselineStore(tmp_path)
    assert restored.load()
    assert restored.peek("GPU-8f3a", "bandwidth").mean == pytest.approx(1500.0)


def test_newer_format_version_is_left_alone(tmp_path, caplog):
    newer = json.dumps({"format": FORMAT, "version": 99, "devices": {}, "extra": [1]}).encode()
    (tmp_path / STATE_FILE).write_bytes(newer)
    with caplog.at_level(logging.WARNING):
        store = BaselineStore(tmp_path)
        assert not store.load()
    assert "newer" in caplog.text
    assert (tmp_path / STATE_FILE).read_bytes() == newer
    assert not (tmp_path / (STATE_FILE + ".corrupt")).exists()


def test_unwritable_state_dir_warns_and_does_not_raise(tmp_path, caplog):
    blocker = tmp_path / "state"
    blocker.write_text("a file where the directory should be")
    engine = IndicatorEngine(IndicatorConfig(), blocker, poll_interval=0.1)
    _learn(engine, 3, 1500.0)
    with caplog.at_level(logging.WARNING):
        engine.save_state()
    assert "cannot save baselines" in caplog.text


def test_no_state_dir_means_no_persistence(tmp_path):
    engine = IndicatorEngine(IndicatorConfig(), None, poll_interval=0.1)
    _learn(engine, 3, 1500.0)
    engine.save_state()  # no-op
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_leaves_no_temporary_files(tmp_path):
    target = tmp_path / "sub" / "f.json"
    atomic_write(target, b"one")
    atomic_write(target, b"two")
    assert target.read_bytes() == b"two"
    assert [p.name for p in target.parent.iterdir()] == ["f.json"]


def test_saved_values_round_trip_exactly(tmp_path):
    store = BaselineStore(tmp_path)
    e = store.get("GPU-x", "bandwidth")
    e.mean, e.var, e.n = 1234.5678901234567, 0.1 + 0.2, 77
    assert store.save()
    again = BaselineStore(tmp_path)
    assert again.load()
    got = again.peek("GPU-x", "bandwidth")
    assert (got.mean, got.var, got.n) == (1234.5678901234567, 0.1 + 0.2, 77)
    assert math.isfinite(got.stddev)
