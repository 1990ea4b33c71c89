"""HTTP server: /metrics sends the bytes rendered after the last poll; nothing is computed per scrape."""

from __future__ import annotations

import logging
import resource
from typing import TYPE_CHECKING

from aiohttp import web, web_response

from ..render.exposition import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE
from .listeners import (  # noqa: F401 - the listeners' names stay importable from here
    HEADER_TIMEOUT,
    KEEPALIVE_TIMEOUT,
    MAX_CONNECTIONS,
    ConnectionGuard,
    SniffingTLSSite,
    guard_connections,
)

if TYPE_CHECKING:
    from ..run.daemon import Daemon

# aiohttp sends "Server: Python/3.x aiohttp/3.y" on every answer, its own error pages included
# (they bypass the app's signals); node_exporter (Go net/http) sends none.  Version numbers help
# only an attacker choosing an exploit, so every answer names the product without a version.
SERVER_HEADER = "unified-gpu-exporter"
web_response.SERVER_SOFTWARE = SERVER_HEADER

DAEMON: web.AppKey = web.AppKey("daemon", object)
TELEMETRY_PATH: web.AppKey = web.AppKey("telemetry_path", str)
MAX_REQUEST_BYTES = 8192

log = logging.getLogger("unified_gpu_exporter")


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the open-files soft limit to the hard limit (as Go programs do at start).
    Returns the (soft, hard) limits now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-files limit", extra={"reason": str(exc)})
    return soft, hard


def _q(params: list[str]) -> float:
    for p in params:
        k, _, v = p.strip().partition("=")
        if k.strip().lower() == "q":
            try:
                q = float(v)
            except ValueError:
                return 0.0
            return q if 0.0 <= q <= 1.0 else 0.0
    return 1.0


def _wants_openmetrics(accept: str) -> bool:
    """OpenMetrics when the client prefers it (by q) over the text format; q=0 means "not this"."""
    om, text = 0.0, 0.0
    for part in accept.split(","):
        media, *params = part.split(";")
        media = media.strip().lower()
        q = _q(params)
        if media == "application/openmetrics-text":
            om = max(om, q)
        elif media in ("text/plain", "text/*", "*/*"):
            text = max(text, q)
    return om > 0 and om >= text


def _accepts_gzip(accept_encoding: str) -> bool:
    for part in accept_encoding.split(","):
        bits = part.strip().split(";")
        if bits[0].strip().lower() == "gzip":
            q = next((b.split("=", 1)[1] for b in bits[1:] if b.strip().startswith("q=")), "1")
            try:
                return float(q) > 0
            except ValueError:
                return False
    return False


async def metrics(request: web.Request) -> web.StreamResponse:
    daemon: Daemon = request.app[DAEMON]  # type: ignore[assignment]
    rendered = daemon.rendered
    if rendered is None:
        return web.Response(status=503, text="no poll completed yet\n")
    om = _wants_openmetrics(request.headers.get("Accept", ""))
    gz = _accepts_gzip(request.headers.get("Accept-Encoding", ""))
    if om:
        body, ctype = (rendered.openmetrics_gz if gz else rendered.openmetrics), OPENMETRICS_CONTENT_TYPE
    else:
        body, ctype = (rendered.text_gz if gz else rendered.text), TEXT_CONTENT_TYPE
    headers = {"Content-Type": ctype, "Vary": "Accept, Accept-Encoding"}
    if gz:
        headers["Content-Encoding"] = "gzip"
    return web.Response(body=body, headers=headers)


async def landing(request: web.Request) -> web.Response:
    from .landing import render_landing  # with html's entity tables, only when someone opens it

    daemon: Daemon = request.app[DAEMON]  # type: ignore[assignment]
    return web.Response(text=render_landing(daemon, request.app[TELEMETRY_PATH]), content_type="text/html")


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    daemon: Daemon = request.app[DAEMON]  # type: ignore[assignment]
    if daemon.ready:
        return web.Response(text="ready\n")
    rendered = daemon.rendered
    if rendered is not None and rendered.failed:
        return web.Response(status=503, text="not ready: the last render failed (see the log and "
                                             "unified_gpu_exporter_render_errors_total)\n")
    return web.Response(status=503, text="not ready: no poll completed with a source up\n")


def make_app(daemon: Daemon, telemetry_path: str = "/metrics",
             middlewares: list | None = None) -> web.Application:
    app = web.Application(client_max_size=MAX_REQUEST_BYTES, middlewares=middlewares or [],
                          handler_args={"max_line_size": MAX_REQUEST_BYTES,
                                        "max_field_size": MAX_REQUEST_BYTES})
    app[DAEMON] = daemon
    app[TELEMETRY_PATH] = telemetry_path
    app.router.add_get(telemetry_path, metrics)
    if telemetry_path != "/":
        app.router.add_get("/", landing)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app
