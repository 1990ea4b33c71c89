"""Series per GPU (README "Series budget"): the default exposition and the minimal profile, on the
faithful NVML fake (two H100) and on the simulated node, measured in steady state (150 poll cycles
on a fake clock so the indicator windows -- percentiles, variability, baselines -- are full).
Plus the filters themselves: include/exclude globs and the label allow-list."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from exporter.map.schema import load_schema
from exporter.render.seriesfilter import ExpositionConfig, SeriesFilter
from exporter.run.daemon import Daemon, Settings
from exporter.sources.options import NvmlOptions
from tests.fakes import pynvml_fake as pf

# Documented budgets (README): series per GPU, steady state, default collectors' options.  The
# simulated node's demo carries the health series (ECC, XID, row remap, PCIe link, NVLink, fan)
# its GPU Health dashboard and alerts show.
BUDGET = {("nvml", "default"): 100, ("nvml", "minimal"): 25,
          ("simulated", "default"): 70, ("simulated", "minimal"): 25}
README = Path(__file__).resolve().parent.parent / "README.md"
# README "Series budget": the row of each node (its measured numbers are checked against this test's)
README_ROW = {"nvml": "| NVIDIA H100 (faithful NVML fake", "simulated": "| simulated node (`--simulate`"}
OTHER_SOURCES = ("dcgm", "amdgpu", "amdsmi", "intel", "levelzero", "fdinfo", "upstream", "profiles")

# what the minimal profile serves (README "Series budget"), written out by hand: the profile is
# declared per metric (`minimal: true` in mappings/canonical.yaml)
MINIMAL = {
    "gpu_info", "gpu_compute_utilization_percent", "gpu_memory_used_bytes", "gpu_memory_total_bytes",
    "gpu_memory_bandwidth_utilization_percent", "gpu_memory_contention", "gpu_memory_contention_seconds_total",
    "gpu_temperature_celsius", "gpu_power_watts", "gpu_energy_joules_total", "gpu_ecc_errors_total",
    "gpu_memory_remapped_rows", "gpu_xid_errors_total", "gpu_pcie_link_width", "gpu_pcie_link_max_width",
    "gpu_pcie_link_speed_gts", "gpu_pcie_link_max_speed_gts",
}

GPM_WINDOW_S = 1.5 * NvmlOptions.model_fields["gpm_min_window_s"].default


def per_gpu(text: bytes) -> tuple[int, float]:
    lines = [ln for ln in text.decode().splitlines() if ln and not ln.startswith("#")]
    gpus = sum(1 for ln in lines if ln.startswith("gpu_info{"))
    per_device = [ln for ln in lines if 'uuid="' in ln]
    return gpus, len(per_device) / gpus


async def _steady(settings: Settings, cycles: int = 150) -> bytes:
    d = Daemon(settings)
    d.load()
    d.build_runtimes()
    d.build_feed()
    try:
        for i in range(cycles):
            if i >= cycles - 2:
                # a real poll interval apart, as on a node: GPM (two samples per value) emits only
                # over a window of at least gpm_min_window_s, so back-to-back polls served its
                # metrics by chance (88 or 92 series per H100)
                await asyncio.sleep(GPM_WINDOW_S)
            await asyncio.gather(*(d.poll_once(rt) for rt in d.runtimes))
            d.feed.update(10_000.0 + i, d.store)
        return (await d.render()).text
    finally:
        await d._close_sources(d.runtimes)
        d._render_worker.stop()
        d._state_worker.stop()


def _exposition(tmp_path, node: str, config: str, monkeypatch) -> bytes:
    cfg = tmp_path / "config.yml"
    cfg.write_text(config)
    if node == "nvml":
        monkeypatch.setitem(sys.modules, "pynvml", pf.make_module([pf.h100(0), pf.h100(1)]))
        (tmp_path / "empty").mkdir(exist_ok=True)
        settings = Settings(config_path=cfg, sysfs=tmp_path / "empty", procfs=tmp_path / "empty",
                            collectors={"nvml": True, **{c: False for c in OTHER_SOURCES}},
                            state_dir=tmp_path / "state")
    else:
        settings = Settings(config_path=cfg, simulate="demo", state_dir=tmp_path / "state")
    return asyncio.run(_steady(settings))


@pytest.mark.parametrize("node", ["nvml", "simulated"])
def test_series_per_gpu_default_and_minimal_profile_within_budget(tmp_path, node, monkeypatch, capsys):
    default_gpus, default = per_gpu(_exposition(tmp_path, node, "{}\n", monkeypatch))
    minimal_gpus, minimal = per_gpu(_exposition(tmp_path, node, "exposition: {profile: minimal}\n", monkeypatch))
    assert default_gpus == minimal_gpus == (2 if node == "nvml" else 5)
    with capsys.disabled():
        print(f"\nseries per GPU on {node}: default {default:.1f}, minimal {minimal:.1f}")
    assert default <= BUDGET[(node, "default")]
    assert minimal <= BUDGET[(node, "minimal")]
    assert minimal < default / 2
    row = next(ln for ln in README.read_text(encoding="utf-8").splitlines() if ln.startswith(README_ROW[node]))
    documented = [cell.strip() for cell in row.strip().strip("|").split("|")][1:]
    measured = [_number(default), _number(minimal), f"{BUDGET[(node, 'default')]} / {BUDGET[(node, 'minimal')]}"]
    assert documented == measured, f"README's series budget row for {node} is out of date: write {measured}"


def _number(x: float) -> str:
    """As the README writes a series count: one decimal, none when it is whole."""
    return f"{x:.1f}".removesuffix(".0")


def test_exclude_glob_and_label_allowlist_remove_series(tmp_path, monkeypatch):
    base = _exposition(tmp_path, "nvml", "collectors: {nvml: {options: {processes: true}}}\n", monkeypatch).decode()
    assert "gpu_process_memory_bytes{" in base and "gpu_clock_mhz{" in base
    text = _exposition(tmp_path, "nvml", """
collectors: {nvml: {options: {processes: true}}}
labels: {cluster: c1, team: ml}
exposition:
  exclude: ["gpu_clock_*"]
  label_allowlist: [cluster]
""", monkeypatch).decode()
    assert "gpu_clock_mhz{" not in text and "gpu_clock_max_mhz{" not in text
    # per-process series carry pid/process (optional labels): not on the list -> not served
    assert "gpu_process_memory_bytes{" not in text
    # required labels stay (sensor), the static label on the list stays, the other is removed
    temps = [ln for ln in text.splitlines() if ln.startswith("gpu_temperature_celsius{")]
    assert temps and all('sensor="' in ln and 'cluster="c1"' in ln and "team=" not in ln for ln in temps)
    assert "unified_gpu_exporter_build_info" in text  # self-metrics are not subject to include


def test_filter_decisions():
    schema = load_schema()
    f = SeriesFilter(ExpositionConfig(include=["gpu_memory_*", "gpu_info"], exclude=["gpu_memory_gtt_*"],
                                      label_allowlist=["pod"]), schema)
    assert f.family("gpu_memory_used_bytes") and f.family("gpu_info")
    assert not f.family("gpu_memory_gtt_used_bytes") and not f.family("gpu_power_watts")
    assert f.family("unified_gpu_exporter_source_up")  # include does not hide self-metrics
    dev = (("vendor", "nvidia"), ("gpu", "0"), ("uuid", "G"))
    assert f.labels_ok("gpu_memory_used_bytes", dev)
    assert not f.labels_ok("gpu_memory_used_bytes", dev + (("gpu_instance", "1"),))
    assert f.labels_ok("gpu_temperature_celsius", dev + (("sensor", "gpu"),))  # required label
    assert f.extra((("pod", "p"), ("team", "x"))) == (("pod", "p"),)
    minimal = SeriesFilter(ExpositionConfig(profile="minimal"), schema)
    assert {n for n in schema.metrics if minimal.family(n)} == MINIMAL


@pytest.mark.parametrize("conf,message", [
    ({"include": ["gpu_nope_*"]}, "matches no metric"),
    ({"exclude": ["gpu mem"]}, "not a metric name glob"),
    ({"label_allowlist": ["bad-label"]}, "not a valid label name"),
    ({"profile": "tiny"}, "profile"),
])
def test_invalid_filters_are_rejected(conf, message):
    with pytest.raises((ValidationError, ValueError), match=message):
        SeriesFilter(ExpositionConfig(**conf), load_schema())


def test_a_glob_matching_no_metric_is_a_config_error_naming_the_file(tmp_path):
    from exporter.yamlfile import ConfigError

    cfg = tmp_path / "config.yml"
    cfg.write_text("exposition:\n  exclude: [gpu_procss_*]\n")  # typo
    with pytest.raises(ConfigError, match=rf"{cfg}.*exposition.exclude.*matches no metric"):
        Daemon(Settings(config_path=cfg, simulate="demo")).load()
    cfg.write_text("exposition:\n  profle: minimal\n")
    with pytest.raises(ConfigError, match="profle"):
        Daemon(Settings(config_path=cfg, simulate="demo")).load()
