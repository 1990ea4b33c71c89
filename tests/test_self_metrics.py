"""Self-metrics are declared once (exporter/render/self_metrics.py): every declared counter
survives a reload (SIGHUP) and never goes back, every rendered self-metric carries the labels
its declaration names, and a per-source counter is rendered from its declaration alone."""

from __future__ import annotations

import pytest

from exporter.enrich import hpc_jobs
from exporter.render import cpustats, exposition, otlp_stats, server_stats
from exporter.render.self_metrics import BY_NAME, DECLARED, SELF, SOURCE_COUNTERS, SelfMetric
from exporter.render.textformat import Counts
from exporter.run.daemon import Daemon
from tests.test_daemon import mappings_dir, parse, settings, test_collectors  # noqa: F401 - fixtures

SOURCES = ["good", "raising"]


def _bump_process(daemon: Daemon) -> None:
    """Count once more in every process-wide counter, where it is counted."""
    daemon.renderer.render_errors += 3
    Counts.invalid_utf8 += 2
    cpustats.add("poll", "good", 0.5)
    otlp_stats.STATS.success += 4
    otlp_stats.STATS.failure += 1
    otlp_stats.STATS.dropped += 2
    server_stats.STATS.reloads["applied"] += 1
    server_stats.STATS.reloads["refused_looser"] += 5
    hpc_jobs.STATS.refused["symlink"] += 6


PROCESS_COUNTERS = {"render_errors_total", "invalid_utf8_replaced_total", "stage_cpu_seconds_total",
                    "otlp_exports_total", "otlp_dropped_snapshots_total", "web_config_reloads_total",
                    "hpc_job_files_refused_total"}


def _show_optional() -> None:
    """The optional parts' families are served while the part is on (a reload with the OTLP push
    off in its config turns that family off; what it counted stays)."""
    otlp_stats.STATS.enabled = True
    server_stats.STATS.web_config = True


async def _self_samples(daemon: Daemon) -> dict[str, float]:
    _show_optional()
    rendered = await daemon.render()
    return {k: v for k, v in parse(rendered.text.decode()).items() if k.startswith(SELF)}


def _counter_series(samples: dict[str, float]) -> dict[str, float]:
    counters = {SELF + m.name for m in DECLARED if m.type == "counter"}
    return {k: v for k, v in samples.items() if k.split("{")[0] in counters}


def test_every_process_counter_is_bumped_here():
    """A new process-wide counter must be added to _bump_process (the reload test covers it)."""
    declared = {m.name for m in DECLARED if m.type == "counter" and m.scope == "process"}
    assert declared == PROCESS_COUNTERS


@pytest.fixture
def process_stats():
    """The process-wide stats are module objects: put them back after the test."""
    saved = (otlp_stats.STATS, server_stats.STATS, hpc_jobs.STATS, Counts.invalid_utf8)
    otlp_stats.STATS.__init__()
    server_stats.STATS.__init__()
    hpc_jobs.STATS.__init__()
    yield
    otlp_stats.STATS.__init__()
    server_stats.STATS.__init__()
    hpc_jobs.STATS.__init__()
    Counts.invalid_utf8 = saved[3]


async def test_every_declared_counter_survives_a_reload(mappings_dir, tmp_path, test_collectors,  # noqa: F811
                                                          process_stats):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    config = f"labels: {{node: a}}\nenrich:\n  hpc_jobs: {{directory: {jobs}}}\n"
    daemon = Daemon(settings(mappings_dir, tmp_path, SOURCES, config=config))
    await daemon.start()
    try:
        for rt in daemon.runtimes:  # every per-source counter, as declared, whatever it is
            assert rt.stats is daemon.store.sources[rt.state.name].stats  # the runner's, shown by the store
            for m in SOURCE_COUNTERS:
                for value in (*m.always, "probe") if m.labels else m.always:
                    rt.stats.counter(m.name)[value] += 7
        _bump_process(daemon)
        before = _counter_series(await _self_samples(daemon))
        names = {k.split("{")[0] for k in before}
        assert names == {SELF + m.name for m in DECLARED if m.type == "counter"}, "a counter is not rendered"
        for m in SOURCE_COUNTERS:
            for src in SOURCES:
                assert any(k.startswith(f"{SELF}{m.name}{{") and f'source="{src}"' in k and v >= 7
                           for k, v in before.items()), (m.name, src)

        await daemon.request_reload()  # what SIGHUP runs
        assert daemon.renderer.reload_ok
        after = _counter_series(await _self_samples(daemon))
        went_back = {k: (v, after.get(k)) for k, v in before.items() if after.get(k, float("-inf")) < v}
        assert went_back == {}, "counters went back (or vanished) on a reload"
        for rt in daemon.runtimes:  # the new runners count on from the carried values
            assert rt.stats is daemon.store.sources[rt.state.name].stats
            rt.stats.errors["timeout"] += 1
        again = _counter_series(await _self_samples(daemon))
        for src in SOURCES:
            key = f'{SELF}source_errors_total{{kind="timeout",source="{src}"}}'
            assert again[key] >= before[key] + 1
    finally:
        await daemon.stop()


async def test_rendered_self_metrics_have_their_declared_labels(mappings_dir, tmp_path, test_collectors,  # noqa: F811
                                                                process_stats):
    daemon = Daemon(settings(mappings_dir, tmp_path, SOURCES, config="labels: {node: a}\n"))
    await daemon.start()
    try:
        for rt in daemon.runtimes:
            await daemon.poll_once(rt)
        _bump_process(daemon)
        server_stats.STATS.eviction = True
        samples = await _self_samples(daemon)
    finally:
        await daemon.stop()
    seen = set()
    for key in samples:
        name, _, rest = key.partition("{")
        labels = {part.split("=", 1)[0] for part in rest.rstrip("}").split('",') if part}
        m = BY_NAME[name[len(SELF):]]
        seen.add(m.name)
        allowed = set(m.labels) | ({"source"} if m.scope == "source" else set())
        if m.name == "stage_cpu_seconds_total":
            allowed = {"stage", "source"}  # source: for the per-source stages only
            assert "stage" in labels, key
        else:
            assert labels == allowed, (key, sorted(allowed))
    assert {"source_up", "source_errors_total", "device_up", "build_info", "otlp_exports_total"} <= seen


def test_a_declared_source_counter_needs_nothing_else(monkeypatch):
    """Declared, then counted by the runner: rendered per source from 0, with its label values."""
    from exporter.map.schema import load_schema
    from exporter.map.store import SourceState, Store
    from exporter.model import SourceStats

    plain = SelfMetric("probe_overruns_total", "counter", "Probe.", scope="source")
    kinded = SelfMetric("probe_drops_total", "counter", "Probe.", ("why",), "source", always=("full",))
    monkeypatch.setattr(exposition, "SOURCE_COUNTERS", (*exposition.SOURCE_COUNTERS, plain, kinded))
    monkeypatch.setattr(exposition, "SELF_METRICS", {**exposition.SELF_METRICS, plain.name: ("counter", "Probe."),
                                                     kinded.name: ("counter", "Probe.")})
    store = Store()
    a, b = SourceStats(up=True, state="up"), SourceStats(up=True, state="up")
    b.counter(plain.name)[""] += 2
    b.counter(kinded.name)["late"] += 1
    store.add(SourceState("a", stats=a))
    store.add(SourceState("b", stats=b))
    text = exposition.Renderer(load_schema()).render(store).text.decode()
    got = {k: v for k, v in parse(text).items() if "probe" in k}
    assert got == {f'{SELF}probe_overruns_total{{source="a"}}': 0, f'{SELF}probe_overruns_total{{source="b"}}': 2,
                   f'{SELF}probe_drops_total{{source="a",why="full"}}': 0,
                   f'{SELF}probe_drops_total{{source="b",why="full"}}': 0,
                   f'{SELF}probe_drops_total{{source="b",why="late"}}': 1}
    assert "# TYPE unified_gpu_exporter_probe_overruns_total counter" in text


def test_declarations_are_checked():
    with pytest.raises(ValueError, match="ends in _total"):
        SelfMetric("probe_overruns", "counter", "x", scope="source")
    with pytest.raises(ValueError, match="at most one label"):
        SelfMetric("probe_total", "counter", "x", ("a", "b"), "source")
