"""Run the exporter on a real NVIDIA GPU with NO configuration and record its memory states
through scripted load phases (issue 24: count-only co-tenancy evidence is the default).

How to run (from the repo root, on a machine with one NVIDIA GPU, torch with CUDA and python3):

    python3 deploy/device-check/nvml_load_check.py             # about 4 minutes, hard limit 5.5
    python3 deploy/device-check/nvml_load_check.py --dry-run   # no GPU: the NVML fake, no load

The exporter is started exactly as a default install would run it: no ``--config.file``, no
collector flags, default intervals (1 s polls, 500 ms fast polls), so the busy-client count is
NVML's count-only default and no per-process series is exported.  Only the listen address, a
throw-away ``--state.dir`` and ``--log.level info`` are given.  Nothing on the GPU is changed
(no clock, power limit, mode or MIG setting): the power-capped phase is a bf16 matmul that runs
into the board's own power limit.

Python packages the exporter needs besides what such a machine usually has (aiohttp, PyYAML,
prometheus-client, nvidia-ml-py, typing-extensions are in the device image): pydantic,
pydantic-core, annotated-types, typing-inspection and bcrypt, at the versions of constraints.txt.
The device machine has no network: fetch their wheels where pip works, carry them, install them
into ``.device-pylib`` (put on the exporter's PYTHONPATH by this script).  For example, here:

    echo /.whl/ >> .git/info/exclude; echo /.device-pylib/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_34_x86_64 -d .whl \
        pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
        bcrypt==5.0.0

and on the device machine (carry ``.whl``):

    python3 -m pip install -q --no-index --no-deps --target .device-pylib .whl/*.whl
    PYTHONUNBUFFERED=1 python3 deploy/device-check/nvml_load_check.py

Missing modules are listed at start (exit code 2).  Phases (``PHASES``; the three workers, two
copy loops and one matmul, are separate OS processes started and CUDA-initialised first, then
told to run or pause, so each phase starts with its tenants ready):

  idle          nothing running                         expected idle
  one_copy      ONE copy loop (DRAM to DRAM)            expected healthy: one client, and a lone
                streaming job keeps occupancy near 80 % (no memory-bound signature; memory_bound
                also fits if this GPU's occupancy falls below 50 %), never contended
  two_copies    TWO copy loops, two processes           expected contended, reason
                clients_sharing_bandwidth (two clients, bandwidth above 70 %)
  power_capped  ONE bf16 matmul at the board power limit  expected healthy: sw_power_cap with the
                SM clock near its maximum explains nothing (throttled only when the clock sits
                >= 20 % below gpu_clock_max_mhz; the table says which applied)
  matmul_copy   matmul + one copy loop                  expected shared, reason
                clients_sharing_compute (two clients, bandwidth about 44 %), never throttled
  idle_after    workers gone                            expected idle

Writes to $OUT (or ./nvml-check-out): ``load_samples.json`` (every scrape's watched series,
tagged by phase, plus each worker's achieved throughput), ``load_summary.txt`` (per phase: mean /
min / max of each watched series), ``state_table.txt`` (per phase: scrapes per state, reasons,
evidence, active clients, contended seconds, bandwidth, occupancy, SM active, throttle reasons,
SM clock / max, tenant throughput, expected state and the share of settled scrapes in it; also
printed), ``load_exporter.log`` and one log per worker.  Exit code 0 when every phase produced
samples, every watched family was served and the exporter stopped cleanly; the state verdicts
are reported, not enforced: recording what the hardware returned is what this check is for.
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
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYLIB = REPO / ".device-pylib"
DEADLINE = 330.0  # seconds: the whole script stays under 5.5 minutes
SETTLE_S = 5.0  # the first seconds of a phase are not judged (hold-over, GPM window)
POWER_CLOCK_DROP = 0.20  # indicators.rootcause.power_clock_drop_fraction (default)


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: float
    running: tuple[str, ...]  # workers told to run (the others pause)
    expect: str  # the state docs/detection.md gives this load
    reason: str  # and its reason
    also: tuple[str, ...] = ()  # states that also fit (see the module doc)
    # medians an H200 reported for this load (docs/detection.md, colocation_probe.py):
    # (util.gpu, GPM occupancy, GPM SM active, GPM DRAM bandwidth, busy clients, power cap active)
    h200: tuple[float, float, float, float, int, bool] = (0, 0, 0, 0, 0, False)


PHASES = (
    Phase("idle", 20, (), "idle", "below_idle_bars"),
    Phase("one_copy", 45, ("copy1",), "healthy", "no_memory_bound_signature", ("memory_bound",),
          (98, 79.3, 98.0, 87.0, 1, False)),
    Phase("two_copies", 40, ("copy1", "copy2"), "contended", "clients_sharing_bandwidth", (),
          (100, 70.6, 87.3, 77.6, 2, False)),
    Phase("power_capped", 40, ("matmul",), "healthy", "no_memory_bound_signature", (),
          (96, 13.7, 92.5, 17.2, 1, True)),
    Phase("matmul_copy", 40, ("matmul", "copy1"), "shared", "clients_sharing_compute", (),
          (100, 38.9, 86.3, 43.7, 2, True)),
    Phase("idle_after", 15, (), "idle", "below_idle_bars"),
)
WORKERS = {"copy1": "copy", "copy2": "copy", "matmul": "matmul"}
WATCH = {
    "gpu_compute_utilization_percent", "gpu_compute_occupancy_percent", "gpu_sm_active_percent",
    "gpu_memory_bandwidth_utilization_percent", "gpu_memory_bandwidth_gbps", "gpu_power_watts",
    "gpu_memory_state", "gpu_memory_state_info", "gpu_active_clients", "gpu_contention_evidence_info",
    "gpu_memory_contention", "gpu_memory_contention_seconds_total", "gpu_memory_bound_reference_percent",
    "gpu_contention_slowdown_ratio", "gpu_contention_cause_info", "gpu_throttle_active",
    "gpu_clock_mhz", "gpu_clock_max_mhz", "unified_gpu_exporter_source_up",
}
# what a default install must serve for this check to mean anything
REQUIRED = ("gpu_memory_state_info", "gpu_contention_evidence_info", "gpu_active_clients",
            "gpu_throttle_active", "gpu_clock_mhz", "gpu_clock_max_mhz")
LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_]+)="((?:[^"\\]|\\.)*)"')
EXPORTER_DEPS = ("pydantic", "pydantic_core", "annotated_types", "typing_extensions", "typing_inspection",
                 "bcrypt", "aiohttp", "yaml", "prometheus_client", "pynvml")
# a tenant's protocol: "ready" once set up, then "go" / "pause" lines on stdin; exits at EOF
_CONTROL = r"""
print("ready", flush=True)
go, stop = threading.Event(), threading.Event()
def control():
    for line in sys.stdin:
        (go.set if line.strip() == "go" else go.clear)()
    stop.set(); go.set()
threading.Thread(target=control, daemon=True).start()
"""
# one tenant: CUDA initialised, then the protocol; prints its achieved rate (copy: GB/s read +
# written; matmul: TFLOP/s) about every 0.5 s while running
WORKER = r"""
import sys, threading, time, torch
kind = sys.argv[1]
if kind == "copy":
    a = torch.empty(1 << 29, dtype=torch.float32, device="cuda"); b = torch.empty_like(a)
    step, work, unit = (lambda: b.copy_(a)), 2 * a.numel() * 4, 1e9
else:
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda"); b = torch.randn_like(a)
    step, work, unit = (lambda: torch.mm(a, b)), 2 * 8192 ** 3, 1e12
step(); torch.cuda.synchronize()""" + _CONTROL + r"""while not stop.is_set():
    go.wait()
    t0, k = time.perf_counter(), 0
    while go.is_set() and not stop.is_set() and time.perf_counter() - t0 < 0.5:
        for _ in range(10):
            step()
        torch.cuda.synchronize(); k += 10
    if k:
        print(f"rate {time.time():.3f} {work * k / (time.perf_counter() - t0) / unit:.1f}", flush=True)
"""

# the dry run's stand-in for a tenant (no GPU): the same protocol, CPU time instead of kernels
# (about a third of a core while running), for the MPS check's client activity
SPIN_WORKER = r"""
import sys, threading, time""" + _CONTROL + r"""while not stop.is_set():
    go.wait()
    end = time.perf_counter() + 0.01
    while time.perf_counter() < end:
        pass
    time.sleep(0.02)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse(text: str) -> dict[str, float]:
    """The watched samples of one exposition: ``name{labels}`` -> value."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if m and m.group(1) in WATCH:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def scrape(url: str) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(url, timeout=2) as resp:
        return parse(resp.read().decode())


def wait_serving(url: str) -> None:
    """Until the exporter answers a scrape (up to 30 s)."""
    for _ in range(120):
        try:
            scrape(url)
            return
        except OSError:
            time.sleep(0.25)


def labels(key: str) -> dict[str, str]:
    return dict(LABEL.findall(key[key.find("{"):])) if "{" in key else {}


def missing_modules(env: dict[str, str], deps: tuple[str, ...]) -> list[str]:
    code = ("import importlib.util\n"
            f"print(' '.join(m for m in {deps!r} if importlib.util.find_spec(m) is None))")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    return res.stdout.split()


class Worker:
    """One torch process (a tenant); ``go`` / ``pause`` switch its loop, ``stop`` ends it."""

    def __init__(self, name: str, kind: str, log_dir: Path):
        self.name, self.rates = name, []  # (unix time, rate)
        code = SPIN_WORKER if kind == "spin" else WORKER
        self.proc = subprocess.Popen([sys.executable, "-c", code, kind], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=open(log_dir / f"{name}.log", "w"),
                                     text=True, bufsize=1)
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            parts = line.split()
            if parts == ["ready"]:
                self.ready.set()
            elif len(parts) == 3 and parts[0] == "rate":
                self.rates.append((float(parts[1]), float(parts[2])))

    def tell(self, word: str) -> None:
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(5)


def facts(rows: list[dict[str, float]]) -> dict[str, dict[str, list]]:
    """gpu index -> per scrape: state, reason, evidence and the watched values (GPU level only:
    MIG instances' series carry gpu_instance and are left out)."""
    out: dict[str, dict[str, list]] = {}
    for row in rows:
        seen: dict[str, dict] = {}
        for key, value in row.items():
            lab = labels(key)
            gpu = lab.get("gpu")
            if gpu is None or "gpu_instance" in lab:
                continue
            d = seen.setdefault(gpu, {"throttle": set()})
            name = key.split("{", 1)[0]
            if name == "gpu_memory_state" and value == 1.0:
                d["state"] = lab.get("state")
            elif name == "gpu_memory_state_info":
                d["reason"] = lab.get("reason")
            elif name == "gpu_contention_evidence_info":
                d["evidence"] = f"{lab.get('evidence')}:{lab.get('source') or lab.get('reason')}"
            elif name == "gpu_memory_contention_seconds_total":
                d["contended_s"] = d.get("contended_s", 0.0) + value
            elif name == "gpu_throttle_active" and value >= 0.5:
                d["throttle"].add(lab.get("reason", "?"))
            elif name in ("gpu_clock_mhz", "gpu_clock_max_mhz") and lab.get("domain") == "sm":
                d[name] = value
            elif not lab.keys() - {"gpu", "vendor", "uuid", "instance", "basis"}:
                d[name] = value
        for gpu, d in seen.items():
            d["throttle"] = ",".join(sorted(d["throttle"])) or "none"
            if d.get("gpu_clock_mhz") is not None and d.get("gpu_clock_max_mhz"):
                d["clock_ratio"] = d["gpu_clock_mhz"] / d["gpu_clock_max_mhz"]
            g = out.setdefault(gpu, {})
            for k, v in d.items():
                g.setdefault(k, []).append(v)
    return out


def mean(vals: list) -> float | None:
    nums = [v for v in vals if isinstance(v, (int, float))]
    return statistics.fmean(nums) if nums else None


def fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def expected(phase: Phase, d: dict[str, list]) -> tuple[str, ...]:
    """The states that fit ``phase`` on this GPU: the power-capped phase is throttled only where
    the SM clock sat at least POWER_CLOCK_DROP below its maximum (mean over the phase)."""
    states = (phase.expect, *phase.also)
    ratio = mean(d.get("clock_ratio", []))
    if phase.name == "power_capped" and ratio is not None and ratio <= 1.0 - POWER_CLOCK_DROP:
        return ("throttled",)
    return states


def state_table(samples: list[dict], rates: dict[str, list[tuple[float, float]]], settle: float = SETTLE_S) -> str:
    lines = ["phase        gpu scrapes states (count)                        reasons                               "
             "evidence       clients contended_s  bw%   occ%  sm%   throttle        clock/max tenants          "
             "expected               in_expected"]
    for phase in PHASES:
        rows = [s for s in samples if s["phase"] == phase.name]
        if not rows:
            continue
        t0 = rows[0]["t"]
        settled = [s["values"] for s in rows if s["t"] - t0 >= settle]
        t_end = rows[-1]["t"]
        tenants = " ".join(f"{n}={statistics.fmean(v for t, v in rs if t0 <= t <= t_end):.0f}"
                           for n, rs in sorted(rates.items()) if any(t0 <= t <= t_end for t, _ in rs))
        whole = facts([s["values"] for s in rows])
        for gpu, d in sorted(facts(settled).items()):
            states, reasons = Counter(d.get("state", [])), Counter(d.get("reason", []))
            cs = whole.get(gpu, {}).get("contended_s", [])
            fit = expected(phase, d)
            share = sum(states[s] for s in fit) / max(1, sum(states.values()))
            lines.append(
                f"{phase.name:<12} {gpu:<3} {len(settled):<7} "
                f"{', '.join(f'{k} {v}' for k, v in states.most_common()):<38} "
                f"{', '.join(f'{k} {v}' for k, v in reasons.most_common(2)):<37} "
                f"{Counter(d.get('evidence', [])).most_common(1)[0][0] if d.get('evidence') else '-':<14} "
                f"{fmt(mean(d.get('gpu_active_clients', []))):<7} "
                f"{(f'{cs[0]:.1f}->{cs[-1]:.1f}' if cs else '-'):<12} "
                f"{fmt(mean(d.get('gpu_memory_bandwidth_utilization_percent', []))):<5} "
                f"{fmt(mean(d.get('gpu_compute_occupancy_percent', []))):<5} "
                f"{fmt(mean(d.get('gpu_sm_active_percent', []))):<5} "
                f"{Counter(d.get('throttle', [])).most_common(1)[0][0] if d.get('throttle') else '-':<15} "
                f"{fmt(mean(d.get('clock_ratio', [])), '.2f'):<9} {tenants or '-':<16} "
                f"{'/'.join(fit):<22} {share:.0%}")
    return "\n".join(lines)


def summary(samples: list[dict]) -> list[str]:
    lines = []
    for p in dict.fromkeys(s["phase"] for s in samples):
        rows = [s["values"] for s in samples if s["phase"] == p]
        lines.append(f"\n== {p} ({len(rows)} scrapes)")
        for key in sorted({k for r in rows for k in r}):
            vals = [r[key] for r in rows if key in r]
            lines.append(f"  {key} mean={statistics.fmean(vals):.4g} min={min(vals):.4g} max={max(vals):.4g}")
    return lines


def exporter_command(port: int, state_dir: Path, dry_run: bool) -> list[str]:
    """A default install: no config file, no collector flags, default intervals.  The dry run
    serves the faithful NVML fake (tests/fakes) and an empty sysfs instead of the machine's."""
    module = "tests.fakes.nvml_exporter" if dry_run else "exporter"
    cmd = [sys.executable, "-m", module, "--web.listen-address", f"127.0.0.1:{port}",
           "--state.dir", str(state_dir), "--log.level", "info"]
    if dry_run:
        (state_dir / "sys").mkdir()
        cmd += ["--path.sysfs", str(state_dir / "sys")]
    return cmd


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    dry_run = "--dry-run" in argv
    phase_s = float(argv[argv.index("--phase-seconds") + 1]) if "--phase-seconds" in argv else None
    started = time.monotonic()
    out_dir = Path(os.environ.get("OUT") or "nvml-check-out")
    out_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PYLIB) if PYLIB.is_dir() else "", str(REPO),
                                                    env.get("PYTHONPATH", "")) if p)
    if dry_run:
        env["FAKE_NVML_GPUS"] = env.get("FAKE_NVML_GPUS", "h100")
    missing = missing_modules(env, EXPORTER_DEPS if not dry_run else EXPORTER_DEPS[:-1])
    if missing:
        msg = (f"the exporter cannot start here: missing Python modules {missing}; carry their wheels "
               f"and install them into {PYLIB} (pip install --no-index --target, see this script's doc)")
        print(msg, file=sys.stderr)
        (out_dir / "load_summary.txt").write_text(msg + "\n")
        return 2
    state_dir = Path(tempfile.mkdtemp(prefix="uge-state-"))
    port = free_port()
    proc = subprocess.Popen(exporter_command(port, state_dir, dry_run), cwd=REPO, env=env,
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

    workers: dict[str, Worker] = {}
    if not dry_run:  # the tenants initialise CUDA while the exporter starts
        workers = {name: Worker(name, kind, out_dir) for name, kind in WORKERS.items()}
    wait_serving(url)
    thread = threading.Thread(target=scraper, daemon=True)
    thread.start()
    try:
        for w in workers.values():
            if not w.ready.wait(max(1.0, 90 - (time.monotonic() - started))):
                raise RuntimeError(f"{w.name} did not start (see {w.name}.log)")
        for p in PHASES:
            if p.name == "idle_after":
                for w in workers.values():
                    w.stop()
            else:
                for name, w in workers.items():
                    w.tell("go" if name in p.running else "pause")
            phase["name"] = p.name
            end = min(time.monotonic() + (phase_s or p.seconds), started + DEADLINE - 5)
            while time.monotonic() < end and proc.poll() is None:
                time.sleep(0.2)
    except Exception as exc:  # noqa: BLE001 - record the failure, still save what was scraped
        print(f"load generation failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        for w in workers.values():
            w.stop()
        stop.set()
        thread.join(2)
        proc.terminate()
        try:
            rc = proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = -9
    rates = {name: w.rates for name, w in workers.items()}
    (out_dir / "load_samples.json").write_text(json.dumps({"samples": samples, "rates": rates}, indent=1))
    served = {k.split("{", 1)[0] for s in samples for k in s["values"]}
    absent = [n for n in REQUIRED if n not in served]
    lines = [f"exporter exit code after SIGTERM: {rc}", f"elapsed: {time.monotonic() - started:.0f} s",
             f"watched families never served: {absent or 'none'}"]
    if dry_run:
        lines.append("dry run: the NVML fake under no load; the states are the fake's, not the phases'")
    (out_dir / "load_summary.txt").write_text("\n".join(lines + summary(samples)) + "\n")
    table = state_table(samples, rates, SETTLE_S if phase_s is None else min(SETTLE_S, phase_s / 2))
    (out_dir / "state_table.txt").write_text(table + "\n")
    print("\n".join(lines))
    print(table)
    ok = rc == 0 and not absent and all(any(s["phase"] == p.name for s in samples) for p in PHASES)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
