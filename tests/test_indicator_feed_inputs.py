"""The indicator feed hands the engine only the series it reads (``ENGINE_INPUTS``), re-reads a
source's full poll once per poll and applies fast-poll values on top.  Whatever it skips must not
change a single output value: each test runs a second engine fed the old way (every series of the
device, every update) and compares."""

from __future__ import annotations

import random

from exporter.indicator_feed import ENGINE_INPUTS, IndicatorFeed
from exporter.indicators import IndicatorConfig, IndicatorEngine
from exporter.model import IDENTITY_WIDTH, Device, device_id_of, identity_labels
from exporter.store import SourceState, Store
from exporter.testing import load_mappings

DEVICES = [Device(key=f"k{i}", vendor="nvidia", index=str(i), mapping="nvml", uuid=f"GPU-{i}", model="H100 80GB HBM3")
           for i in range(3)]


METRICS = sorted(load_mappings().schema.metrics)


def _all_series(rng: random.Random, phase: int) -> dict:
    """Every canonical metric of the schema for each device (plain value), plus the labelled
    families the engine reads, with values that move the engine through its states."""
    out = {}
    for dev in DEVICES:
        head = identity_labels(dev)
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


def _direct(series: dict) -> dict:
    """What the feed used to hand the engine: every series of every device, keyed by name or
    (name, extra labels), artefact values standing in by plain name."""
    devices: dict = {}
    imported = []
    for (name, labels), value in series.items():
        extra = labels[IDENTITY_WIDTH:]
        dev = devices.setdefault(device_id_of(labels), {})
        dev[(name, extra) if extra else name] = value
        if extra and {k for k, _ in extra} <= {"source", "trace_id"}:
            imported.append((device_id_of(labels), name, value))
    for dev_id, name, value in imported:
        devices[dev_id].setdefault(name, value)
    return devices


def _labelled(dev_id, samples):
    dl = (("vendor", dev_id[0]), ("gpu", dev_id[1]), ("uuid", dev_id[2]))
    return sorted((name, dl + tuple(sorted(extra.items())), value) for name, extra, value in samples)


def test_engine_inputs_cover_what_the_engine_reads_and_outputs_do_not_change():
    rng = random.Random(7)
    config = IndicatorConfig()
    feed = IndicatorFeed(config, None, 0.25)
    reference = IndicatorEngine(config, None, 0.25)
    for dev in DEVICES:
        reference.set_device_info(dev.id, model=dev.model, vendor=dev.vendor, cloud=None)
    store = Store()
    state = SourceState("nvml", up=True, state="up", devices={d.key: d for d in DEVICES})
    store.add(state)
    compared = 0
    for step in range(160):
        now = 1000.0 + step * 0.25
        if step % 4 == 0:  # a full poll: new series, overlay emptied (as the runner does)
            polled = _all_series(rng, step // 4)
            state.series = state.polled = polled
            state.fast = {}
        else:  # a fast poll refreshes the indicator inputs only
            fast = {k: rng.uniform(0, 100) for k in state.polled
                    if k[0] in ("gpu_compute_occupancy_percent", "gpu_memory_bandwidth_utilization_percent")
                    and len(k[1]) == IDENTITY_WIDTH}
            state.fast = {**state.fast, **fast}
            state.series = state.polled  # the runner leaves series to the full poll
        got = sorted(feed.update(now, store))
        want = []
        for dev_id, series in _direct({**state.polled, **state.fast}).items():
            want += _labelled(dev_id, reference.update(now, {dev_id: series}))
        assert got == sorted(want), f"step {step}"
        compared += len(got)
    assert compared > 1000
    states = {v for name, labels, v in feed.latest if name == "gpu_memory_state_info"}
    assert states  # the engine did run on these devices


def test_engine_inputs_name_only_canonical_metrics():
    assert ENGINE_INPUTS <= set(METRICS)


def test_a_source_without_a_full_poll_record_is_read_from_series_each_time():
    """States built by hand (tests, a reload's carried state) have no ``polled``: the feed reads
    ``series`` at every update, so a changed value is seen at once."""
    dev = DEVICES[0]
    head = identity_labels(dev)
    store = Store()
    st = SourceState("nvml", up=True, state="up", devices={dev.key: dev},
                     series={("gpu_process_utilization_percent", head + (("pid", "1"), ("process", "a"))): 80.0})
    store.add(st)
    feed = IndicatorFeed(IndicatorConfig(), None, 1.0)
    clients = [v for n, _, v in feed.update(1000.0, store) if n == "gpu_active_clients"]
    assert clients == [1.0]
    st.series = {**st.series, ("gpu_process_utilization_percent", head + (("pid", "2"), ("process", "b"))): 70.0}
    clients = [v for n, _, v in feed.update(1001.0, store) if n == "gpu_active_clients"]
    assert clients == [2.0]
