"""Issue 20, Medium 4: upstream bodies bounded after decompression, no redirects, http(s) only at
config load, series and label-value limits per target, errors logged once per state change with
the offending line truncated."""

from __future__ import annotations

import gzip
import logging
import resource
import subprocess
import sys
import time

import pytest

from exporter.sources.upstream import MAX_BODY_BYTES, UpstreamDown
from tests.conftest import REPO
from tests.test_upstream_http import GOOD, ExporterServer, Route, make_source, server, target  # noqa: F401


def _series_lines(n: int, label: str = "container") -> bytes:
    rows = ["# TYPE DCGM_FI_DEV_GPU_TEMP gauge"]
    for i in range(n):
        rows.append(f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",UUID="GPU-11111111-2222-3333-4444-555555555555",'
                    f'pci_bus_id="00000000:3B:00.0",{label}="c{i}"}} 44')
    return ("\n".join(rows) + "\n").encode()


def test_gzip_bomb_fails_the_target_without_inflating(server: ExporterServer) -> None:  # noqa: F811
    bomb = gzip.compress(b"\0" * (MAX_BODY_BYTES * 4), 9)  # ~130 KB on the wire, 128 MiB inflated
    assert len(bomb) < 1_000_000
    server.routes["/bomb"] = Route(body=bomb, content_type="text/plain")

    # serve it pre-compressed with Content-Encoding: gzip
    class Pre(Route):
        pass
    route = server.routes["/bomb"]
    route.gzip = False
    server.routes["/bomb"] = route
    orig = server.httpd.RequestHandlerClass.do_GET

    def do_get(handler):  # noqa: ANN001
        if handler.path != "/bomb":
            return orig(handler)
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain")
        handler.send_header("Content-Encoding", "gzip")
        handler.send_header("Content-Length", str(len(bomb)))
        handler.end_headers()
        handler.wfile.write(bomb)
    server.httpd.RequestHandlerClass.do_GET = do_get
    src = make_source(target(server.url("/bomb")))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(UpstreamDown, match="decompressed body larger"):
        src.poll()
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kb < 96 * 1024, grown_kb  # never the 128 MiB (or 4 GB) the bomb expands to


def test_redirect_is_refused(server: ExporterServer) -> None:  # noqa: F811
    server.routes["/good"] = Route(body=GOOD.encode())
    orig = server.httpd.RequestHandlerClass.do_GET

    def do_get(handler):  # noqa: ANN001
        if handler.path != "/moved":
            return orig(handler)
        handler.send_response(302)
        handler.send_header("Location", server.url("/good"))  # urllib would follow this
        handler.send_header("Content-Length", "0")
        handler.end_headers()
    server.httpd.RequestHandlerClass.do_GET = do_get
    src = make_source(target(server.url("/moved")))
    with pytest.raises(UpstreamDown, match="redirect"):
        src.poll()
    assert server.hits["/good"] == 0


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://127.0.0.1/x", "http:///nohost"])
def test_non_http_urls_fail_check_config(tmp_path, url: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"collectors:\n  upstream:\n    options:\n      targets:\n"
                   f"        - {{name: t, url: '{url}', exporter: dcgm-exporter}}\n")
    r = subprocess.run([sys.executable, "-m", "exporter", "--check-config", "--config.file", str(cfg)],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stdout
    assert "http:// or https://" in r.stderr


def test_series_and_label_value_limits(server: ExporterServer) -> None:  # noqa: F811
    server.routes["/many"] = Route(body=_series_lines(2000))
    src = make_source(target(server.url("/many"), max_label_values=1000))
    with pytest.raises(UpstreamDown, match="more than 1000 distinct values"):
        src.poll()
    src = make_source(target(server.url("/many"), max_series=500, max_label_values=5000))
    with pytest.raises(UpstreamDown, match="above max_series 500"):
        src.poll()
    src = make_source(target(server.url("/many"), max_label_values=5000))
    assert len(src.poll().readings) == 2000
    long = GOOD.replace('Hostname="h"', 'Hostname="' + "h" * 5000 + '"').encode()
    server.routes["/long"] = Route(body=long)
    with pytest.raises(UpstreamDown, match="5000 characters"):
        make_source(target(server.url("/long"))).poll()


def test_malformed_huge_line_logged_once_and_truncated(server: ExporterServer, caplog) -> None:  # noqa: F811
    line = b'DCGM_FI_DEV_GPU_TEMP{gpu="0" ' + b"x" * (2 * 1024 * 1024) + b"\n"
    server.routes["/junk"] = Route(body=line)
    server.routes["/good"] = Route(body=GOOD.encode())
    src = make_source(target(server.url("/junk"), name="junk"), target(server.url("/good"), name="good"))
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            sample = src.poll()
            assert sample.errors["parse_error"] == 1
    msgs = [r.getMessage() for r in caplog.records if "junk" in r.getMessage()]
    assert len(msgs) == 1  # once per target and state change, not per poll
    assert len(msgs[0]) < 2000


def test_sigterm_is_prompt_while_an_upstream_body_is_being_read(tmp_path, server: ExporterServer) -> None:  # noqa: F811
    import signal

    from tests.reliability_util import ExporterProcess
    # a target that trickles a large body: a read is always in progress (30 s per poll)
    body = GOOD.encode() + b"# " + b"x" * 60_000 + b"\n"
    server.routes["/slow"] = Route(body=body, trickle=0.008)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("collectors:\n  upstream:\n    enabled: true\n    timeout: 60s\n    interval: 1s\n"
                   "    options:\n      targets:\n"
                   f"        - {{name: slow, url: '{server.url('/slow')}', exporter: dcgm-exporter, timeout: 60}}\n")
    exp = ExporterProcess(["--config.file", str(cfg), "--simulate"], tmp_path)
    try:
        deadline = time.monotonic() + 20
        while server.hits["/slow"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.hits["/slow"] >= 1  # a read is under way
        rc, elapsed = exp.stop(signal.SIGTERM, timeout=15)
    finally:
        if exp.proc.poll() is None:
            exp.stop(signal.SIGKILL)
    assert rc == 0
    assert elapsed < 4.0, f"SIGTERM took {elapsed:.2f}s"  # documented 2 s; margin for a busy host
