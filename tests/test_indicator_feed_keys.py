"""The indicator feed hands the engine structured series ids: label values reach it unaltered."""

from __future__ import annotations

import pytest

from exporter.indicators import IndicatorConfig
from exporter.indicators.series import SeriesIndex
from exporter.map.store import SourceState, Store
from exporter.model import Device, SourceStats, identity_labels
from exporter.run.feed import IndicatorFeed
from exporter.testing import frames_of, samples

NAMES = ['say "hi"', "C:\\train\\run.py", 'both \\" and "\\', "plain"]


def _store(process: str, reason: str) -> Store:
    dev = Device(key="k0", vendor="nvidia", index="0", mapping="nvml", uuid="GPU-0", model="A10")
    head = identity_labels(dev.id)
    series = {
        ("gpu_compute_utilization_percent", head): 80.0,
        ("gpu_process_utilization_percent", head + (("pid", "4242"), ("process", process))): 75.0,
        ("gpu_throttle_active", head + (("reason", reason),)): 1.0,
    }
    store = Store()
    store.add(SourceState("nvml", stats=SourceStats(up=True, state="up"), devices={"k0": dev}, frames=frames_of(series)))
    return store


@pytest.mark.parametrize("name", NAMES)
def test_process_names_with_quotes_and_backslashes_reach_the_output_unchanged(name):
    feed = IndicatorFeed(IndicatorConfig(), None, 1.0)
    out = []
    for i in range(3):
        out = samples(feed.update(1000.0 + i, _store(name, "thermal")))
    top = [dict(labels)["process"] for series, labels, _ in out if series == "gpu_top_process_info"]
    assert top == [name]
    clients = [v for series, _, v in out if series == "gpu_active_clients"]
    assert clients == [1.0]


@pytest.mark.parametrize("reason", ['the "reason"', "back\\slash", "x\\"])
def test_structured_keys_classify_labels_with_quotes_and_backslashes(reason):
    idx = SeriesIndex()
    got = idx.gather({("gpu_throttle_active", (("reason", reason),)): 1.0,
                      ("gpu_process_utilization_percent", (("pid", "7"), ("process", reason))): 50.0})
    assert got.throttle == {reason: True}
    assert got.processes == {("", "7"): 50.0}
    assert got.top_process(5.0) == reason



def _two_sources(live_miss: float | None) -> Store:
    """A live source and the profiles source for one GPU; the profile carries an L2 miss rate
    (per GPU, labelled only with its source and trace)."""
    dev = Device(key="k0", vendor="nvidia", index="0", mapping="nvml", uuid="GPU-0", model="A10")
    head = identity_labels(dev.id)
    live = {("gpu_compute_utilization_percent", head): 80.0,
            ("gpu_memory_bandwidth_utilization_percent", head): 90.0}
    if live_miss is not None:
        live[("gpu_l2_cache_miss_rate_percent", head)] = live_miss
    artefact = {("gpu_l2_cache_miss_rate_percent", head + (("source", "nsys"), ("trace_id", "t1"))): 42.0,
                ("gpu_l2_cache_miss_rate_percent", head + (("kernel", "gemm"), ("source", "nsys"))): 7.0}
    store = Store()
    store.add(SourceState("nvml", stats=SourceStats(up=True, state="up"), devices={"k0": dev}, frames=frames_of(live)))
    store.add(SourceState("profiles", stats=SourceStats(up=True, state="up"), devices={"k0": dev}, frames=frames_of(artefact)))
    return store


@pytest.mark.parametrize(("live", "seen"), [(None, 42.0), (10.0, 10.0)])
def test_a_profile_value_stands_in_where_no_live_counter_has_one(live, seen):
    """The engine gets a GPU-level value from an imported artefact only where no live source
    reports it; a per-kernel value never stands in."""
    feed = IndicatorFeed(IndicatorConfig(), None, 1.0)
    handed = []
    real = feed.engine.update

    def spy(now, devices, *args):
        handed.append(devices)
        return real(now, devices, *args)

    feed.engine.update = spy
    feed.update(1000.0, _two_sources(live))
    (frame,) = handed[-1].values()
    assert frame[("gpu_l2_cache_miss_rate_percent", ())] == seen  # never the per-kernel 7.0
