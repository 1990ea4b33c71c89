"""The exporter itself (CLI, real process) serves /metrics over TLS with basic auth from
--web.config.file; wrong credentials get a bare 401 and plain HTTP is refused."""

from __future__ import annotations

import base64
import ssl
import time
import urllib.error
import urllib.request

import bcrypt
import pytest

from tests.e2e_util import ProcessSet, exporter
from tests.test_webconfig_tls import tls_files  # noqa: F401 - the session fixture (openssl PKI)

PASSWORD = "s3cret-scrape"


def _get(url: str, ctx: ssl.SSLContext | None, user: str | None = None, password: str = ""):
    req = urllib.request.Request(url)
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=5) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


@pytest.fixture
def tls_exporter(tmp_path, tls_files):  # noqa: F811
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {tls_files['server.pem']}\n"
                   f"  key_file: {tls_files['server.key']}\n"
                   f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    ctx = ssl.create_default_context(cafile=str(tls_files["ca.pem"]))
    with ProcessSet() as procs:
        server = procs.add(exporter(tmp_path, ["--simulate", "--web.config.file", str(web)]))
        server.start()
        url = f"https://127.0.0.1:{server.port}"
        deadline = time.monotonic() + 20
        while True:
            assert server.proc.poll() is None, server.log()[-3000:]
            try:
                if _get(url + "/readyz", ctx, "prometheus", PASSWORD)[0] == 200:
                    break
            except (OSError, urllib.error.URLError):
                pass
            assert time.monotonic() < deadline, server.log()[-3000:]
            time.sleep(0.1)
        yield url, ctx, server


def test_metrics_over_tls_with_basic_auth(tls_exporter):
    url, ctx, _ = tls_exporter
    status, headers, body = _get(url + "/metrics", ctx, "prometheus", PASSWORD)
    assert status == 200
    assert "gpu_compute_utilization_percent{" in body


def test_wrong_or_missing_credentials_get_a_bare_401(tls_exporter):
    url, ctx, server = tls_exporter
    for user, password in (("prometheus", "wrong"), ("nobody", PASSWORD), (None, "")):
        status, headers, body = _get(url + "/metrics", ctx, user, password)
        assert status == 401
        assert headers.get("WWW-Authenticate", "").startswith("Basic")
        assert "gpu_" not in body and "nobody" not in body and "wrong" not in body
    assert PASSWORD not in server.log() and "wrong" not in server.log()


def test_plain_http_is_refused(tls_exporter):
    url, _, _ = tls_exporter
    status, _, body = _get(url.replace("https://", "http://") + "/metrics", None, "prometheus", PASSWORD)
    assert status == 400 and "gpu_" not in body  # even with the right password: never served


def test_plain_http_on_the_tls_port_gets_400_like_go(tls_exporter):
    import socket
    from urllib.parse import urlsplit
    url, _, _ = tls_exporter
    u = urlsplit(url)
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    assert data.startswith(b"HTTP/1.0 400 Bad Request\r\n")
    assert b"Client sent an HTTP request to an HTTPS server" in data
    assert b"gpu_" not in data


def test_invalid_web_config_fails_at_start(tmp_path):
    import subprocess

    from tests.e2e_util import EXPORTER_CMD

    web = tmp_path / "web.yml"
    web.write_text("tls_server_config:\n  cert_file: /nonexistent.pem\n")
    proc = subprocess.run([*EXPORTER_CMD, "--check-config", "--web.config.file", str(web)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0
    assert str(web) in proc.stderr
