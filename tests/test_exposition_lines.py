"""The renderer's per-series line cache (exporter/series_lines.py) against the plain path.

``Renderer.render`` reuses each series' prefix and, for an unchanged value, its whole line from
the previous cycle.  Over cycles in which values, keys, static labels, pod attribution and the
filter change, its bytes (text and OpenMetrics) must equal ``Renderer.build`` +
``textformat.render`` with a fresh prefix cache, which builds everything from scratch.
"""

from __future__ import annotations

import math
import random

import pytest

from exporter import process_metrics
from exporter.enrich.pod_index import SeriesLabeler
from exporter.exposition import SELF_METRICS, Renderer
from exporter.model import Device
from exporter.schema import load_schema
from exporter.seriesfilter import ExpositionConfig, SeriesFilter
from exporter.store import SourceState, Store
from exporter.textformat import Counts, PrefixCache
from exporter.textformat import render as write_exposition


@pytest.fixture(autouse=True)
def _steady_process_metrics(monkeypatch):
    """process_* values move between the two renders compared here (CPU time, fds): held still."""
    fixed = process_metrics.sample()
    monkeypatch.setattr(process_metrics, "sample", lambda: dict(fixed))

SCHEMA = load_schema()
HIST = "gpu_kernel_execution_time_milliseconds"
# values whose text differs although they compare equal (0.0 / -0.0), or that never compare equal
VALUES = [0.0, -0.0, 0, 1, 1.0, True, 2.5, math.nan, math.inf, -math.inf, 1e300, 5e-324, -7, 0.1 + 0.2]


def ident(i: int) -> tuple[tuple[str, str], ...]:
    return (("vendor", "nvidia"), ("gpu", str(i)), ("uuid", f"GPU-{i}"))


def store_for(cycle: int, rng: random.Random) -> Store:
    store = Store()
    a, b = SourceState("nvml", up=True, polls=3), SourceState("dcgm", up=True, polls=3)
    for i in range(3):
        a.devices[f"k{i}"] = Device(f"k{i}", "nvidia", str(i), "nvml", uuid=f"GPU-{i}", model="H100 \"x\"")
    series: dict = {}
    for i in range(3):
        idl = ident(i)
        series[("gpu_temperature_celsius", idl + (("sensor", "gpu"),))] = rng.choice(VALUES)
        series[("gpu_power_watts", idl)] = rng.choice(VALUES) if cycle % 2 else 300.0
        series[("gpu_memory_used_bytes", idl)] = float(cycle % 3)
        series[("gpu_no_such_metric", idl)] = 1.0  # not in the schema: never served
        series[("gpu_process_utilization_percent",
                idl + (("pid", str(100 + (cycle + i) % 4)), ("process", 'py\\"\n\ud800')))] = rng.choice(VALUES)
        for le in ("+Inf", "0.5", "10", "0.001") if (cycle + i) % 3 else ("1", "+Inf"):
            series[(HIST + "_bucket", idl + (("kernel", f"k{cycle % 2}"), ("le", le)))] = float(cycle)
        series[(HIST + "_count", idl + (("kernel", f"k{cycle % 2}"),))] = 4.0
        series[(HIST + "_sum", idl + (("kernel", f"k{cycle % 2}"),))] = rng.choice(VALUES)
    keys = list(series)
    rng.shuffle(keys)
    a.series = {k: series[k] for k in keys}
    # the second source repeats some keys (the first source's value wins) and has its own
    b.series = {k: 99.0 for k in keys[: len(keys) // 3]}
    b.series[("gpu_sm_active_percent", ident(1))] = rng.choice(VALUES)
    store.add(a)
    store.add(b)
    return store


def extra_for(cycle: int, rng: random.Random) -> list:
    out = []
    for i in range(3):
        out.append(("gpu_memory_state", ident(i) + (("state", "idle"),), rng.choice(VALUES)))
        if cycle % 2:
            out.append(("gpu_memory_contention", ident(i) + (("basis", "utilization"),), 0.0))
    out.append(("gpu_power_watts", ident(0), 1.0))  # same key as a store series: both served
    return out


def per_device_for(cycle: int) -> dict | None:
    if cycle % 4 == 0:
        return None
    if cycle % 4 == 1:
        return {("nvidia", "0", "GPU-0"): (("pod", "a"), ("namespace", "ns"))}
    return {("nvidia", "0", "GPU-0"): SeriesLabeler((("pod", f"p{cycle % 3}"),), {},
                                                    {"101": (("pod", "by-pid"),)}),
            ("nvidia", "1", "GPU-1"): (("pod", "b"),)}


@pytest.mark.parametrize("conf", [None, {}, {"profile": "minimal"},
                                  {"exclude": ["gpu_temperature_*"], "include": ["gpu_*"]},
                                  {"label_allowlist": ["sensor", "pod", "le", "kernel"]}])
def test_cached_lines_equal_a_fresh_render_over_changing_cycles(conf):
    rng = random.Random(17)
    renderer = Renderer(SCHEMA)
    if conf is not None:
        renderer.series_filter = SeriesFilter(ExpositionConfig(**conf), SCHEMA, tuple(SELF_METRICS))
    for cycle in range(40):
        store = store_for(cycle, rng)
        extra = extra_for(cycle, rng)
        static = (("cluster", "c1"),) if cycle < 20 else (("cluster", "c2"), ("zone", "z"))
        per_device = per_device_for(cycle)
        repaired = Counts.invalid_utf8
        families = renderer.build(store, extra, static, per_device)
        want_text = write_exposition(families, PrefixCache(), openmetrics=False)
        want_om = write_exposition(families, PrefixCache(), openmetrics=True)
        Counts.invalid_utf8 = repaired  # the fresh caches above repaired the same values again
        got = renderer.render(store, extra, static, per_device)
        assert not got.failed, renderer.last_error
        assert got.text == want_text, cycle
        assert got.openmetrics == want_om, cycle
        assert got.series == sum(len(f.samples) for f in families)


def test_the_cache_forgets_series_that_are_gone():
    renderer = Renderer(SCHEMA)
    for cycle in range(30):
        store = Store()
        st = SourceState("nvml", up=True)
        # 50 series with a new pid label every cycle (per-process churn)
        st.series = {("gpu_process_utilization_percent", ident(0) + (("pid", f"{cycle}-{n}"),)): 1.0
                     for n in range(50)}
        store.add(st)
        renderer.render(store)
    assert renderer._lines is not None and len(renderer._lines) <= 2 * 50 + 1024


def test_a_failed_render_drops_the_cache():
    renderer = Renderer(SCHEMA)
    store = store_for(0, random.Random(1))
    renderer.render(store)
    broken = Store()
    st = SourceState("nvml", up=True)
    st.series = {("gpu_power_watts", ident(0)): "not a number"}  # type: ignore[dict-item]
    broken.add(st)
    assert renderer.render(broken).failed
    assert renderer._lines is None
    assert not renderer.render(store).failed


def test_pod_attribution_with_a_label_allowlist():
    """The allow-list applies to what a pod labeler returns (it used to be applied to the labeler
    itself: a TypeError, and a render with only self-metrics)."""
    renderer = Renderer(SCHEMA)
    renderer.series_filter = SeriesFilter(ExpositionConfig(label_allowlist=["pod"]), SCHEMA, tuple(SELF_METRICS))
    store = Store()
    st = SourceState("nvml", up=True)
    st.series = {("gpu_power_watts", ident(0)): 300.0}
    store.add(st)
    per_device = {("nvidia", "0", "GPU-0"): SeriesLabeler((("namespace", "ns"), ("pod", "p")), {}, {})}
    got = renderer.render(store, [], (), per_device)
    assert not got.failed, renderer.last_error
    assert b'gpu_power_watts{gpu="0",pod="p",uuid="GPU-0",vendor="nvidia"} 300.0\n' in got.text
