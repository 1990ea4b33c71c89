"""The renderer's per-series line cache (exporter/render/series_lines.py) against an independent oracle.

``Renderer.render`` reuses each series' prefix and, for an unchanged value, its whole line from
the previous cycle.  Over cycles in which values, keys, static labels, pod attribution and the
filter change, what prometheus-client's parser reads back from its text must be the samples
this file works out by hand from the inputs (dedup across sources, the filter's rules, pod and
static labels, a series' own label winning), and its OpenMetrics the same lines under other
headers.  Line order is checked against hand-written text.
"""

from __future__ import annotations

import fnmatch
import math
import random
import re
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.enrich.pod_index import SeriesLabeler
from exporter.map.schema import load_schema
from exporter.map.store import SourceState, Store
from exporter.model import Device, SourceStats
from exporter.render import process_metrics
from exporter.render.exposition import SELF_METRICS, Renderer
from exporter.render.seriesfilter import ExpositionConfig, SeriesFilter
from exporter.testing import flat, frames_of


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
    a, b = SourceState("nvml", stats=SourceStats(up=True, polls=3)), SourceState("dcgm", stats=SourceStats(up=True, polls=3))
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
    a.frames = frames_of({k: series[k] for k in keys})
    # the second source repeats some keys (the first source's value wins) and has its own
    b_series = {k: 99.0 for k in keys[: len(keys) // 3]}
    b_series[("gpu_sm_active_percent", ident(1))] = rng.choice(VALUES)
    b.frames = frames_of(b_series)
    store.add(a)
    store.add(b)
    return store


def extra_for(cycle: int, rng: random.Random) -> list:
    out = {}
    for i in range(3):
        out[("gpu_memory_state", ident(i) + (("state", "idle"),))] = rng.choice(VALUES)
        if cycle % 2:
            out[("gpu_memory_contention", ident(i) + (("basis", "utilization"),))] = 0.0
    out[("gpu_power_watts", ident(0))] = 1.0  # same key as a store series: the store's is served
    return [frames_of(out)]


# ---------------------------------------------------------------- the oracle, from the docs
UNBOUNDED = {"pid", "process", "kernel", "trace_id"}  # docs/configuration: allow-listed even if required


def family_of(name: str) -> str:
    for sfx in ("_bucket", "_sum", "_count"):
        base = name.removesuffix(sfx)
        if base != name and base in SCHEMA.metrics and SCHEMA.metrics[base].type == "histogram":
            return base
    return name


def served(name: str, labels, conf: dict | None) -> bool:
    family = family_of(name)
    m = SCHEMA.metrics.get(family)
    if m is None or m.internal:
        return False
    conf = conf or {}
    if conf.get("profile") == "minimal" and not m.minimal:
        return False
    if conf.get("include") and not any(fnmatch.fnmatchcase(family, p) for p in conf["include"]):
        return False
    if any(fnmatch.fnmatchcase(family, p) for p in conf.get("exclude", ())):
        return False
    allow = conf.get("label_allowlist")
    if allow is not None:
        required = (set(m.labels) - UNBOUNDED) | {"vendor", "gpu", "uuid", "le"}
        if any(k not in required and k not in allow for k, _ in labels):
            return False
    return True


def expected(store: Store, extra: list, static, per_device, conf: dict | None) -> Counter:
    """(name, labels, repr of the value) of every canonical sample the exposition must have."""
    allow = (conf or {}).get("label_allowlist")

    def kept(labels):
        return tuple(kv for kv in labels if allow is None or kv[0] in allow)

    rows = []
    for st in store.sources.values():
        for dev in st.devices.values():
            rows.append(("gpu_info", (("vendor", dev.vendor), ("gpu", dev.index), ("uuid", dev.uuid),
                                      ("model", dev.model), ("driver", dev.driver), ("pci_bus_id", ""),
                                      ("serial", ""), ("simulated", "false"), ("source", st.name)), 1.0))
    seen = set()
    for st in store.sources.values():
        for key, value in flat(st.frames).items():
            if key not in seen:  # the source enabled first wins
                seen.add(key)
                rows.append((*key, value))
    for frames in extra:  # a key a source already serves is not served twice
        rows += [(*key, value) for key, value in flat(frames).items() if key not in seen]
    out: Counter = Counter()
    for name, labels, value in rows:
        if not served(name, labels, conf):
            continue
        dev = (per_device or {}).get(tuple(v for _, v in labels[:3]))
        if isinstance(dev, SeriesLabeler):
            pid = dict(labels).get("pid")
            dev = dev.by_pid[pid] if pid in dev.by_pid else dev.device
        own = {k for k, _ in labels}
        added = [kv for kv in kept(dev or ()) + kept(static) if kv[0] not in own]
        text = frozenset((k, v.replace("\ud800", "\ufffd")) for k, v in (*labels, *added))
        out[(name, text, repr(float(value)))] += 1
    return out


def parsed(text: str) -> tuple[Counter, int]:
    """The canonical samples prometheus-client reads from ``text``, and how many samples in all."""
    out: Counter = Counter()
    total = 0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            total += 1
            if not s.name.startswith(("unified_gpu_exporter_", "process_")):
                out[(s.name, frozenset(s.labels.items()), repr(s.value))] += 1
    return out, total


# an info family is served as a gauge (OpenMetrics' info type would rename its sample)
SERVED_TYPE = {"info": "gauge"}


def headers(families) -> dict[str, tuple[str, str, str]]:
    """(type, help, unit) of every canonical family prometheus-client's parser read."""
    return {f.name: (f.type, " ".join(f.documentation.split()), "") for f in families
            if not f.name.startswith(("unified_gpu_exporter_", "process_"))}


def om_headers(body: bytes) -> dict[str, tuple[str, str, str]]:
    """(type, help, unit) of every canonical family from the OpenMetrics metadata lines (read as
    text: the strict parser also judges the random sample values this test feeds)."""
    meta: dict[str, dict[str, str]] = {}
    for line in body.decode().splitlines():
        if line.startswith(("# TYPE ", "# HELP ", "# UNIT ")):
            kind, name, *rest = line[2:].split(" ", 2)
            meta.setdefault(name, {})[kind] = rest[0] if rest else ""
    def unescape(text: str) -> str:  # OpenMetrics escapes \\, \" and \n in HELP
        return re.sub(r'\\(["\\n])', lambda m: "\n" if m.group(1) == "n" else m.group(1), text)

    return {name: (m.get("TYPE", ""), " ".join(unescape(m.get("HELP", "")).split()), m.get("UNIT", ""))
            for name, m in meta.items() if not name.startswith(("unified_gpu_exporter_", "process_"))}


def expected_headers(names: set[str], openmetrics: bool) -> dict[str, tuple[str, str, str]]:
    """What mappings/canonical.yaml declares for these families (prometheus-client strips a
    counter's _total in the text format; OpenMetrics names the family without it and has UNIT)."""
    out = {}
    for name in names:
        m = SCHEMA.metrics.get(name) or SCHEMA.metrics[name + "_total"]
        out[name] = (SERVED_TYPE.get(m.type, m.type), " ".join(m.help.split()), m.unit if openmetrics else "")
    return out


def sample_lines(body: bytes) -> list[bytes]:
    return [ln for ln in body.split(b"\n") if ln and not ln.startswith(b"#")]


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
        got = renderer.render(store, extra, static, per_device)
        assert not got.failed, renderer.last_error
        samples, total = parsed(got.text.decode())
        assert samples == expected(store, extra, static, per_device, conf), cycle
        assert sample_lines(got.openmetrics) == sample_lines(got.text), cycle
        assert got.openmetrics.endswith(b"\n# EOF\n")
        # every family's HELP, TYPE (and UNIT in OpenMetrics) is the schema's
        text_headers = headers(text_string_to_metric_families(got.text.decode()))
        assert text_headers == expected_headers(set(text_headers), openmetrics=False), cycle
        om = om_headers(got.openmetrics)
        assert om == expected_headers(set(om), openmetrics=True), cycle
        assert set(om) == set(text_headers), cycle
        assert got.series == total


def test_the_cache_forgets_series_that_are_gone():
    renderer = Renderer(SCHEMA)
    for cycle in range(30):
        store = Store()
        st = SourceState("nvml", stats=SourceStats(up=True))
        # 50 series with a new pid label every cycle (per-process churn)
        st.frames = frames_of({("gpu_process_utilization_percent", ident(0) + (("pid", f"{cycle}-{n}"),)): 1.0
                               for n in range(50)})
        store.add(st)
        renderer.render(store)
    assert renderer._lines is not None and len(renderer._lines) <= 2 * 50 + 1024


def test_a_failed_render_drops_the_cache():
    renderer = Renderer(SCHEMA)
    store = store_for(0, random.Random(1))
    renderer.render(store)
    broken = Store()
    st = SourceState("nvml", stats=SourceStats(up=True))
    st.frames = frames_of({("gpu_power_watts", ident(0)): "not a number"})  # type: ignore[dict-item]
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
    st = SourceState("nvml", stats=SourceStats(up=True))
    st.frames = frames_of({("gpu_power_watts", ident(0)): 300.0})
    store.add(st)
    per_device = {("nvidia", "0", "GPU-0"): SeriesLabeler((("namespace", "ns"), ("pod", "p")), {}, {})}
    got = renderer.render(store, [], (), per_device)
    assert not got.failed, renderer.last_error
    assert b'gpu_power_watts{gpu="0",pod="p",uuid="GPU-0",vendor="nvidia"} 300.0\n' in got.text


def test_lines_in_schema_order_buckets_by_le_and_gpu_after_gpu():
    """Hand-written expected text: families in the schema's order (gpu_info first), a family's
    series GPU after GPU in the order the source gave them, a histogram's buckets by ascending
    ``le`` then ``_sum`` and ``_count``, then the extra frames; static labels on every line."""
    renderer = Renderer(SCHEMA)
    renderer.self_metrics = False
    store = Store()
    st = SourceState("nvml", stats=SourceStats(up=True))
    st.devices = {"k1": Device("k1", "nvidia", "1", "nvml", uuid="GPU-1", model="H100")}
    k = (("kernel", "k"),)
    st.frames = {
        ("nvidia", "1", "GPU-1"): {("gpu_power_watts", ()): 300.0,
                                   ("gpu_temperature_celsius", (("sensor", "gpu"),)): 60.0},
        ("nvidia", "0", "GPU-0"): {(HIST + "_count", k): 3.0, (HIST + "_bucket", (*k, ("le", "+Inf"))): 3.0,
                                   (HIST + "_bucket", (*k, ("le", "0.5"))): 1.0, (HIST + "_sum", k): 2.5,
                                   ("gpu_power_watts", ()): -0.0},
    }
    store.add(st)
    extra = [{("nvidia", "0", "GPU-0"): {("gpu_memory_contention", (("basis", "occupancy"),)): 1.0}}]
    text = renderer.render(store, extra, (("cluster", "c"),)).text.decode()
    id0, id1 = 'uuid="GPU-0",vendor="nvidia"', 'uuid="GPU-1",vendor="nvidia"'
    assert [ln for ln in text.splitlines() if not ln.startswith("#")] == [
        'gpu_info{cluster="c",driver="",gpu="1",model="H100",pci_bus_id="",serial="",simulated="false",'
        f'source="nvml",{id1}}} 1.0',
        f'gpu_temperature_celsius{{cluster="c",gpu="1",sensor="gpu",{id1}}} 60.0',
        f'gpu_power_watts{{cluster="c",gpu="1",{id1}}} 300.0',
        f'gpu_power_watts{{cluster="c",gpu="0",{id0}}} -0.0',
        f'gpu_memory_contention{{basis="occupancy",cluster="c",gpu="0",{id0}}} 1.0',
        f'{HIST}_bucket{{cluster="c",gpu="0",kernel="k",le="0.5",{id0}}} 1.0',
        f'{HIST}_bucket{{cluster="c",gpu="0",kernel="k",le="+Inf",{id0}}} 3.0',
        f'{HIST}_sum{{cluster="c",gpu="0",kernel="k",{id0}}} 2.5',
        f'{HIST}_count{{cluster="c",gpu="0",kernel="k",{id0}}} 3.0',
    ]
    types = [ln.split()[2] for ln in text.splitlines() if ln.startswith("# TYPE")]
    assert types == [n for n in SCHEMA.metrics if n in {"gpu_info", "gpu_power_watts", "gpu_temperature_celsius",
                                                        "gpu_memory_contention", HIST}]
