"""Shared helpers for the benchmarks: processes, /proc accounting, HTTP load, percentiles.

Nothing here measures by itself; ``run.py`` and the other ``bench/*.py`` modules compose these.
CPU is process CPU (utime + stime of every thread, from ``/proc/<pid>/stat``), not wall time.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def exporter_cmd() -> list[str]:
    """The installed console script when the venv has one, else ``python -m exporter``."""
    script = VENV_BIN / "unified-gpu-exporter"
    return [str(script)] if script.exists() else [sys.executable, "-m", "exporter"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process (all threads) and of every process it runs: its live
    descendants (the privilege-separated counting process, an import worker) and the ones it has
    reaped (cutime + cstime), in seconds.  A process that runs part of its work in a child is
    measured whole."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/stat") as fh:
                stat = fh.read()
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue  # it exited meanwhile: its parent's cutime has it once reaped
        fields = stat[stat.rindex(")") + 2:].split()  # comm may hold spaces: cut after ')'
        total += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime (stat(5) 14-17)
        for tid in tasks:
            try:
                with open(f"/proc/{p}/task/{tid}/children") as fh:
                    todo.extend(int(c) for c in fh.read().split())
            except OSError:
                pass
    return total / CLK_TCK


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as fh:
        return int(fh.read().split()[1]) * PAGE


def memory(pid: int) -> dict[str, int]:
    """RSS, PSS and private (USS) bytes from smaps_rollup; RSS counts shared libraries in full."""
    out = {"rss_bytes": rss_bytes(pid)}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            roll = {ln.split(":")[0]: int(ln.split()[1]) * 1024 for ln in fh.read().splitlines()[1:]}
        out["pss_bytes"] = roll.get("Pss", 0)
        out["uss_bytes"] = roll.get("Private_Clean", 0) + roll.get("Private_Dirty", 0)
    except (OSError, ValueError, IndexError):
        pass
    return out


def loadavg() -> list[float]:
    with open("/proc/loadavg") as fh:
        return [float(x) for x in fh.read().split()[:3]]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100.0 * len(ordered) + 0.5) - 1))
    return ordered[k]


@dataclass
class Proc:
    """A server under test: started, waited for, accounted, stopped."""

    name: str
    cmd: list[str]
    port: int
    ready_path: str = "/readyz"
    popen: subprocess.Popen | None = None
    log_path: Path | None = None

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, log_dir: Path, env: dict[str, str] | None = None) -> Proc:
        self.log_path = log_dir / f"{self.name}.log"
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child owns it for its lifetime
        self.popen = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                      env={**os.environ, **(env or {})})
        log.close()
        return self

    def wait_ready(self, timeout: float = 30.0, path: str | None = None, step: float = 0.05) -> float:
        """Block until ``path`` (default ``ready_path``) answers 200; return the seconds it took."""
        t0 = time.monotonic()
        url = self.base + (path or self.ready_path)
        while time.monotonic() - t0 < timeout:
            if self.popen is not None and self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.popen.returncode}: {self.tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except OSError:
                pass
            time.sleep(step)
        raise RuntimeError(f"{self.name}: no 200 on {path or self.ready_path} after {timeout:g}s: {self.tail()}")

    def get(self, path: str = "/metrics", gzip_ok: bool = False) -> bytes:
        req = urllib.request.Request(self.base + path,
                                     headers={"Accept-Encoding": "gzip"} if gzip_ok else {})
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.read()

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def rss(self) -> int:
        return rss_bytes(self.pid)

    def tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:] if self.log_path else ""
        except OSError:
            return ""

    def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=5)


# ------------------------------------------------------------------------------------ HTTP load
@dataclass
class LoadResult:
    clients: int
    gzip: bool
    requests: int
    errors: int
    seconds: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    server_cpu_s: float
    body_bytes: int

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def server_cpu_ms_per_scrape(self) -> float:
        return self.server_cpu_s / self.requests * 1000 if self.requests else float("nan")

    def as_dict(self) -> dict:
        return {"clients": self.clients, "gzip": self.gzip, "requests": self.requests,
                "errors": self.errors, "seconds": round(self.seconds, 3), "rps": round(self.rps, 1),
                "p50_ms": round(self.p50_ms, 3), "p99_ms": round(self.p99_ms, 3),
                "max_ms": round(self.max_ms, 3), "body_bytes": self.body_bytes,
                "server_cpu_ms_per_scrape": round(self.server_cpu_ms_per_scrape, 3)}


async def _load(url: str, clients: int, seconds: float, gzip_ok: bool, warmup: int) -> tuple:
    import aiohttp

    headers = {"Accept-Encoding": "gzip" if gzip_ok else "identity"}
    latencies: list[float] = []
    errors = 0
    size = 0
    conn = aiohttp.TCPConnector(limit=clients, force_close=False)
    # auto_decompress off: we time serving the bytes, not the client's gunzip
    async with aiohttp.ClientSession(connector=conn, auto_decompress=False,
                                     timeout=aiohttp.ClientTimeout(total=30)) as session:
        for _ in range(warmup):  # open connections, fill caches
            async with session.get(url, headers=headers) as r:
                await r.read()
        stop_at = time.perf_counter() + seconds

        async def client() -> None:
            nonlocal errors, size
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                try:
                    async with session.get(url, headers=headers) as r:
                        body = await r.read()
                        ok = r.status == 200
                except (TimeoutError, aiohttp.ClientError):
                    ok, body = False, b""
                if ok:
                    latencies.append((time.perf_counter() - t0) * 1000)
                    size = len(body)
                else:
                    errors += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.perf_counter() - t0
    return latencies, errors, size, elapsed


def scrape_load(proc: Proc, clients: int, seconds: float, gzip_ok: bool = False,
                path: str = "/metrics", warmup: int = 5) -> LoadResult:
    """``clients`` concurrent keep-alive clients scrape back to back for ``seconds``."""
    cpu0 = proc.cpu()
    latencies, errors, size, elapsed = asyncio.run(
        _load(proc.base + path, clients, seconds, gzip_ok, warmup))
    cpu = proc.cpu() - cpu0
    return LoadResult(clients, gzip_ok, len(latencies), errors, elapsed,
                      percentile(latencies, 50), percentile(latencies, 99),
                      max(latencies) if latencies else float("nan"), cpu, size)


def paced_scrapes(procs: list[Proc], seconds: float, rate_hz: float = 1.0,
                  path: str = "/metrics") -> dict[str, dict]:
    """Scrape every proc at ``rate_hz`` for ``seconds``; CPU and RSS of each over that window."""
    cpu0 = {p.name: p.cpu() for p in procs}
    n = {p.name: 0 for p in procs}
    errors = {p.name: 0 for p in procs}
    t_start = time.monotonic()
    next_at = t_start
    while True:
        for p in procs:
            try:
                p.get(path)
                n[p.name] += 1
            except OSError:
                errors[p.name] += 1
        next_at += 1.0 / rate_hz
        if next_at - t_start >= seconds:
            break
        time.sleep(max(0.0, next_at - time.monotonic()))
    elapsed = time.monotonic() - t_start
    return {p.name: {"scrapes": n[p.name], "errors": errors[p.name], "seconds": round(elapsed, 2),
                     "cpu_s": p.cpu() - cpu0[p.name], "rss_bytes": p.rss()} for p in procs}


def idle_cpu(proc: Proc, seconds: float, min_ticks: int = 10, max_seconds: float = 10.0) -> tuple[float, float]:
    """(process CPU seconds, window seconds) with nobody scraping.

    The window is at least ``seconds`` and is extended a second at a time until the process has
    used ``min_ticks`` ticks of the CPU clock (10 ms each on Linux), up to ``max_seconds``: a
    --quick window of 1 s can otherwise read 0 for a cheap exporter, which says nothing."""
    c0, t0 = proc.cpu(), time.monotonic()
    time.sleep(seconds)
    while proc.cpu() - c0 < min_ticks / CLK_TCK and time.monotonic() - t0 < max_seconds:
        time.sleep(1.0)
    return proc.cpu() - c0, time.monotonic() - t0


def metric_value(exposition: bytes, name: str) -> float | None:
    """First sample of ``name`` in a text exposition (no label matching)."""
    for line in exposition.decode("utf-8", "replace").splitlines():
        if line.startswith(name) and (len(line) == len(name) or line[len(name)] in " {"):
            try:
                return float(line.rsplit(" ", 1)[1])
            except ValueError:
                return None
    return None
