"""What the engine keeps between polls to save work gives what working it out afresh gives:
the labelled series of a device (kept while its keys stay the same, in the same order) and the
variability statistics (kept while a window's sorted values stay the same, bit for bit)."""

from __future__ import annotations

import random

from exporter.indicators import IndicatorConfig
from exporter.indicators.series import SeriesIndex
from exporter.indicators.variability import window_stats
from exporter.sources.context import SourceContext
from tests.engine_frames import TextEngine, frame

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
    engine = TextEngine(IndicatorConfig(), None, 0.25)
    st = engine._state(DEV)
    keys = list(_series(rng))
    for i in range(300):
        values = _series(rng)
        if i % 7 == 0:
            rng.shuffle(keys)  # same keys, another order
        if i % 11 == 0:
            keys = keys[:-1] if len(keys) > 20 else list(values)  # a series goes, or all come back
        series = {k: values[k] for k in keys}
        got = engine._gather(st, frame(series))
        want = SeriesIndex().gather(frame(series))
        assert repr(got) == repr(want), i


def test_statistics_follow_the_window_bit_for_bit():
    engine = TextEngine(IndicatorConfig(), None, 0.25)
    cfg = engine.config.variability
    now = 0.0
    # a constant 0.0 window, then -0.0 (equal, another bit pattern), then changing values
    values = [0.0] * 300 + [-0.0] * 300 + [float(i % 7) for i in range(100)] + [2.0] * 300
    checked = 0
    for v in values:
        now += 0.25
        out = engine.update(now, {DEV: {"gpu_compute_utilization_percent": v}})
        if engine._devices[DEV].stats_at == now:  # a recompute (every 1 s, and when the GPU turns busy or idle)
            got = {lab["percentile"]: val for name, lab, val in out
                   if name == "gpu_metric_percentile" and lab["metric"] == "utilization"}
            ring = list(engine._devices[DEV].windows["utilization"].values(now))
            want = window_stats(ring, cfg)
            assert repr(got) == repr(want.quantiles if want is not None else {}), now
            checked += want is not None
    assert checked > 200


def test_fed_only_the_series_it_reads_the_engine_says_the_same():
    """USED_SERIES: a feed may hand the engine only these names (exporter/run/feed.py)."""
    from exporter.indicators import USED_SERIES
    from exporter.map.mapper import Mapper
    from exporter.map.store import SourceState, Store
    from exporter.model import IDENTITY_WIDTH
    from exporter.run.pipeline import poll_and_map
    from exporter.simulate import SimulatorSource
    from exporter.testing import FakeClock, flat, load_mappings

    mappings = load_mappings()
    for scenario in ("demo", "detection"):
        source = SimulatorSource(SourceContext(options={"scenario": scenario}, mappings=mappings))
        clock = FakeClock(5000.0)
        source.clock = clock
        source.open()
        mapper, store, state = Mapper(mappings), Store(), SourceState("simulator")
        store.add(state)
        # short baseline bins: every baseline (the interconnect's too) warms within the run
        cfg = IndicatorConfig.model_validate({"baseline": {"bin_seconds": 1.0, "warmup_bins": 3}})
        every, only = TextEngine(cfg, None, 0.25), TextEngine(cfg, None, 0.25)
        dropped = 0
        for i in range(400):
            clock.now = 5000.0 + i * 0.25
            cycle = poll_and_map(source.poll, store, state, mapper, now=clock.now)
            state.devices = cycle.devices
            per: dict = {}
            for (name, labels), value in flat(cycle.result.frames).items():
                dev = tuple(v for _, v in labels[:IDENTITY_WIDTH])
                extra = labels[IDENTITY_WIDTH:]
                per.setdefault(dev, {})[(name, extra) if extra else name] = value
            for dev, series in per.items():
                for k, v in list(series.items()):  # as the feed does with profiler imports
                    if isinstance(k, tuple) and {lab for lab, _ in k[1]} <= {"source", "trace_id"}:
                        series.setdefault(k[0], v)
                # series the engine does not read (the simulator emits only ones it reads)
                series["gpu_power_watts"] = 300.0 + i
                # interconnect counters and utilization (the simulator has none)
                for link in ("0", "1"):
                    series[("gpu_interconnect_bytes_total", (("direction", "tx"), ("link", link)))] = \
                        1e9 * (i // 4) * (1 if i < 250 else 0.5)
                    series[("gpu_interconnect_utilization_percent", (("link", link),))] = 90.0
                series[("gpu_temperature_celsius", (("sensor", "gpu"),))] = 60.0
                used = {k: v for k, v in series.items() if (k[0] if isinstance(k, tuple) else k) in USED_SERIES}
                dropped += len(series) - len(used)
                assert repr(every.update(clock.now, {dev: series})) == repr(only.update(clock.now, {dev: used}))
        assert dropped > 0
