"""CUDA MPS on a real NVIDIA GPU (issue 36): what NVML names under MPS, and what the exporter
reads with no configuration.

How to run (from the repo root, on a machine with one NVIDIA GPU, torch with CUDA, python3 and
the packages of nvml_load_check.py's doc in ``.device-pylib``):

    python3 deploy/device-check/nvml_mps_check.py             # about 2 minutes
    python3 deploy/device-check/nvml_mps_check.py --dry-run   # no GPU: the NVML fake (h100_mps),
                                                              # its clients two CPU-spinning workers

It starts a private MPS control daemon (``nvidia-cuda-mps-control -d`` with its pipe and log
directories in a temporary folder: nothing on the GPU is changed, no compute mode, and the
daemon is told ``quit`` at the end), two copy-loop tenants as MPS clients (nvml_load_check.py's
workers), and the exporter as a default install.  Phases:

  one_client   ONE copy loop through MPS,  expected: memory_bound or healthy, never contended,
               the other client paused     gpu_active_clients 1
  two_clients  TWO copy loops through MPS  expected: contended (two active MPS clients)

What it settles (the fake, tests/fakes/pynvml_fake.py, follows it; nvml.h does not say): which
pids nvmlDeviceGetProcessUtilization's samples name under MPS (the server only, or the clients),
what nvmlDeviceGetComputeRunningProcesses lists (the server, the clients, both), and what
nvmlDeviceGetMPSComputeRunningProcesses lists.  An H200 (driver 580.159.04, 2026-12-04) answered:
the server alone, the server and the clients, every client (the paused one too), so the exporter
reads a client's activity from its CPU time; each client's ``utime + stime`` is recorded beside
the three answers.  Every second of each phase they are
recorded with each pid's name (``mps_raw.json``) and summarised in ``mps_summary.txt``; the
exporter's states per phase go to ``mps_state_table.txt`` (as nvml_load_check's table).  Exit
code 0 when both phases were recorded and the exporter stopped cleanly; 3 when MPS cannot be
started here.  The verdicts are reported, not enforced.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nvml_load_check as base  # noqa: E402 - the sibling script's workers, scraper and table

PHASES = (
    base.Phase("one_client", 30, ("copy1",), "memory_bound", "single_client", ("healthy",)),
    base.Phase("two_clients", 35, ("copy1", "copy2"), "contended", "clients"),
)
MPS_SERVER = "nvidia-cuda-mps"


def nvml_answers(nv, handle, last: dict) -> dict:
    """One reading of the three process views of GPU 0, each pid with its name; ``last`` keeps
    the newest utilization sample's timestamp (only newer samples are asked for)."""
    def name(pid: int) -> str:
        try:
            return str(nv.nvmlSystemGetProcessName(pid)).rsplit("/", 1)[-1]
        except Exception:  # noqa: BLE001 - a name is best effort
            return "?"

    def listing(fn: str) -> list | str:
        try:
            return [(int(p.pid), name(int(p.pid))) for p in getattr(nv, fn)(handle)]
        except Exception as exc:  # noqa: BLE001 - the answer is what is recorded
            return f"{type(exc).__name__}: {exc}"

    try:
        answer = nv.nvmlDeviceGetProcessUtilization(handle, last.get("ts", 0))
        last["ts"] = max([last.get("ts", 0), *(int(s.timeStamp) for s in answer)])
        samples = [(int(s.pid), name(int(s.pid)), int(s.smUtil)) for s in answer]
    except Exception as exc:  # noqa: BLE001
        samples = f"{type(exc).__name__}: {exc}"
    mps = listing("nvmlDeviceGetMPSComputeRunningProcesses")
    return {"compute": listing("nvmlDeviceGetComputeRunningProcesses"), "mps": mps,
            "utilization_samples": samples, "cpu_ticks": {pid: cpu_ticks(pid) for pid, _ in mps}
            if isinstance(mps, list) else {}}


def cpu_ticks(pid: int) -> int | None:
    """utime + stime of ``/proc/<pid>/stat`` (what the exporter reads of an MPS client's activity)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def kinds(entries) -> str:
    """Who a view names: server / clients / both / none, or its error."""
    if isinstance(entries, str):
        return entries
    names = {e[1].startswith(MPS_SERVER) for e in entries}
    return {frozenset(): "none", frozenset({True}): "server", frozenset({False}): "clients"}.get(
        frozenset(names), "server and clients")


class Terminated(Exception):
    """SIGTERM (run_all.sh's time limit)."""


def _terminated(*_: object) -> None:
    raise Terminated("SIGTERM")


def start_mps(tmp: Path) -> dict[str, str] | None:
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        return None
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(tmp / "pipe"), CUDA_MPS_LOG_DIRECTORY=str(tmp / "log"))
    (tmp / "pipe").mkdir()
    (tmp / "log").mkdir()
    if subprocess.run([control, "-d"], env=env, timeout=30).returncode != 0:
        return None
    return env


def stop_mps(env: dict[str, str]) -> None:
    subprocess.run([shutil.which("nvidia-cuda-mps-control") or "nvidia-cuda-mps-control"], input="quit\n",
                   text=True, env=env, timeout=30)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    dry_run = "--dry-run" in argv
    phase_s = float(argv[argv.index("--phase-seconds") + 1]) if "--phase-seconds" in argv else None
    out_dir = Path(os.environ.get("OUT") or "nvml-check-out")
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="uge-mps-"))
    workers: dict[str, base.Worker] = {}
    if dry_run:  # the fake's MPS clients are spin workers: their CPU time is what is read
        workers = {n: base.Worker(n, "spin", out_dir) for n in ("copy1", "copy2")}
        sys.path.insert(0, str(base.REPO))
        from tests.fakes import nvml_exporter, pynvml_fake

        pids = ",".join(str(w.proc.pid) for w in workers.values())
        nv, mps_env = pynvml_fake.make_module([nvml_exporter.mps_pids(pynvml_fake.h100_mps(0), pids)]), \
            dict(os.environ, FAKE_NVML_GPUS="h100_mps", FAKE_NVML_MPS_PIDS=pids)
    else:
        import pynvml as nv

        mps_env = start_mps(tmp)
        if mps_env is None:
            (out_dir / "mps_summary.txt").write_text("MPS could not be started here (no nvidia-cuda-mps-control)\n")
            return 3
    # a timeout's SIGTERM ends the phases like a failure: the MPS daemon is told to quit and what
    # was recorded is still written
    signal.signal(signal.SIGTERM, _terminated)
    started = time.monotonic()
    samples: list[dict] = []
    raw: list[dict] = []
    rc = None
    last: dict = {}
    proc: subprocess.Popen | None = None
    try:
        nv.nvmlInit()
        handle = nv.nvmlDeviceGetHandleByIndex(0)
        env = dict(mps_env, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(base.PYLIB) if base.PYLIB.is_dir() else "",
                                                        str(base.REPO), env.get("PYTHONPATH", "")) if p)
        port = base.free_port()
        (tmp / "state").mkdir()
        proc = subprocess.Popen(base.exporter_command(port, tmp / "state", dry_run), cwd=base.REPO, env=env,
                                stdout=subprocess.DEVNULL, stderr=open(out_dir / "mps_exporter.log", "w"))
        url = f"http://127.0.0.1:{port}/metrics"
        os.environ.update({k: v for k, v in mps_env.items() if k.startswith("CUDA_MPS_")})  # the workers' env
        if not dry_run:
            workers = {n: base.Worker(n, "copy", out_dir) for n in ("copy1", "copy2")}
        base.wait_serving(url)  # the exporter serving first: every phase is scraped whole
        for w in workers.values():
            if not w.ready.wait(max(1.0, 90 - (time.monotonic() - started))):
                raise RuntimeError(f"{w.name} did not start (see {w.name}.log)")
        for p in PHASES:
            for name, w in workers.items():
                w.tell("go" if name in p.running else "pause")
            end = time.monotonic() + (phase_s or p.seconds)
            while time.monotonic() < end and proc.poll() is None:
                raw.append({"t": time.time(), "phase": p.name, **nvml_answers(nv, handle, last)})
                if dry_run:
                    nv.fake_advance(0.5)
                try:
                    samples.append({"t": time.time(), "phase": p.name, "values": base.scrape(url)})
                except OSError:
                    pass
                time.sleep(0.5)
    except Exception as exc:  # noqa: BLE001 - record the failure, still save what was seen
        print(f"MPS check failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        for w in workers.values():
            w.stop()
        if proc is not None:
            proc.terminate()
            try:
                rc = proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        if not dry_run:
            stop_mps(mps_env)
    (out_dir / "mps_raw.json").write_text(json.dumps(raw, indent=1))
    lines = [f"exporter exit code after SIGTERM: {rc}"]
    for p in PHASES:
        rows = [r for r in raw if r["phase"] == p.name]
        for view in ("compute", "mps", "utilization_samples"):
            lines.append(f"{p.name:<12} {view:<20} " + ", ".join(
                f"{k} {n}" for k, n in Counter(kinds(r[view]) for r in rows).most_common()))
    base.PHASES, saved = PHASES, base.PHASES
    try:
        table = base.state_table(samples, {n: w.rates for n, w in workers.items()}, 5.0 if phase_s is None else 0.0)
    finally:
        base.PHASES = saved
    (out_dir / "mps_summary.txt").write_text("\n".join(lines) + "\n")
    (out_dir / "mps_state_table.txt").write_text(table + "\n")
    print("\n".join(lines))
    print(table)
    return 0 if rc == 0 and all(any(r["phase"] == p.name for r in raw) for p in PHASES) else 1


if __name__ == "__main__":
    sys.exit(main())
