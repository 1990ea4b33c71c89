#!/usr/bin/env python3
"""Device check for the PCIe link metrics and the series budget on a real NVIDIA GPU.

  python3 deploy/device-check/nvml_pcie_check.py      # prints JSON; needs pynvml (nvidia-ml-py)

1. The raw NVML calls the exporter uses for gpu_pcie_link_{speed_gts,width,max_speed_gts,max_width}
   (generation and width, current and max) and their neighbours, with types, so tests/fakes stays
   faithful.
2. When the exporter's dependencies import: one `--once`-style render with only the NVML source,
   default and `profile: minimal`, and the series per GPU of each.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

CALLS = ("nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkGeneration",
         "nvmlDeviceGetGpuMaxPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
         "nvmlDeviceGetMaxPcieLinkWidth", "nvmlDeviceGetPcieSpeed", "nvmlDeviceGetPcieLinkMaxSpeed")


def raw() -> list[dict]:
    import pynvml as nv

    nv.nvmlInit()
    out = []
    try:
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            dev = {"index": i, "name": str(nv.nvmlDeviceGetName(h))}
            for fn in CALLS:
                try:
                    v = getattr(nv, fn)(h)
                    dev[fn] = {"value": v, "type": type(v).__name__}
                except Exception as exc:  # noqa: BLE001 (report every NVML error as data)
                    dev[fn] = {"error": f"{type(exc).__name__}: {exc}"}
            out.append(dev)
    finally:
        nv.nvmlShutdown()
    return out


def exporter() -> dict:
    import asyncio

    from exporter.run.daemon import Daemon, Settings

    others = ("dcgm", "amdgpu", "amdsmi", "intel", "levelzero", "fdinfo", "upstream", "profiles")
    result = {}
    tmp = Path(tempfile.mkdtemp())
    for profile in ("default", "minimal"):
        cfg = tmp / f"{profile}.yml"
        cfg.write_text(f"exposition: {{profile: {profile}}}\n")
        d = Daemon(Settings(config_path=cfg, collectors={"nvml": True, **{c: False for c in others}},
                            state_dir=tmp / profile))
        text, rc = asyncio.run(d.run_once())
        lines = [ln for ln in text.decode().splitlines() if ln and not ln.startswith("#")]
        gpus = sum(1 for ln in lines if ln.startswith("gpu_info{"))
        per_gpu = sum(1 for ln in lines if 'uuid="' in ln) / max(gpus, 1)
        result[profile] = {"rc": rc, "gpus": gpus, "series_per_gpu": per_gpu,
                           "pcie": [ln for ln in lines if ln.startswith("gpu_pcie_link")]}
    return result


if __name__ == "__main__":
    report: dict = {"raw": raw()}
    try:
        report["exporter"] = exporter()
    except ImportError as exc:
        report["exporter"] = {"skipped": f"exporter dependencies missing: {exc}"}
    print(json.dumps(report, indent=1, default=str))
