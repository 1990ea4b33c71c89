"""Issue 20, Medium 8: per-device and per-series state expires when the device is gone; memory
returns to the baseline after an identity storm (an upstream answering new UUIDs every poll)."""

from __future__ import annotations

import gc
import tracemalloc

from exporter.indicators import IndicatorConfig
from exporter.map.mapper import STATE_TTL_POLLS, Mapper
from exporter.map.mapping import MappingSet
from exporter.map.schema import default_mappings_dir, load_schema
from exporter.map.store import SourceState, Store
from exporter.model import SourceStats
from exporter.render.exposition import Renderer
from exporter.run.feed import DEVICE_TTL_SECONDS, MAX_TRACKED_DEVICES, IndicatorFeed
from exporter.sources.base import Device, PollResult

FIELDS = ("utilization.gpu", "utilization.memory", "gpm.sm_occupancy", "gpm.sm_util", "gpm.dram_bw_util")
STEP = 10.0  # seconds of (fake) time per poll


def _cycle(mapper: Mapper, feed: IndicatorFeed, renderer: Renderer, uuids: list[str], now: float) -> None:
    sample = PollResult(monotonic=now)
    for i, u in enumerate(uuids):
        dev = Device(key=u, vendor="nvidia", index=str(i % 8), mapping="nvml", uuid=u, model="A10")
        sample.devices.append(dev)
        for j, f in enumerate(FIELDS):
            sample.add(u, f, 10.0 + j + (now % 7))
    devices = {d.key: d for d in sample.devices}
    result = mapper.map(sample, devices)
    store = Store()
    store.add(SourceState("upstream", stats=SourceStats(up=True, state="up"), devices=devices, frames=result.frames))
    feed.update(now, store)
    renderer.render(store, [feed.latest])


def test_memory_returns_to_baseline_after_identity_storm():
    mdir = default_mappings_dir()
    schema = load_schema(mdir / "canonical.yaml")
    mapper = Mapper(MappingSet.load_dir(mdir, schema))
    feed = IndicatorFeed(IndicatorConfig(), None, 1.0)
    renderer = Renderer(schema)
    stable = [f"GPU-stable-{i}" for i in range(8)]
    now = 1000.0
    tracemalloc.start()
    try:
        for _ in range(5):
            now += STEP
            _cycle(mapper, feed, renderer, stable, now)
        gc.collect()
        baseline = tracemalloc.get_traced_memory()[0]
        for storm in range(20):  # 400 new identities per poll, 8,000 in all
            now += STEP
            _cycle(mapper, feed, renderer, stable + [f"GPU-storm-{storm}-{i}" for i in range(400)], now)
            # bounded during the storm too, not only after the devices' time to live
            assert len(feed.engine._devices) <= MAX_TRACKED_DEVICES + 408
        gc.collect()
        peak_state = tracemalloc.get_traced_memory()[0]
        assert peak_state > baseline + 5_000_000  # the storm did allocate (the test can fail)
        quiet_polls = max(STATE_TTL_POLLS + 20, int(DEVICE_TTL_SECONDS / STEP) + 10)
        for _ in range(quiet_polls):
            now += STEP
            _cycle(mapper, feed, renderer, stable, now)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert after < baseline + 600_000, (baseline, peak_state, after)
    assert len(feed.engine._devices) == 8
    assert mapper.state_size() <= 8 * len(FIELDS) * 2
    assert len(renderer._prefixes) < 2000
