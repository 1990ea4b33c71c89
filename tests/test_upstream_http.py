"""Upstream source against a local HTTP server: failures, stale data, TLS, auth, transport details.

``ExporterServer`` (used by test_upstream_samples.py too) serves canned /metrics answers on
127.0.0.1 from a thread; each route can answer with a status, a delay, a trickled body, gzip, or
demand basic auth.
"""

from __future__ import annotations

import base64
import gzip
import http.server
import socket
import ssl
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from exporter.sources.base import SourceUnavailable
from exporter.sources.context import SourceContext
from exporter.sources.upstream import UpstreamDown, UpstreamSource, UpstreamTimeout, parse_exposition
from tests.conftest import require_binary

GOOD = """# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-11111111-2222-3333-4444-555555555555",pci_bus_id="00000000:3B:00.0",modelName="NVIDIA A10",Hostname="h"} 44
# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0",UUID="GPU-11111111-2222-3333-4444-555555555555",pci_bus_id="00000000:3B:00.0",modelName="NVIDIA A10",Hostname="h"} 5000
"""
GOOD_KEY = "0000:3b:00.0"


@dataclass
class Route:
    body: bytes = b""
    status: int = 200
    delay: float = 0.0
    trickle: float = 0.0            # seconds between 16-byte pieces of the body
    gzip: bool = False
    auth: str = ""                   # expected "user:password"
    content_type: str = "text/plain; version=0.0.4; charset=utf-8"


class ExporterServer:
    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.routes: dict[str, Route] = {}
        self.hits: Counter[str] = Counter()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - http.server API
                server.hits[self.path] += 1
                route = server.routes.get(self.path)
                if route is None:
                    self.send_error(404)
                    return
                if route.delay:
                    time.sleep(route.delay)
                if route.auth:
                    want = "Basic " + base64.b64encode(route.auth.encode()).decode()
                    if self.headers.get("Authorization") != want:
                        self._send(401, b"unauthorized\n", "text/plain")
                        return
                body = gzip.compress(route.body) if route.gzip else route.body
                self.send_response(route.status)
                self.send_header("Content-Type", route.content_type)
                self.send_header("Content-Length", str(len(body)))
                if route.gzip:
                    self.send_header("Content-Encoding", "gzip")
                self.end_headers()
                if route.trickle:
                    for i in range(0, len(body), 16):
                        self.wfile.write(body[i:i + 16])
                        self.wfile.flush()
                        time.sleep(route.trickle)
                else:
                    self.wfile.write(body)

            def _send(self, status: int, body: bytes, ctype: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.scheme = "https" if tls else "http"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"{self.scheme}://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    srv = ExporterServer()
    yield srv
    srv.close()


def target(url: str, exporter: str = "dcgm-exporter", name: str = "t", **extra) -> dict:
    return {"name": name, "url": url, "exporter": exporter, **extra}


def make_source(*targets: dict) -> UpstreamSource:
    src = UpstreamSource(SourceContext(options={"targets": list(targets)}))
    src.open()
    return src


def refused_url() -> str:
    """A local port nobody listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/metrics"


MALFORMED = b"<html><body>502 Bad Gateway</body></html>\n"

# (route setup, expected error kind) for each way a target can fail
FAILURES = {
    "malformed": (lambda srv: Route(body=MALFORMED), "parse_error"),
    "half_malformed": (lambda srv: Route(body=GOOD.encode() + b"DCGM_FI_DEV_GPU_UTIL{gpu=\"0\" 12\n"),
                       "parse_error"),
    "http_500": (lambda srv: Route(body=b"#nodata: due to unexpected failure", status=500), "read_error"),
    "timeout": (lambda srv: Route(body=GOOD.encode(), delay=1.5), "timeout"),
    "refused": (None, "read_error"),
}


def _failing_url(srv: ExporterServer, how: str) -> str:
    setup, _ = FAILURES[how]
    if setup is None:
        return refused_url()
    srv.routes["/bad"] = setup(srv)
    return srv.url("/bad")


@pytest.mark.parametrize("how", sorted(FAILURES))
def test_failing_target_counts_its_error_kind_and_gives_no_readings(server: ExporterServer, how: str) -> None:
    server.routes["/good"] = Route(body=GOOD.encode())
    src = make_source(target(server.url("/good"), name="good"),
                      target(_failing_url(server, how), name="bad", timeout=0.3))
    t0 = time.monotonic()
    sample = src.poll()
    elapsed = time.monotonic() - t0
    src.close()
    assert sample.errors == Counter({FAILURES[how][1]: 1})
    assert [d.key for d in sample.devices] == [GOOD_KEY]
    assert {(r.device, r.field, r.value) for r in sample.readings} == {
        (GOOD_KEY, "DCGM_FI_DEV_GPU_TEMP", 44.0),
        (GOOD_KEY, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 5000.0),
    }
    assert elapsed < 1.2  # the slow target was cut at its 0.3 s timeout


@pytest.mark.parametrize("how", sorted(FAILURES))
def test_only_target_failing_makes_the_source_down(server: ExporterServer, how: str) -> None:
    src = make_source(target(_failing_url(server, how), timeout=0.3))
    with pytest.raises(UpstreamDown) as info:
        src.poll()
    src.close()
    kind = FAILURES[how][1]
    assert info.value.errors == Counter({kind: 1})
    assert info.value.kind == kind
    # the daemon counts a TimeoutError as kind "timeout"; other failures stay non-timeouts
    assert isinstance(info.value, TimeoutError) == (kind == "timeout")


def test_stale_values_are_never_served_again(server: ExporterServer) -> None:
    server.routes["/a"] = Route(body=GOOD.encode())
    other = GOOD.replace("3B:00.0", "5E:00.0").replace("555555555555", "666666666666")
    server.routes["/b"] = Route(body=other.encode())
    src = make_source(target(server.url("/a"), name="a"), target(server.url("/b"), name="b"))
    first = src.poll()
    assert {r.device for r in first.readings} == {GOOD_KEY, "0000:5e:00.0"}
    assert first.device_up == {GOOD_KEY: True, "0000:5e:00.0": True}

    server.routes["/a"] = Route(body=b"oops", status=503)
    second = src.poll()
    assert {r.device for r in second.readings} == {"0000:5e:00.0"}
    assert second.device_up == {GOOD_KEY: False, "0000:5e:00.0": True}
    assert second.errors == Counter({"read_error": 1})

    server.routes["/a"] = Route(body=GOOD.replace("} 44", "} 47").encode())
    third = src.poll()
    assert [r.value for r in third.readings if r.field == "DCGM_FI_DEV_GPU_TEMP" and r.device == GOOD_KEY] == [47.0]
    assert third.device_up[GOOD_KEY] is True and not third.errors
    src.close()


def test_gpu_gone_from_exporter_is_reported_down(server: ExporterServer) -> None:
    server.routes["/m"] = Route(body=GOOD.encode())
    src = make_source(target(server.url("/m")))
    assert src.poll().device_up == {GOOD_KEY: True}
    server.routes["/m"] = Route(body=b"# no GPUs right now\n")
    sample = src.poll()
    assert sample.readings == [] and sample.device_up == {GOOD_KEY: False} and not sample.errors
    src.close()


def test_trickling_body_is_cut_at_the_total_timeout(server: ExporterServer) -> None:
    # every piece arrives well within a socket timeout; only a deadline for the whole body stops it
    server.routes["/slow"] = Route(body=GOOD.encode(), trickle=0.05)
    src = make_source(target(server.url("/slow"), timeout=0.4))
    t0 = time.monotonic()
    with pytest.raises(UpstreamTimeout) as info:
        src.poll()
    assert time.monotonic() - t0 < 1.2  # the full body would take 0.05 s x 26 pieces = 1.3 s
    assert info.value.errors == Counter({"timeout": 1})
    src.close()


def test_gzip_answer_and_basic_auth(server: ExporterServer, tmp_path: Path) -> None:
    server.routes["/z"] = Route(body=GOOD.encode(), gzip=True, auth="prom:s3cret")
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    good = make_source(target(server.url("/z"), basic_auth={"username": "prom", "password_file": str(pw)}))
    assert {r.field for r in good.poll().readings} == {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"}
    good.close()
    bad = make_source(target(server.url("/z"), basic_auth={"username": "prom", "password": "wrong"}))
    with pytest.raises(UpstreamDown) as info:
        bad.poll()
    assert info.value.errors == Counter({"read_error": 1}) and "401" in str(info.value)
    bad.close()


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory) -> tuple[Path, Path]:
    openssl = require_binary("openssl", "openssl")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def test_https_target_verified_with_ca_file(self_signed: tuple[Path, Path]) -> None:
    cert, key = self_signed
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv = ExporterServer(tls=ctx)
    srv.routes["/metrics"] = Route(body=GOOD.encode())
    try:
        trusted = make_source(target(srv.url("/metrics"), tls={"ca_file": str(cert)}))
        assert len(trusted.poll().readings) == 2
        trusted.close()
        untrusted = make_source(target(srv.url("/metrics")))  # system CAs do not know the cert
        with pytest.raises(UpstreamDown) as info:
            untrusted.poll()
        assert info.value.errors == Counter({"read_error": 1})
        untrusted.close()
        skip = make_source(target(srv.url("/metrics"), tls={"insecure_skip_verify": True}))
        assert len(skip.poll().readings) == 2
        skip.close()
    finally:
        srv.close()


def test_same_gpu_from_two_targets_is_read_once(server: ExporterServer) -> None:
    server.routes["/m"] = Route(body=GOOD.encode())
    src = make_source(target(server.url("/m"), name="first"), target(server.url("/m"), name="second"))
    sample = src.poll()
    assert [d.key for d in sample.devices] == [GOOD_KEY]
    assert len(sample.readings) == 2
    src.close()


def test_duplicate_series_keep_the_first_value(server: ExporterServer) -> None:
    body = GOOD + GOOD.splitlines()[1].replace("} 44", "} 99") + "\n"
    server.routes["/d"] = Route(body=body.encode())
    src = make_source(target(server.url("/d")))
    assert [r.value for r in src.poll().readings if r.field == "DCGM_FI_DEV_GPU_TEMP"] == [44.0]
    src.close()


def test_nan_sample_is_counted_malformed_not_read(server: ExporterServer) -> None:
    server.routes["/n"] = Route(body=GOOD.replace("} 44", "} NaN").encode())
    src = make_source(target(server.url("/n")))
    sample = src.poll()
    assert sample.errors == Counter({"malformed_value": 1})
    assert [r.field for r in sample.readings] == ["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
    src.close()


def test_counter_names_are_read_as_written_on_the_wire() -> None:
    # prometheus_client's parser renames samples of `# TYPE x counter` to x_total; undone here
    text = ("# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter\nDCGM_FI_DEV_PCIE_REPLAY_COUNTER 3\n"
            "# TYPE xpum_energy_joules_total counter\nxpum_energy_joules_total 12.5\n"
            "xpum_energy_joules_created 1.7e9\n")
    assert parse_exposition(text) == [("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", {}, 3.0),
                                      ("xpum_energy_joules_total", {}, 12.5)]


def test_options_are_validated() -> None:
    """A dict (tools, tests) goes through the same typed model as the configuration file."""
    with pytest.raises(ValueError, match="unknown exporter 'dcgm'"):
        UpstreamSource(SourceContext(options={"targets": [{"url": "http://x/metrics", "exporter": "dcgm"}]}))
    for url in ("localhost:9400", "http:///metrics", "ftp://h/metrics"):
        with pytest.raises(ValueError, match="http:// or https:// URL with a host"):
            UpstreamSource(SourceContext(options={"targets": [{"url": url, "exporter": "dcgm-exporter"}]}))
    with pytest.raises(ValueError, match="used twice"):
        UpstreamSource(SourceContext(options={"targets": [target("http://a/m", name="x"), target("http://b/m", name="x")]}))
    for bad in ({"timeout": 0}, {"timeout": 7200}, {"max_series": 0}, {"max_label_values": True},
                {"max_series": 2_000_000}, {"max_series": "lots"}, {"schema": "no spaces allowed"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            UpstreamSource(SourceContext(options={"targets": [target("http://a/m", **bad)]}))
    with pytest.raises(SourceUnavailable, match="no upstream targets"):
        UpstreamSource(SourceContext(options={})).open()
    # the caps and the pin the README documents reach the target, defaults from the model alone
    src = UpstreamSource(SourceContext(options={"targets": [
        target("http://a/m", max_series=500, max_label_values=50, schema="dcgm-4.6"), target("http://b/m", name="u")]}))
    (a, b) = src._targets
    assert (a.max_series, a.max_label_values, a.schema, a.timeout) == (500, 50, "dcgm-4.6", 5.0)
    assert (b.max_series, b.max_label_values, b.schema) == (20_000, 1_000, "")
    assert UpstreamSource.secondary is True  # native sources win for the same GPU
