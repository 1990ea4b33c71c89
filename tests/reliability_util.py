"""Helpers for the reliability suite: a real exporter subprocess, load generators, exposition parsing.

``ExporterProcess`` starts ``python -m exporter`` (the console script's code) on a free
loopback port and waits for its first successful scrape; ``scrape_load`` runs N concurrent
aiohttp scrapers for a fixed time and reports errors and latency percentiles.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import aiohttp

from exporter.sources.base import Device, PollResult

REPO = Path(__file__).resolve().parent.parent
SOAK = bool(os.environ.get("SOAK"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_metrics(text: str) -> dict[str, float]:
    """``name{labels}`` -> value for every sample line of a text exposition."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def pick(metrics: dict[str, float], name: str, **labels: str) -> dict[str, float]:
    """Samples of ``name`` whose label set contains every ``label="value"`` given."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return {k: v for k, v in metrics.items()
            if (k == name or k.startswith(name + "{")) and all(w in k for w in want)}


def mapper_state_size(mapper) -> int:
    """Entries of counter/rate state a Mapper keeps (raw counters and exported totals)."""
    size = getattr(mapper, "state_size", None)
    return size() if callable(size) else len(mapper._state)


def vmrss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100.0 * (len(s) - 1))))]


class ExporterProcess:
    """The real exporter as a subprocess on 127.0.0.1:<free port>."""

    def __init__(self, args: list[str], tmp_path: Path, ready_timeout: float = 15.0,
                 ready: bytes = b"unified_gpu_exporter_source_up", module: str = "exporter",
                 env: dict[str, str] | None = None):
        """Ready once a scrape contains ``ready`` (e.g. a source_up line with value 1).  ``module``:
        what ``python -m`` runs (``tests.fakes.nvml_exporter``: the exporter with the NVML fake);
        ``env``: added to the environment."""
        self._ready = ready
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / f"exporter-{self.port}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        cmd = [sys.executable, "-m", module, "--web.listen-address", f"127.0.0.1:{self.port}", *args]
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **env} if env else None)
        self._wait_ready(ready_timeout)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"exporter exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url + "/metrics", timeout=1.0) as resp:
                    if resp.status == 200 and self._ready in resp.read():
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.05)
        self.stop()
        raise AssertionError(f"exporter not ready within {timeout}s:\n{self.log()}")

    def scrape(self, path: str = "/metrics", timeout: float = 5.0) -> str:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as resp:
            assert resp.status == 200
            return resp.read().decode()

    def metrics(self) -> dict[str, float]:
        return parse_metrics(self.scrape())

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def send(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 5.0) -> tuple[int | None, float]:
        """Send ``sig``; return (exit code or None if it had to be killed, seconds to exit)."""
        t0 = time.monotonic()
        rc: int | None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                rc = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                rc = None
        else:
            rc = self.proc.returncode
        elapsed = time.monotonic() - t0
        self._log.close()
        return rc, elapsed

    def __enter__(self) -> ExporterProcess:
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.stop()


@dataclass
class LoadResult:
    requests: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    duration: float = 0.0

    @property
    def p50(self) -> float:
        return percentile(self.latencies, 50)

    @property
    def p99(self) -> float:
        return percentile(self.latencies, 99)

    def summary(self) -> str:
        rate = self.requests / self.duration if self.duration else 0.0
        return (f"{self.requests} scrapes in {self.duration:.1f}s ({rate:.0f}/s), "
                f"errors={dict(self.errors)}, p50={self.p50 * 1000:.1f}ms p99={self.p99 * 1000:.1f}ms "
                f"max={max(self.latencies, default=0) * 1000:.1f}ms")


async def scrape_load(url: str, clients: int, duration: float, *, gzip: bool = False,
                      check: bytes = b"unified_gpu_exporter_source_up", timeout: float = 10.0) -> LoadResult:
    """``clients`` concurrent scrapers, each scraping back to back for ``duration`` seconds.

    An error is any non-200, a body without ``check``, or a transport failure.
    """
    result = LoadResult()
    headers = {"Accept-Encoding": "gzip" if gzip else "identity"}
    conn = aiohttp.TCPConnector(limit=clients, force_close=False)
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    t_end = time.monotonic() + duration

    async def one(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < t_end:
            t0 = time.perf_counter()
            try:
                async with session.get(url, headers=headers) as resp:
                    body = await resp.read()
                    if resp.status != 200:
                        result.errors[f"http_{resp.status}"] += 1
                    elif check not in body:
                        result.errors["bad_body"] += 1
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                result.errors[type(exc).__name__] += 1
            result.latencies.append(time.perf_counter() - t0)
            result.requests += 1

    t0 = time.monotonic()
    async with aiohttp.ClientSession(connector=conn, timeout=client_timeout) as session:
        await asyncio.gather(*(one(session) for _ in range(clients)))
    result.duration = time.monotonic() - t0
    return result


# ------------------------------------------------------------------------------------------------
# a source whose devices and per-reading labels churn, for the bounded-memory tests

CHURN_MAPPING = """vendor: nvidia
fields:
  - {raw: util, metric: gpu_compute_utilization_percent}
  - {raw: energy_mj, metric: gpu_energy_joules_total, scale: 0.001}
  - {raw: link_tx, metric: gpu_interconnect_bytes_total, labels: {interconnect: nvlink, direction: tx},
     label_map: {link: link}}
  - {raw: busy_ms, metric: gpu_memory_bandwidth_utilization_percent, transform: rate, scale: 0.1,
     clamp: [0, 100]}
"""


class ChurnSource:
    """Every poll: 4 devices out of a rotating pool, each with counters on rotating link labels."""

    name: ClassVar[str] = "churn"

    def __init__(self, options=None, **_):
        self.polls = 0

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def poll(self) -> PollResult:
        self.polls += 1
        n = self.polls
        s = PollResult()
        for slot in range(4):
            gpu = (n // 3 + slot * 7) % 1000   # devices come and go every few polls
            dev = Device(key=f"0000:{gpu % 256:02x}:{gpu // 256:02x}.0", vendor="nvidia", index=str(gpu),
                         mapping="churn", uuid=f"GPU-CHURN-{gpu}")
            s.devices.append(dev)
            s.add(dev.key, "util", float(n % 100))
            s.add(dev.key, "energy_mj", 1000.0 * n)
            s.add(dev.key, "busy_ms", 500.0 * n)
            for link in range(2):
                s.add(dev.key, "link_tx", 10.0 * n, (("link", str((n + link) % 50)),))
        return s
