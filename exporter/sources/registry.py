"""Known collectors: name -> where the source class lives, and whether it is on by default.

Modules are imported only when the collector is enabled, so a missing vendor binding or a broken
optional dependency turns that one source off (with the reason) and never breaks start-up.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from .base import Source, SourceUnavailable
from .context import SourceContext


@dataclass(frozen=True)
class Collector:
    name: str
    module: str
    cls: str
    default: bool  # on unless --no-collector.<name>; off ones need --collector.<name>
    description: str


COLLECTORS: dict[str, Collector] = {c.name: c for c in [
    Collector("nvml", "exporter.sources.nvml", "NvmlSource", True,
              "NVIDIA GPUs through NVML (nvidia-ml-py), GPM on Hopper and newer"),
    Collector("dcgm", "exporter.sources.dcgm", "DcgmSource", True,
              "NVIDIA DCGM profiling fields (needs the DCGM Python bindings)"),
    Collector("amdgpu", "exporter.sources.amdgpu_sysfs", "AmdgpuSysfsSource", True,
              "AMD GPUs through amdgpu sysfs and the gpu_metrics table"),
    Collector("amdsmi", "exporter.sources.amdsmi", "AmdsmiSource", True,
              "AMD GPUs through amdsmi (ECC, XGMI, partitions)"),
    Collector("intel", "exporter.sources.intel_sysfs", "IntelSysfsSource", True,
              "Intel GPUs through i915/xe sysfs and hwmon"),
    Collector("levelzero", "exporter.sources.levelzero", "LevelZeroSource", True,
              "Intel GPUs through Level Zero Sysman (pyzes)"),
    Collector("fdinfo", "exporter.sources.drm_fdinfo", "DrmFdinfoSource", True,
              "busy clients per GPU from DRM fdinfo (count-only by default; per-process series "
              "with processes: series)"),
    Collector("upstream", "exporter.sources.upstream", "UpstreamSource", False,
              "scrape vendor exporters already on the node and normalise their series"),
    Collector("profiles", "exporter.importers.profiles_source", "ProfilesSource", False,
              "profiler artifacts (ncu, nsys, rocprof, Kineto) from a drop directory"),
    Collector("simulator", "exporter.simulate", "SimulatorSource", False,
              "the built-in simulated node (--simulate)"),
]}


def create_source(collector: Collector, context: SourceContext) -> Source:
    """Instantiate a collector's source with its context (every source takes exactly that)."""
    try:
        module = importlib.import_module(collector.module)
        cls = getattr(module, collector.cls)
    except Exception as exc:  # an optional dependency may fail in any way at import
        raise SourceUnavailable(f"cannot load {collector.module}: {type(exc).__name__}: {exc}") from exc
    return cls(context)
