"""Helpers for the subprocess and end-to-end tests: free ports, the exporter, Prometheus,
Alertmanager and node_exporter as child processes, a webhook receiver, PromQL queries.

Every process is started in its own session with its output in a log file, and ``stop()`` always
ends it (SIGTERM, then SIGKILL).  Use them through ``ProcessSet`` (a context manager) or call
``stop()`` in a ``finally``/fixture finalizer so a failing test never leaves a server behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import REPO

EXPORTER_CMD = [sys.executable, "-m", "exporter"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------ HTTP

@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.body)


def children(pid: int | str = "self") -> list[int]:
    """The child processes of every thread of ``pid``; a thread that ended between the listing and
    its read had none left to name."""
    out: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            out += [int(p) for p in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return out


def http_get(url: str, headers: dict[str, str] | None = None, timeout: float = 3.0) -> Response:
    """GET without following redirects or decompressing; HTTP errors are returned, not raised."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return Response(resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read())
    except urllib.error.HTTPError as exc:
        return Response(exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read())


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.1,
               what: str = "condition") -> Any:
    """Call predicate until it returns something truthy; raise AssertionError after timeout."""
    deadline = time.monotonic() + timeout
    last: Any = None
    last_exc: Exception | None = None
    while True:
        try:
            last = predicate()
            last_exc = None
            if last:
                return last
        except (OSError, urllib.error.URLError, ValueError) as exc:
            last_exc = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what}; "
                                 f"last value {last!r}, last error {last_exc!r}")
        time.sleep(interval)


def _status_is(url: str, status: int = 200) -> bool:
    return http_get(url, timeout=1.0).status == status


# ------------------------------------------------------------------------------- processes

@dataclass
class Server:
    """A child process serving HTTP on 127.0.0.1:port."""

    name: str
    argv: list[str]
    port: int
    log_path: Path
    proc: subprocess.Popen | None = None
    env: dict[str, str] | None = None
    # regex the process logs once it listens on port: readiness probes wait for it, so that another
    # program that took the same free port meanwhile is not mistaken for this one
    listen_log: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Server:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=REPO,
                                         start_new_session=True, env=self.env)
        finally:
            log.close()
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_ready(self, path: str, timeout: float) -> Server:
        """Wait for GET path to answer 200; fail with the process log if it exits or times out."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.proc.returncode} before it was "
                                     f"ready:\n{self.log()[-4000:]}")
            try:
                if self._listening() and _status_is(self.url + path):
                    return self
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() >= deadline:
                raise AssertionError(f"{self.name} not ready on {self.url}{path} after {timeout}s:\n"
                                     f"{self.log()[-4000:]}")
            time.sleep(0.05)

    def _listening(self) -> bool:
        return self.listen_log is None or re.search(self.listen_log, self.log(), re.M) is not None

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 3.0) -> int | None:
        """End the process (SIGTERM, then SIGKILL after timeout); returns its exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
            except ProcessLookupError:
                pass
        return self.proc.returncode


class ProcessSet:
    """Servers that are all stopped on exit, whatever happened."""

    def __init__(self) -> None:
        self.servers: list[Server] = []

    def add(self, server: Server) -> Server:
        self.servers.append(server)
        return server

    def stop_all(self) -> None:
        for server in reversed(self.servers):
            try:
                server.stop()
            except Exception:  # noqa: BLE001 - keep stopping the others
                if server.proc is not None and server.proc.poll() is None:
                    server.proc.kill()
        self.servers.clear()

    def __enter__(self) -> ProcessSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


def exporter(tmp: Path, args: Iterable[str], name: str = "exporter") -> Server:
    """The exporter on a free port (not started): `python -m exporter --web.listen-address ... args`."""
    port = free_port()
    argv = [*EXPORTER_CMD, "--web.listen-address", f"127.0.0.1:{port}", *args]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return Server(name, argv, port, tmp / f"{name}.log", env=env,
                  listen_log=rf"\baddress=127\.0\.0\.1:{port}\b")


def start_exporter(procs: ProcessSet, tmp: Path, args: Iterable[str], timeout: float = 15.0,
                   name: str = "exporter") -> Server:
    """Start the exporter and wait for /readyz (the first render after every source's first poll)."""
    server = procs.add(exporter(tmp, args, name))
    return server.start().wait_ready("/readyz", timeout)


def start_prometheus(procs: ProcessSet, binary: str, config: Path, tmp: Path,
                     timeout: float = 20.0, extra: Iterable[str] = ()) -> Server:
    port = free_port()
    data = tmp / "prometheus-data"
    data.mkdir(parents=True, exist_ok=True)
    argv = [binary, f"--config.file={config}", f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn", *extra]
    server = procs.add(Server("prometheus", argv, port, tmp / "prometheus.log"))
    return server.start().wait_ready("/-/ready", timeout)


def start_alertmanager(procs: ProcessSet, binary: str, config: Path, tmp: Path,
                       timeout: float = 20.0) -> Server:
    port = free_port()
    data = tmp / "alertmanager-data"
    data.mkdir(parents=True, exist_ok=True)
    argv = [binary, f"--config.file={config}", f"--storage.path={data}",
            f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
            "--log.level=warn"]
    server = procs.add(Server("alertmanager", argv, port, tmp / "alertmanager.log"))
    return server.start().wait_ready("/-/ready", timeout)


def start_node_exporter(procs: ProcessSet, binary: str, tmp: Path, timeout: float = 10.0,
                        extra: Iterable[str] = ()) -> Server:
    port = free_port()
    argv = [binary, f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn", *extra]
    server = procs.add(Server("node_exporter", argv, port, tmp / "node_exporter.log"))
    return server.start().wait_ready("/metrics", timeout)


# ------------------------------------------------------------------------------ Prometheus

def prom_query(prom: Server, expr: str, timeout: float = 5.0) -> list[dict]:
    """Instant query; returns data.result (vector or scalar as a one-element list)."""
    url = f"{prom.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    resp = http_get(url, timeout=timeout)
    doc = resp.json()
    if resp.status != 200 or doc.get("status") != "success":
        raise AssertionError(f"query {expr!r} failed: HTTP {resp.status}: {resp.text}")
    data = doc["data"]
    if data["resultType"] in ("scalar", "string"):
        return [{"metric": {}, "value": data["result"]}]
    return data["result"]


def prom_rule_groups(prom: Server) -> list[dict]:
    return http_get(f"{prom.url}/api/v1/rules").json()["data"]["groups"]


def prom_targets(prom: Server) -> list[dict]:
    return http_get(f"{prom.url}/api/v1/targets").json()["data"]["activeTargets"]


# ------------------------------------------------------------------------- webhook receiver

@dataclass
class Notification:
    path: str        # receiver path, e.g. /platform-team
    payload: dict    # Alertmanager webhook payload (version 4)
    received_at: float = field(default_factory=time.monotonic)


class WebhookReceiver:
    """An aiohttp server in a background thread that records every POSTed JSON body by path."""

    def __init__(self) -> None:
        self.port = free_port()
        self.notifications: list[Notification] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: Any = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, request: Any) -> Any:
        from aiohttp import web

        try:
            payload = await request.json()
        except ValueError:
            return web.Response(status=400, text="not JSON\n")
        with self._lock:
            self.notifications.append(Notification(request.path, payload))
        return web.Response(text="ok\n")

    async def _setup(self) -> None:
        from aiohttp import web

        app = web.Application()
        app.router.add_post("/{receiver:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._setup())
        except BaseException as exc:  # noqa: BLE001 - reported by start()
            self._error = exc
            self._started.set()
            loop.close()
            return
        self._started.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

    def start(self) -> WebhookReceiver:
        self._thread = threading.Thread(target=self._main, name="webhook-receiver", daemon=True)
        self._thread.start()
        if not self._started.wait(10):
            raise AssertionError("webhook receiver did not start")
        if self._error is not None:
            raise AssertionError(f"webhook receiver failed to start: {self._error!r}")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def snapshot(self) -> list[Notification]:
        with self._lock:
            return list(self.notifications)

    def alerts(self, alertname: str, status: str = "firing") -> list[tuple[str, dict]]:
        """(receiver path, alert) for every received alert with this name and status."""
        return [(n.path, a) for n in self.snapshot() for a in n.payload.get("alerts", [])
                if a.get("labels", {}).get("alertname") == alertname and a.get("status") == status]

    def __enter__(self) -> WebhookReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
