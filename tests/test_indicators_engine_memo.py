"""What the engine keeps between polls to save work gives what working it out afresh gives:
the labelled series of a device (kept while its keys stay the same, in the same order) and the
variability statistics (kept while a window's sorted values stay the same, bit for bit)."""

from __future__ import annotations

import random

from exporter.indicators import IndicatorConfig, IndicatorEngine
from exporter.indicators.series import SeriesIndex
from exporter.indicators.variability import window_stats

DEV = ("nvidia", "0", "GPU-0")


def _series(rng: random.Random) -> dict:
    s: dict = {"gpu_compute_utilization_percent": 90.0, "gpu_memory_bandwidth_utilization_percent": 50.0}
    for reason in ("sw_power_cap", "hw_thermal", "gpu_idle"):
        s[("gpu_throttle_active", (("reason", reason),))] = rng.choice([0.0, 1.0])
    for link in range(6):
        for d in ("tx", "rx"):
            # magnitudes far apart: the float sum depends on the order of the terms
            s[("gpu_interconnect_bytes_total", (("direction", d), ("link", str(link))))] = rng.choice([1e17, 1.0, 3.3])
        s[("gpu_interconnect_utilization_percent", (("link", str(link)),))] = rng.uniform(0, 100)
    for pid in ("10", "11"):
        s[("gpu_process_utilization_percent", (("pid", pid), ("process", f"p{pid}")))] = rng.uniform(0, 50)
    return s


def test_kept_labelled_keys_gather_what_a_fresh_index_gathers():
    rng = random.Random(5)
    engine = IndicatorEngine(IndicatorConfig(), None, 0.25)
    st = engine._state(DEV)
    keys = list(_series(rng))
    for i in range(300):
        values = _series(rng)
        if i % 7 == 0:
            rng.shuffle(keys)  # same keys, another order
        if i % 11 == 0:
            keys = keys[:-1] if len(keys) > 20 else list(values)  # a series goes, or all come back
        series = {k: values[k] for k in keys}
        got = engine._gather(st, series)
        want = SeriesIndex().gather(series)
        assert repr(got) == repr(want), i


def test_statistics_follow_the_window_bit_for_bit():
    engine = IndicatorEngine(IndicatorConfig(), None, 0.25)
    cfg = engine.config.variability
    now = 0.0
    # a constant 0.0 window, then -0.0 (equal, another bit pattern), then changing values
    values = [0.0] * 300 + [-0.0] * 300 + [float(i % 7) for i in range(100)] + [2.0] * 300
    checked = 0
    for v in values:
        now += 0.25
        out = engine.update(now, {DEV: {"gpu_compute_utilization_percent": v}})
        if round(now * 4) % 4 == 1:  # a recompute (the first update, then every 1 s)
            got = {lab["percentile"]: val for name, lab, val in out
                   if name == "gpu_metric_percentile" and lab["metric"] == "utilization"}
            ring = list(engine._devices[DEV].windows["utilization"].values(now))
            want = window_stats(ring, cfg)
            assert repr(got) == repr(want.quantiles if want is not None else {}), now
            checked += want is not None
    assert checked > 200
