"""Serve the NVML source on a real NVIDIA GPU under scripted load and record what it exported.

    python deploy/device-check/nvml_load_check.py        # needs torch with CUDA for the load

Phases: idle, a memory-bound copy loop (DRAM bandwidth high), a compute-bound bf16 matmul loop,
idle again.  The exporter runs as a subprocess (NVML collector only, 500 ms polls); this script
scrapes /metrics every 0.5 s and writes, to $OUT (or ./nvml-check-out):
  load_samples.json  every scrape's values of the watched canonical series, tagged by phase
  load_summary.txt   per phase: mean of each watched series
Exit code 0 when every phase produced samples and the exporter stayed up.
"""

from __future__ import annotations

import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

WATCH = [
    "gpu_compute_utilization_percent", "gpu_compute_occupancy_percent", "gpu_sm_active_percent",
    "gpu_tensor_utilization_percent", "gpu_memory_bandwidth_utilization_percent",
    "gpu_memory_bandwidth_gbps", "gpu_power_watts", "gpu_memory_contention",
    "gpu_memory_contention_seconds_total", "gpu_contention_cause_info", "gpu_energy_joules_total",
    "gpu_metric_cov", "unified_gpu_exporter_source_up",
]
LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    with urllib.request.urlopen(url, timeout=2) as resp:
        for line in resp.read().decode().splitlines():
            m = LINE.match(line)
            if m and m.group(1) in WATCH:
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def main() -> int:
    out_dir = Path(os.environ.get("OUT") or "nvml-check-out")
    out_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    off = [f"--no-collector.{c}" for c in ("dcgm", "amdgpu", "amdsmi", "intel", "levelzero")]
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", "--collector.nvml", *off, "--poll.interval", "500ms",
         "--web.listen-address", f"127.0.0.1:{port}", "--log.level", "info"],
        stdout=subprocess.DEVNULL, stderr=open(out_dir / "load_exporter.log", "w"))
    url = f"http://127.0.0.1:{port}/metrics"
    phase = {"name": "startup"}
    samples: list[dict] = []
    stop = threading.Event()

    def scraper() -> None:
        while not stop.is_set():
            try:
                samples.append({"t": time.time(), "phase": phase["name"], "values": scrape(url)})
            except OSError:
                pass
            stop.wait(0.5)

    for _ in range(40):  # wait for the server
        try:
            scrape(url)
            break
        except OSError:
            time.sleep(0.25)
    thread = threading.Thread(target=scraper, daemon=True)
    thread.start()
    try:
        import torch

        dev = torch.device("cuda")
        a = torch.empty(1 << 30, dtype=torch.float32, device=dev)  # 4 GiB
        b = torch.empty_like(a)
        m1 = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
        m2 = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)

        def run(name: str, seconds: float, step) -> None:
            phase["name"] = name
            end = time.time() + seconds
            while time.time() < end:
                if step:
                    for _ in range(10):
                        step()
                    torch.cuda.synchronize()
                else:
                    time.sleep(0.05)

        run("idle", 5, None)
        run("copy_memory_bound", 8, lambda: b.copy_(a))
        run("matmul_compute_bound", 8, lambda: torch.matmul(m1, m2))
        run("idle_after", 4, None)
    except Exception as exc:  # noqa: BLE001 - record the failure, still save what was scraped
        print(f"load generation failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        stop.set()
        thread.join(2)
        proc.terminate()
        try:
            rc = proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = -9
    (out_dir / "load_samples.json").write_text(json.dumps(samples, indent=1))
    lines = [f"exporter exit code after SIGTERM: {rc}"]
    phases = [p for p in dict.fromkeys(s["phase"] for s in samples)]
    for p in phases:
        rows = [s["values"] for s in samples if s["phase"] == p]
        lines.append(f"\n== {p} ({len(rows)} scrapes)")
        for key in sorted({k for r in rows for k in r}):
            vals = [r[key] for r in rows if key in r]
            lines.append(f"  {key} mean={statistics.fmean(vals):.4g} min={min(vals):.4g} max={max(vals):.4g}")
    summary = "\n".join(lines)
    (out_dir / "load_summary.txt").write_text(summary)
    print(summary)
    ok = rc == 0 and all(any(s["phase"] == p for s in samples) for p in
                         ("idle", "copy_memory_bound", "matmul_compute_bound"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
