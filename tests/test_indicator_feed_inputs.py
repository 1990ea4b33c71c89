"""The indicator feed hands the engine only the series it reads (``ENGINE_INPUTS``), re-reads a
source's full poll once per poll and applies fast-poll values on top.  Whatever it skips must not
change a single output value: the test runs a second engine fed each device's whole frame (the
full poll's with the fast values laid over it, every series, every update) and compares."""

from __future__ import annotations

import random

from exporter.indicators import IndicatorConfig, IndicatorEngine
from exporter.map.store import SourceState, Store
from exporter.model import Device, SourceStats, identity_labels
from exporter.run.feed import ENGINE_INPUTS, IndicatorFeed
from exporter.testing import frames_of, load_mappings, samples

DEVICES = [Device(key=f"k{i}", vendor="nvidia", index=str(i), mapping="nvml", uuid=f"GPU-{i}", model="H100 80GB HBM3")
           for i in range(3)]


METRICS = sorted(load_mappings().schema.metrics)


def _all_series(rng: random.Random, phase: int) -> dict:
    """Every canonical metric of the schema for each device (plain value), plus the labelled
    families the engine reads, with values that move the engine through its states."""
    out = {}
    for dev in DEVICES:
        head = identity_labels(dev.id)
        busy = phase % 40 >= 10
        for name in METRICS:
            out[(name, head)] = rng.uniform(0, 100)
        out[("gpu_memory_bandwidth_utilization_percent", head)] = rng.uniform(88, 97) if busy else rng.uniform(0, 5)
        out[("gpu_compute_occupancy_percent", head)] = rng.uniform(20, 40) if busy else 0.0
        out[("gpu_compute_utilization_percent", head)] = 98.0 if busy else 0.0
        out[("gpu_interconnect_bytes_total", head + (("link", "0"),))] = 1e9 * phase
        out[("gpu_interconnect_utilization_percent", head + (("link", "0"),))] = rng.uniform(0, 100)
        out[("gpu_throttle_active", head + (("reason", "sw_power_cap"),))] = float(phase % 7 == 0)
        for pid in ("11", "12"):
            out[("gpu_process_utilization_percent", head + (("pid", pid), ("process", f"p{pid}")))] = \
                rng.uniform(30, 60) if busy else 0.0
        # a per-GPU value from a profiler artefact: stands in where no live counter has one
        out[("gpu_l2_cache_miss_rate_percent", head + (("source", "nsys"), ("trace_id", "t1")))] = 42.0
    return out


def test_engine_inputs_cover_what_the_engine_reads_and_outputs_do_not_change():
    rng = random.Random(7)
    config = IndicatorConfig()
    feed = IndicatorFeed(config, None, 0.25)
    reference = IndicatorEngine(config, None, 0.25)
    for dev in DEVICES:
        reference.set_device_info(dev.id, model=dev.model, vendor=dev.vendor, cloud=None)
    store = Store()
    state = SourceState("nvml", stats=SourceStats(up=True, state="up"), devices={d.key: d for d in DEVICES})
    store.add(state)
    compared = 0
    for step in range(160):
        now = 1000.0 + step * 0.25
        if step % 4 == 0:  # a full poll: new frames, overlay emptied (as the runner does)
            polled = _all_series(rng, step // 4)
            state.frames = frames_of(polled)
            state.fast = {}
            fast: dict = {}
        else:  # a fast poll refreshes the indicator inputs only (a new overlay, as the runner does)
            fast = {**fast, **{k: rng.uniform(0, 100) for k in polled
                               if k[0] in ("gpu_compute_occupancy_percent", "gpu_memory_bandwidth_utilization_percent")
                               and len(k[1]) == 3}}
            state.fast = frames_of(fast)
        got = feed.update(now, store)
        whole = frames_of({**polled, **fast})
        want = {dev_id: reference.update(now, {dev_id: frame})[dev_id] for dev_id, frame in whole.items()}
        assert repr(sorted(got.items())) == repr(sorted(want.items())), f"step {step}"
        compared += sum(map(len, got.values()))
    assert compared > 1000
    states = {v for name, labels, v in samples(feed.latest) if name == "gpu_memory_state_info"}
    assert states  # the engine did run on these devices


def test_engine_inputs_name_only_canonical_metrics():
    assert ENGINE_INPUTS <= set(METRICS)


def test_frames_replaced_by_hand_are_read_again_at_once():
    """States built by hand (tests, a reload's carried state) replace ``frames`` without a poll:
    the feed reads the new frames at the next update, so a changed value is seen at once."""
    dev = DEVICES[0]
    head = identity_labels(dev.id)
    store = Store()
    series = {("gpu_process_utilization_percent", head + (("pid", "1"), ("process", "a"))): 80.0}
    st = SourceState("nvml", stats=SourceStats(up=True, state="up"), devices={dev.key: dev}, frames=frames_of(series))
    store.add(st)
    feed = IndicatorFeed(IndicatorConfig(), None, 1.0)
    clients = [v for n, _, v in samples(feed.update(1000.0, store)) if n == "gpu_active_clients"]
    assert clients == [1.0]
    st.frames = frames_of({**series, ("gpu_process_utilization_percent", head + (("pid", "2"), ("process", "b"))): 70.0})
    clients = [v for n, _, v in samples(feed.update(1001.0, store)) if n == "gpu_active_clients"]
    assert clients == [2.0]
