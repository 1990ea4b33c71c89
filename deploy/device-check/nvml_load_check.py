"""Serve the NVML source on a real NVIDIA GPU under scripted load and record the memory state.

    python3 deploy/device-check/nvml_load_check.py      # from the repo root; needs torch + CUDA

Phases (about 3.5 minutes in all, hard limit 5.5 minutes):
  idle        nothing running on the GPU                              expected state: idle
  one_copy    ONE OS process running a DRAM copy loop (memory-bound)   expected: healthy or
              memory_bound, never contended (one active client; on an H200 the loop ran at
              87 % DRAM bandwidth with 79 % occupancy: no signature, so healthy)
  two_copies  TWO OS processes running the same copy loop co-located  expected: contended
              (two active clients; on an H200 the aggregate bandwidth fell to 78 %, reason
              clients_sharing_bandwidth; colocation_probe.py has the raw numbers)
  idle_after  both workers gone                                       expected: idle

The exporter runs as a subprocess (NVML collector only, per-process data on, 1 s full polls,
250 ms fast polls).  This script scrapes /metrics every 0.5 s and writes, to $OUT (or
./nvml-check-out):
  load_samples.json  every scrape's watched series, tagged by phase
  load_summary.txt   per phase: mean / min / max of each watched series
  state_table.txt    per phase: scrapes per gpu_memory_state, the reasons, active clients,
                     contended seconds, bandwidth, occupancy, SM active (also printed)
Exit code 0 when every phase produced samples and the exporter stayed up (the state verdicts
are reported, not enforced: they are what this check is for).

The exporter needs pydantic (+ pydantic-core, annotated-types, typing-extensions,
typing-inspection) and bcrypt besides aiohttp, PyYAML, prometheus-client and nvidia-ml-py.
Missing ones are listed at start.  A directory ``.device-pylib`` at the repo root (for example
``pip install --target .device-pylib <wheels>``) is put on the exporter's PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYLIB = REPO / ".device-pylib"
DEADLINE = 330.0  # seconds: the whole script stays under 5.5 minutes
WATCH = {
    "gpu_compute_utilization_percent", "gpu_compute_occupancy_percent", "gpu_sm_active_percent",
    "gpu_memory_bandwidth_utilization_percent", "gpu_memory_bandwidth_gbps", "gpu_power_watts",
    "gpu_memory_state", "gpu_memory_state_info", "gpu_active_clients", "gpu_memory_contention",
    "gpu_memory_contention_seconds_total", "gpu_memory_bound_reference_percent",
    "gpu_contention_slowdown_ratio", "gpu_contention_cause_info", "gpu_process_utilization_percent",
    "gpu_process_memory_bytes", "unified_gpu_exporter_source_up",
}
LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_]+)="((?:[^"\\]|\\.)*)"')
EXPORTER_DEPS = ("pydantic", "pydantic_core", "annotated_types", "typing_extensions", "typing_inspection",
                 "bcrypt", "aiohttp", "yaml", "prometheus_client", "pynvml")
CONFIG = """\
collectors:
  nvml: {interval: 1s, timeout: 2s, options: {processes: true, processes_top_n: 10}}
"""
# one memory-bound worker: a DRAM-to-DRAM copy loop (2 x 2 GiB buffers) until stdin closes
WORKER = r"""
import sys, threading, torch
a = torch.empty(1 << 29, dtype=torch.float32, device="cuda")
b = torch.empty_like(a)
b.copy_(a); torch.cuda.synchronize()
print("ready", flush=True)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
while not stop.is_set():
    for _ in range(20):
        b.copy_(a)
    torch.cuda.synchronize()
"""


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


def labels(key: str) -> dict[str, str]:
    return dict(LABEL.findall(key[key.find("{"):])) if "{" in key else {}


def missing_modules(env: dict[str, str]) -> list[str]:
    code = ("import importlib.util, sys\n"
            f"print(' '.join(m for m in {EXPORTER_DEPS!r} if importlib.util.find_spec(m) is None))")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    return res.stdout.split()


class Worker:
    """One torch process running the copy loop; stops when its stdin closes."""

    def __init__(self, name: str, log_dir: Path):
        self.name = name
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=open(log_dir / f"{name}.log", "w"),
                                     text=True)

    def wait_ready(self, timeout: float) -> bool:
        box: list[str] = []
        t = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        return bool(box) and box[0].strip() == "ready"

    def stop(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(5)


def per_gpu(rows: list[dict[str, float]]) -> dict[str, dict[str, list]]:
    """gpu index -> watched facts per scrape."""
    out: dict[str, dict[str, list]] = {}
    for row in rows:
        seen: dict[str, dict] = {}
        for key, value in row.items():
            lab = labels(key)
            gpu = lab.get("gpu")
            if gpu is None:
                continue
            d = seen.setdefault(gpu, {"procs": 0})
            name = key.split("{", 1)[0]
            if name == "gpu_memory_state" and value == 1.0:
                d["state"] = lab.get("state")
            elif name == "gpu_memory_state_info":
                d["reason"] = lab.get("reason")
            elif name == "gpu_process_utilization_percent" and value >= 5:
                d["procs"] += 1
            elif name == "gpu_memory_contention_seconds_total":
                d["contended_s"] = d.get("contended_s", 0.0) + value
            elif name in ("gpu_active_clients", "gpu_memory_bandwidth_utilization_percent",
                          "gpu_compute_occupancy_percent", "gpu_sm_active_percent",
                          "gpu_memory_bound_reference_percent", "gpu_contention_slowdown_ratio"):
                d[name] = value
            elif name == "gpu_contention_cause_info":
                d["cause"] = lab.get("cause")
        for gpu, d in seen.items():
            g = out.setdefault(gpu, {})
            for k, v in d.items():
                g.setdefault(k, []).append(v)
    return out


def mean(vals: list) -> str:
    nums = [v for v in vals if isinstance(v, (int, float))]
    return f"{statistics.fmean(nums):.1f}" if nums else "-"


def state_table(samples: list[dict]) -> str:
    expected = {"idle": "idle", "one_copy": "memory_bound", "two_copies": "contended", "idle_after": "idle"}
    lines = ["phase       gpu scrapes states (count)                          reasons                              "
             "clients procs>=5% contended_s(start->end) bw%   occ%  sm%   ref%  expected"]
    for phase in dict.fromkeys(s["phase"] for s in samples):
        rows = [s["values"] for s in samples if s["phase"] == phase]
        for gpu, d in sorted(per_gpu(rows).items()):
            states = Counter(d.get("state", []))
            reasons = Counter(d.get("reason", []))
            cs = d.get("contended_s", [])
            lines.append(
                f"{phase:<11} {gpu:<3} {len(rows):<7} "
                f"{', '.join(f'{k} {v}' for k, v in states.most_common()):<40} "
                f"{', '.join(f'{k} {v}' for k, v in reasons.most_common(2)):<36} "
                f"{mean(d.get('gpu_active_clients', [])):<7} {mean(d.get('procs', [])):<9} "
                f"{(f'{cs[0]:.1f}->{cs[-1]:.1f}' if cs else '-'):<24} "
                f"{mean(d.get('gpu_memory_bandwidth_utilization_percent', [])):<5} "
                f"{mean(d.get('gpu_compute_occupancy_percent', [])):<5} "
                f"{mean(d.get('gpu_sm_active_percent', [])):<5} "
                f"{mean(d.get('gpu_memory_bound_reference_percent', [])):<5} {expected.get(phase, '-')}")
    return "\n".join(lines)


def main() -> int:
    started = time.monotonic()
    out_dir = Path(os.environ.get("OUT") or "nvml-check-out")
    out_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if PYLIB.is_dir():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PYLIB), str(REPO), env.get("PYTHONPATH", "")) if p)
    else:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    missing = missing_modules(env)
    if missing:
        msg = (f"the exporter cannot start here: missing Python modules {missing}; carry their wheels "
               f"(see /work/notes/issue14-device.md) into {PYLIB} (pip install --target)")
        print(msg, file=sys.stderr)
        (out_dir / "load_summary.txt").write_text(msg + "\n")
        return 2
    state_dir = Path(tempfile.mkdtemp(prefix="uge-state-"))
    cfg = state_dir / "exporter.yml"
    cfg.write_text(CONFIG)
    port = free_port()
    off = [f"--no-collector.{c}" for c in ("dcgm", "amdgpu", "amdsmi", "intel", "levelzero")]
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", "--config.file", str(cfg), "--collector.nvml", *off,
         "--poll.interval", "1s", "--poll.fast-interval", "250ms", "--state.dir", str(state_dir),
         "--web.listen-address", f"127.0.0.1:{port}", "--log.level", "info"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=open(out_dir / "load_exporter.log", "w"))
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

    for _ in range(120):  # wait for the server (up to 30 s)
        try:
            scrape(url)
            break
        except OSError:
            time.sleep(0.25)
    thread = threading.Thread(target=scraper, daemon=True)
    thread.start()
    workers: list[Worker] = []

    def hold(name: str, seconds: float) -> None:
        phase["name"] = name
        end = min(time.monotonic() + seconds, started + DEADLINE - 5)
        while time.monotonic() < end and proc.poll() is None:
            time.sleep(0.2)

    try:
        hold("idle", 20)
        phase["name"] = "start_one"
        workers.append(Worker("worker1", out_dir))
        if not workers[0].wait_ready(60):
            raise RuntimeError("worker1 did not start (see worker1.log)")
        hold("one_copy", 60)  # the memory-bound reference warms in 30 s
        phase["name"] = "start_two"
        workers.append(Worker("worker2", out_dir))
        if not workers[1].wait_ready(60):
            raise RuntimeError("worker2 did not start (see worker2.log)")
        hold("two_copies", 60)
        for w in workers:
            w.stop()
        workers.clear()
        hold("idle_after", 15)
    except Exception as exc:  # noqa: BLE001 - record the failure, still save what was scraped
        print(f"load generation failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        for w in workers:
            w.stop()
        stop.set()
        thread.join(2)
        proc.terminate()
        try:
            rc = proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = -9
    (out_dir / "load_samples.json").write_text(json.dumps(samples, indent=1))
    lines = [f"exporter exit code after SIGTERM: {rc}", f"elapsed: {time.monotonic() - started:.0f} s"]
    for p in dict.fromkeys(s["phase"] for s in samples):
        rows = [s["values"] for s in samples if s["phase"] == p]
        lines.append(f"\n== {p} ({len(rows)} scrapes)")
        for key in sorted({k for r in rows for k in r}):
            vals = [r[key] for r in rows if key in r]
            lines.append(f"  {key} mean={statistics.fmean(vals):.4g} min={min(vals):.4g} max={max(vals):.4g}")
    (out_dir / "load_summary.txt").write_text("\n".join(lines) + "\n")
    table = state_table(samples)
    (out_dir / "state_table.txt").write_text(table + "\n")
    print("\n".join(lines[:2]))
    print(table)
    ok = rc == 0 and all(any(s["phase"] == p for s in samples) for p in ("idle", "one_copy", "two_copies"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
