""""Fast" is declared once: `fast: true` on a metric in mappings/canonical.yaml.

What a source's poll_fast reads comes from that declaration (through SourceContext.fast, as the
daemon builds it), so taking `fast: true` off a metric stops the sources reading its raw fields
between full polls, and the daemon hands every source the same table.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from exporter.map.schema import default_mappings_dir
from exporter.sources.amdgpu_sysfs import AmdgpuSysfsSource
from exporter.sources.nvml import NvmlSource
from exporter.testing import load_mappings, shipped_context
from tests.amd_fixture_tree import arrange_mi300x_node
from tests.fakes import pynvml_fake as pf

BANDWIDTH = "gpu_memory_bandwidth_utilization_percent"


def _without_fast(tmp_path: Path, metric: str):
    """The shipped mapping set with `fast: true` taken off ``metric``."""
    root = tmp_path / "mappings"
    shutil.copytree(default_mappings_dir(), root)
    canonical = root / "canonical.yaml"
    lines = canonical.read_text().splitlines(keepends=True)
    start = lines.index(f"  {metric}:\n")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("  ") and not lines[i].startswith("   "))
    block = [line for line in lines[start:end] if line.strip() != "fast: true"]
    assert len(block) == end - start - 1, "the metric was declared fast"
    canonical.write_text("".join(lines[:start] + block + lines[end:]))
    mappings = load_mappings(root)
    assert metric not in mappings.schema.fast_metrics
    return mappings


def _amdgpu_fast_fields(tmp_path: Path, mappings=None) -> set[str]:
    sysfs = tmp_path / "sys"
    arrange_mi300x_node(sysfs)
    src = AmdgpuSysfsSource(shipped_context(mappings, sysfs=sysfs, options={"pcie_bw": False}))
    src.open()
    try:
        return {r.field for r in src.poll_fast().readings}
    finally:
        src.close()


def test_amdgpu_fast_poll_reads_what_canonical_declares_fast(tmp_path):
    assert _amdgpu_fast_fields(tmp_path / "a") == {"gpu_busy_percent", "mem_busy_percent"}
    # bandwidth no longer fast: its busy file is not read between full polls
    assert _amdgpu_fast_fields(tmp_path / "b", _without_fast(tmp_path, BANDWIDTH)) == {"gpu_busy_percent"}


def _nvml_fast_fields(mappings=None) -> set[str]:
    fake = pf.make_module([pf.h100(0)])
    t = [0.0]
    src = NvmlSource(shipped_context(mappings, options={"xid": False}), module=fake, clock=lambda: t[0])
    src.open()
    try:
        src.poll()                                  # seeds the GPM stream
        t[0] += 0.5
        fake.fake_advance(0.5)
        return {r.field for r in src.poll_fast().readings}
    finally:
        src.close()


def test_nvml_fast_poll_reads_what_canonical_declares_fast(tmp_path):
    full = _nvml_fast_fields()
    assert {"utilization.gpu", "gpm.dram_bw_util", "gpm.sm_occupancy"} <= full
    cut = _nvml_fast_fields(_without_fast(tmp_path, BANDWIDTH))
    # the GPM DRAM bandwidth and utilization.memory feed only the bandwidth metric
    assert "gpm.dram_bw_util" not in cut and "gpm.sm_occupancy" in cut
    assert full - cut == {"gpm.dram_bw_util"}  # utilization.memory still comes with utilization.gpu


def test_the_daemon_hands_sources_the_fast_fields_of_its_mapping_set(tmp_path, monkeypatch):
    from exporter.run import daemon as daemon_mod
    from exporter.run.settings import Settings

    seen = []
    real = daemon_mod.build_runner

    def spy(col, explicit, context, *args, **kw):
        seen.append(context)
        return real(col, explicit, context, *args, **kw)

    monkeypatch.setattr(daemon_mod, "build_runner", spy)
    d = daemon_mod.Daemon(Settings(sysfs=tmp_path, procfs=tmp_path, simulate="demo", state_dir=tmp_path / "state"))
    d.load()
    d.build_runtimes()
    mappings = d.mappings
    assert seen and all(c.fast == mappings.raw_fields(mappings.schema.fast_metrics) for c in seen)
