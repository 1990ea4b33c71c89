"""Issue 37, item 1: an upstream body of millions of one-sample lines fails by ``max_series``
while it is parsed (as Prometheus' ``sample_limit``), not after a parse that takes gigabytes; and
a target whose scrape is still being read or parsed gets no second scrape beside it."""

from __future__ import annotations

import threading

import pytest

import exporter.sources.upstream as upstream
from exporter.sources.upstream import UpstreamDown
from tests.bounded import run_bounded
from tests.test_upstream_http import GOOD, ExporterServer, Route, make_source, server, target  # noqa: F401

_BOMB = r"""
import http.server, threading, sys
from exporter.sources.context import SourceContext
from exporter.sources.upstream import UpstreamSource, UpstreamDown
body = b"a 1\n" * (7 * 1024 * 1024)  # 28 MiB: under the 32 MiB body cap, 7.3 million samples
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
url = f"http://127.0.0.1:{srv.server_address[1]}/metrics"
src = UpstreamSource(SourceContext(options={"targets": [
    {"name": "t", "url": url, "exporter": "dcgm-exporter", "timeout": 60}]}))
src.open()
try:
    src.poll()
    print("POLLED")
except UpstreamDown as e:
    print("DOWN", dict(e.errors), str(e)[:200])
"""


def test_series_limit_is_enforced_while_parsing() -> None:
    # before the fix: the 7.3 million samples were parsed whole (2 GiB, 40 s) before max_series
    # was looked at: under a 700 MiB address space that is a MemoryError (parse_error) or a kill
    got = run_bounded(_BOMB, timeout=120, mem=700 << 20)
    assert got.ok, got.out[-2000:]
    assert "DOWN" in got.out and "limit_exceeded" in got.out, got.out[-2000:]
    assert "counted while parsing" in got.out


def test_a_running_scrape_gets_no_second_one_beside_it(server: ExporterServer, monkeypatch) -> None:  # noqa: F811
    server.routes["/metrics"] = Route(body=GOOD.encode())
    release = threading.Event()
    calls = []
    real = upstream.parse_exposition

    def slow_parse(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - a parse that outlives the poll
        calls.append(1)
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(upstream, "parse_exposition", slow_parse)
    monkeypatch.setattr(upstream, "RESULT_GRACE_S", 0.2)
    src = make_source(target(server.url("/metrics"), timeout=0.5))
    try:
        for _ in range(3):
            with pytest.raises(UpstreamDown) as info:
                src.poll()
            assert info.value.errors["timeout"] == 1
        assert len(calls) == 1  # before the fix: one more parse thread per poll
        assert "still being read or parsed" in str(info.value)
    finally:
        release.set()
    # once the abandoned scrape ended, the target is read again
    for fut in list(src._inflight.values()):
        fut.exception(timeout=30)
    assert src.poll().devices
