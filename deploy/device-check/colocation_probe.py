#!/usr/bin/env python3
"""What NVML and GPM report when memory-bound work runs alone and when two jobs share one GPU.

    python3 deploy/device-check/colocation_probe.py      # needs torch (CUDA) and nvidia-ml-py

Standalone: only pynvml and torch, no project code, so it calibrates the detection rules
(``docs/detection.md``) independently of them.  Worker processes (separate OS processes, as two
tenants would be) initialise CUDA first and then wait for a start file, so each phase begins with
all its workers ready.  Each worker appends its own achieved throughput every ~0.5 s, which gives
the slowdown a co-located tenant causes.

Phases: idle; one copy job alone; two copy jobs co-located; one bf16 matmul alone; matmul plus a
copy job.  Every 0.5 s the sampler records utilization rates, GPM (SM util, occupancy, DRAM
bandwidth, tensor), the compute process list, per-process utilization, clocks, power and throttle
reasons.  Writes ``samples.json`` and ``summary.txt`` to $OUT (or ./colocation-out) and prints a
per-phase table.  Never touches clocks, power limits or modes.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(os.environ.get("OUT") or "colocation-out")
OUT.mkdir(parents=True, exist_ok=True)
CTL = Path("/tmp/colocation-ctl")

WORKER = r"""
import os, sys, time, torch
kind, name, ctl = sys.argv[1], sys.argv[2], sys.argv[3]
dev = torch.device("cuda")
if kind == "copy":
    n = 1 << 30                                   # 2 GiB of bf16 per buffer, far beyond L2
    src = torch.randn(n, dtype=torch.bfloat16, device=dev); dst = torch.empty_like(src)
    per_iter = 2 * src.numel() * src.element_size()  # bytes read + written
    step = lambda: dst.copy_(src)
else:
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev); b = torch.randn_like(a)
    per_iter = 2 * 8192 ** 3                      # flops
    step = lambda: torch.mm(a, b)
step(); torch.cuda.synchronize()
open(f"{ctl}/{name}.ready", "w").close()
while not os.path.exists(f"{ctl}/{name}.go"):
    time.sleep(0.01)
log = open(f"{ctl}/{name}.rate", "w", buffering=1)
while not os.path.exists(f"{ctl}/{name}.stop"):
    t0 = time.perf_counter(); k = 0
    while time.perf_counter() - t0 < 0.5:
        step(); k += 1
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    log.write(f"{time.time():.3f} {per_iter * k / dt / 1e9:.1f}\n")
"""

PHASES = [
    ("idle", [], 8),
    ("copy_alone", [("copy", "c1")], 20),
    ("copy_x2_colocated", [("copy", "c1"), ("copy", "c2")], 20),
    ("matmul_alone", [("mm", "m1")], 15),
    ("matmul_plus_copy", [("mm", "m1"), ("copy", "c1")], 20),
    ("idle_after", [], 5),
]

GPM_IDS = {"GRAPHICS_UTIL": 1, "SM_UTIL": 2, "SM_OCCUPANCY": 3, "INTEGER_UTIL": 4,
           "ANY_TENSOR_UTIL": 5, "DRAM_BW_UTIL": 10}


def guard(fn, *a):
    try:
        return fn(*a), None
    except Exception as exc:  # noqa: BLE001 - record what the hardware said
        return None, repr(exc)


class Sampler:
    def __init__(self, nv, h):
        self.nv, self.h = nv, h
        self.prev = None
        self.proc_ts = 0
        self.gpm_ok = bool(guard(lambda: nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)[0])

    def gpm(self) -> dict:
        nv, h = self.nv, self.h
        if not self.gpm_ok:
            return {}
        cur = nv.nvmlGpmSampleAlloc()
        nv.nvmlGpmSampleGet(h, cur)
        out: dict = {}
        if self.prev is not None:
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(GPM_IDS)
            mg.sample1, mg.sample2 = self.prev, cur
            for j, mid in enumerate(GPM_IDS.values()):
                mg.metrics[j].metricId = mid
            nv.nvmlGpmMetricsGet(mg)
            for j, key in enumerate(GPM_IDS):
                m = mg.metrics[j]
                out[key] = round(float(m.value), 3) if int(m.nvmlReturn) == 0 else f"rc{int(m.nvmlReturn)}"
            nv.nvmlGpmSampleFree(self.prev)
        self.prev = cur
        return out

    def sample(self) -> dict:
        nv, h = self.nv, self.h
        s: dict = {"t": time.time()}
        u, e = guard(nv.nvmlDeviceGetUtilizationRates, h)
        s["util_gpu"], s["util_mem"] = (u.gpu, u.memory) if u else (None, None)
        g, e = guard(self.gpm)
        s["gpm"] = g if g is not None else e
        procs, e = guard(nv.nvmlDeviceGetComputeRunningProcesses, h)
        s["compute_procs"] = ([{"pid": p.pid, "mem": p.usedGpuMemory} for p in procs]
                              if procs is not None else e)
        pu, e = guard(nv.nvmlDeviceGetProcessUtilization, h, self.proc_ts)
        if pu is not None:
            s["proc_util"] = [{"pid": p.pid, "sm": p.smUtil, "mem": p.memUtil, "ts": p.timeStamp} for p in pu]
            self.proc_ts = max([p.timeStamp for p in pu] + [self.proc_ts])
        else:
            s["proc_util"] = e
        s["sm_clock"] = guard(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)[0]
        s["mem_clock"] = guard(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)[0]
        p = guard(nv.nvmlDeviceGetPowerUsage, h)[0]
        s["power_w"] = p / 1000 if p is not None else None
        s["throttle"] = guard(nv.nvmlDeviceGetCurrentClocksEventReasons, h)[0]
        s["temp"] = guard(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)[0]
        return s


def start_workers(specs, procs):
    for kind, name in specs:
        if name not in procs:
            procs[name] = subprocess.Popen([sys.executable, "-c", WORKER, kind, name, str(CTL)])
    deadline = time.time() + 90
    while time.time() < deadline and not all((CTL / f"{n}.ready").exists() for _, n in specs):
        time.sleep(0.05)
    for _, name in specs:
        (CTL / f"{name}.go").touch()


def stop_workers(keep, procs):
    for name in list(procs):
        if name not in keep:
            (CTL / f"{name}.stop").touch()
            try:
                procs[name].wait(timeout=20)
            except subprocess.TimeoutExpired:
                procs[name].kill()
            del procs[name]
            for suffix in ("ready", "go", "stop"):
                (CTL / f"{name}.{suffix}").unlink(missing_ok=True)


def rates(name: str, t0: float, t1: float) -> list[float]:
    try:
        lines = (CTL / f"{name}.rate").read_text().split()
    except OSError:
        return []
    vals = [(float(lines[i]), float(lines[i + 1])) for i in range(0, len(lines) - 1, 2)]
    return [v for t, v in vals if t0 + 1.0 <= t <= t1]   # a kept worker's file spans phases


def main() -> int:
    import pynvml as nv

    if CTL.exists():
        for f in CTL.iterdir():
            f.unlink()
    CTL.mkdir(exist_ok=True)
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    info = {"name": nv.nvmlDeviceGetName(h), "driver": nv.nvmlSystemGetDriverVersion(),
            "compute_mode": guard(nv.nvmlDeviceGetComputeMode, h)[0]}
    print("device:", info, flush=True)
    sampler = Sampler(nv, h)
    procs: dict[str, subprocess.Popen] = {}
    samples: list[dict] = []
    phase_rates: dict[str, dict[str, list[float]]] = {}
    try:
        for phase, specs, secs in PHASES:
            stop_workers({n for _, n in specs}, procs)
            start_workers(specs, procs)
            t0 = time.time()
            print(f"phase {phase} ({secs} s, workers {[n for _, n in specs]})", flush=True)
            while time.time() - t0 < secs:
                s = sampler.sample()
                s["phase"] = phase
                samples.append(s)
                time.sleep(max(0.0, 0.5 - (time.time() - s["t"])))
            phase_rates[phase] = {n: rates(n, t0, time.time()) for _, n in specs}
    finally:
        stop_workers(set(), procs)
        nv.nvmlShutdown()
    (OUT / "samples.json").write_text(json.dumps({"device": info, "samples": samples,
                                                  "worker_rates": phase_rates}, indent=1, default=str))
    lines = ["phase | n | util_gpu | util_mem | GPM sm_util | occupancy | dram_bw | tensor | procs | "
             "proc_util entries | worker rates (GB/s or GFLOP/s, median)"]
    for phase, _, _ in PHASES:
        ss = [s for s in samples if s["phase"] == phase][1:]

        def med(key, sub=None, ss=ss):
            if sub:
                vals = [s[sub].get(key) for s in ss if isinstance(s.get(sub), dict)]
            else:
                vals = [s.get(key) for s in ss]
            vals = [v for v in vals if isinstance(v, (int, float))]
            return f"{statistics.median(vals):.1f}" if vals else "-"
        nprocs = [len(s["compute_procs"]) for s in ss if isinstance(s["compute_procs"], list)]
        npu = [len(s["proc_util"]) for s in ss if isinstance(s["proc_util"], list)]
        wr = {n: f"{statistics.median(v):.0f}" if v else "-" for n, v in phase_rates.get(phase, {}).items()}
        lines.append(f"{phase} | {len(ss)} | {med('util_gpu')} | {med('util_mem')} | {med('SM_UTIL', 'gpm')} | "
                     f"{med('SM_OCCUPANCY', 'gpm')} | {med('DRAM_BW_UTIL', 'gpm')} | {med('ANY_TENSOR_UTIL', 'gpm')} | "
                     f"{max(nprocs) if nprocs else '-'} | {max(npu) if npu else '-'} | {wr}")
    text = "\n".join(lines)
    (OUT / "summary.txt").write_text(text + "\n")
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
