"""Real TLS, mTLS and basic auth against an aiohttp server using exporter.serve.webconfig.

Certificates are generated per test session with the ``openssl`` CLI (Debian package: openssl).
Clients: Python ssl/aiohttp, curl (package curl) and a real Prometheus (package prometheus).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import socket
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

import aiohttp
import bcrypt
import pytest
import yaml
from aiohttp import web

from exporter.serve import webconfig as wc
from exporter.serve.webconfig import (
    WebConfig,
    WebConfigError,
    WebConfigWatcher,
    auth_middleware,
)
from tests.conftest import require_binary

REPO = Path(__file__).resolve().parent.parent
PASSWORD = "correct horse"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
METRICS = "# HELP tls_test_value A test value.\n# TYPE tls_test_value gauge\ntls_test_value 42\n"


# --------------------------------------------------------------------------- certificates
def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def _ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
             cwd=d)


def _leaf(d: Path, name: str, ca: str, san: str, usage: str) -> None:
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    (d / f"{name}.ext").write_text(f"subjectAltName={san}\nextendedKeyUsage={usage}\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory) -> dict[str, Path]:
    require_binary("openssl", "openssl")
    d = tmp_path_factory.mktemp("pki")
    _ca(d, "ca")
    _ca(d, "clientca")
    _ca(d, "rogueca")
    _leaf(d, "server", "ca", "IP:127.0.0.1,DNS:localhost", "serverAuth")
    _leaf(d, "server2", "ca", "IP:127.0.0.1,DNS:localhost", "serverAuth")
    _leaf(d, "client", "clientca", "DNS:scraper.example", "clientAuth")
    _leaf(d, "intruder", "clientca", "DNS:intruder.example", "clientAuth")
    _leaf(d, "rogue", "rogueca", "DNS:scraper.example", "clientAuth")
    return {p.name: p for p in d.iterdir()}


def write_cfg(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "web.yml"
    p.write_text(text)
    return p


# --------------------------------------------------------------------------- server
class Served:
    def __init__(self, runner: web.AppRunner, port: int) -> None:
        self.runner = runner
        self.port = port
        self.url = f"https://127.0.0.1:{port}/metrics"


async def serve(watcher: WebConfigWatcher) -> Served:
    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(text=METRICS, content_type="text/plain")

    app = web.Application(middlewares=[auth_middleware(watcher.current)])
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=watcher.ssl_context())
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return Served(runner, port)


def client_ctx(files: dict[str, Path], cert: str | None = None, **kw) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(files["ca.pem"]))
    if cert:
        ctx.load_cert_chain(files[f"{cert}.pem"], files[f"{cert}.key"])
    for k, v in kw.items():
        setattr(ctx, k, v)
    return ctx


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


async def get(url: str, ctx: ssl.SSLContext | bool, auth: dict[str, str] | None = None):
    async with aiohttp.ClientSession() as s, s.get(url, ssl=ctx, headers=auth) as r:
        return r.status, dict(r.headers), await r.text()


def tls_cfg(files, extra: str = "") -> str:
    return (f"tls_server_config:\n  cert_file: {files['server.pem']}\n  key_file: {files['server.key']}\n"
            + extra)


# --------------------------------------------------------------------------- context building
def test_cipher_suite_mapping_restricts_tls12(tmp_path, tls_files):
    p = write_cfg(tmp_path, tls_cfg(tls_files, "  max_version: TLS12\n  cipher_suites: "
                                    "[TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, TLS_AES_128_GCM_SHA256]\n"))
    ctx = WebConfig.load(p).build_ssl_context()
    tls12 = {c["name"] for c in ctx.get_ciphers() if c["protocol"] == "TLSv1.2"}
    assert tls12 == {"ECDHE-ECDSA-AES256-GCM-SHA384"}
    assert ctx.maximum_version == ssl.TLSVersion.TLSv1_2
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert ctx.verify_mode == ssl.CERT_NONE


@pytest.mark.parametrize(("kind", "mode"), [("VerifyClientCertIfGiven", ssl.CERT_OPTIONAL),
                                            ("RequireAndVerifyClientCert", ssl.CERT_REQUIRED),
                                            ("RequestClientCert", ssl.CERT_NONE)])
def test_verify_modes(tmp_path, tls_files, kind, mode):
    ca = f"  client_ca_file: {tls_files['clientca.pem']}\n" if kind != "RequestClientCert" else ""
    p = write_cfg(tmp_path, tls_cfg(tls_files, f"  client_auth_type: {kind}\n{ca}"))
    assert WebConfig.load(p).build_ssl_context().verify_mode == mode


def test_inline_cert_and_key(tmp_path, tls_files):
    cert = tls_files["server.pem"].read_text()
    key = tls_files["server.key"].read_text()
    p = write_cfg(tmp_path, f"tls_server_config:\n  cert: {json.dumps(cert)}\n  key: {json.dumps(key)}\n")
    cfg = WebConfig.load(p)
    assert cfg.tls_enabled
    assert cfg.build_ssl_context().verify_mode == ssl.CERT_NONE
    assert "PRIVATE KEY" not in repr(cfg.tls)  # the key never shows in reprs/logs


def test_key_not_matching_cert_is_error(tmp_path, tls_files):
    p = write_cfg(tmp_path, f"tls_server_config:\n  cert_file: {tls_files['server.pem']}\n"
                            f"  key_file: {tls_files['client.key']}\n")
    with pytest.raises(WebConfigError, match=r"tls_server_config\.cert_file/key_file"):
        WebConfig.load(p)


def test_shipped_example_loads_with_real_files(tmp_path, tls_files):
    text = (REPO / "deploy" / "web-config.example.yml").read_text()
    text = (text.replace("/etc/unified-gpu-exporter/tls/server.crt", str(tls_files["server.pem"]))
                .replace("/etc/unified-gpu-exporter/tls/server.key", str(tls_files["server.key"]))
                .replace("/etc/unified-gpu-exporter/tls/client-ca.crt", str(tls_files["clientca.pem"])))
    cfg = WebConfig.load(write_cfg(tmp_path, text))
    assert cfg.tls.client_auth_type == "RequireAndVerifyClientCert"
    assert bcrypt.checkpw(b"change-me", cfg.users["prometheus"])
    assert cfg.headers["X-Frame-Options"] == "deny"


# --------------------------------------------------------------------------- live TLS
@pytest.mark.asyncio
async def test_tls_serves_and_plain_http_is_refused(tmp_path, tls_files):
    srv = await serve(WebConfigWatcher(write_cfg(tmp_path, tls_cfg(tls_files))))
    try:
        status, _, body = await get(srv.url, client_ctx(tls_files))
        assert (status, body) == (200, METRICS)
        with pytest.raises(aiohttp.ClientError):
            await get(srv.url.replace("https", "http"), False)
        # a client that does not trust our CA fails verification
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await get(srv.url, ssl.create_default_context())
    finally:
        await srv.runner.cleanup()


@pytest.mark.asyncio
async def test_min_version_tls13_refuses_tls12_client(tmp_path, tls_files):
    srv = await serve(WebConfigWatcher(write_cfg(tmp_path, tls_cfg(tls_files, "  min_version: TLS13\n"))))
    try:
        assert (await get(srv.url, client_ctx(tls_files)))[0] == 200
        with pytest.raises(aiohttp.ClientError):
            await get(srv.url, client_ctx(tls_files, maximum_version=ssl.TLSVersion.TLSv1_2))
    finally:
        await srv.runner.cleanup()


@pytest.mark.asyncio
async def test_basic_auth_401_without_detail_and_headers(tmp_path, tls_files, monkeypatch):
    calls = []
    real = wc.auth._bcrypt_ok

    def counting(pw, h):
        calls.append(1)
        return real(pw, h)

    monkeypatch.setattr(wc.auth, "_bcrypt_ok", counting)
    cfg = tls_cfg(tls_files) + (f"basic_auth_users:\n  prometheus: '{HASH}'\n"
                                "http_server_config:\n  headers:\n    X-Frame-Options: deny\n")
    srv = await serve(WebConfigWatcher(write_cfg(tmp_path, cfg)))
    ctx = client_ctx(tls_files)
    try:
        for auth in (None, basic("prometheus", "wrong"), basic("nobody", PASSWORD)):
            status, headers, body = await get(srv.url, ctx, auth)
            assert status == 401
            assert headers["WWW-Authenticate"] == "Basic"
            assert body == "Unauthorized\n"  # no hint which part was wrong
            assert headers["X-Frame-Options"] == "deny"
        calls.clear()
        for _ in range(3):
            status, headers, body = await get(srv.url, ctx, basic("prometheus", PASSWORD))
            assert (status, body) == (200, METRICS)
            assert headers["X-Frame-Options"] == "deny"
        assert len(calls) == 1  # bcrypt ran once; later scrapes hit the sha256-keyed cache
        # malformed Authorization headers are plain 401s
        async with aiohttp.ClientSession() as s:
            for h in ("Basic !!!", "Bearer abc", "Basic " + "cHJvbWV0aGV1cw=="):
                async with s.get(srv.url, ssl=ctx, headers={"Authorization": h}) as r:
                    assert r.status == 401
    finally:
        await srv.runner.cleanup()


@pytest.mark.asyncio
async def test_mtls_require_and_verify(tmp_path, tls_files):
    cfg = tls_cfg(tls_files, f"  client_auth_type: RequireAndVerifyClientCert\n"
                             f"  client_ca_file: {tls_files['clientca.pem']}\n"
                             f"  client_allowed_sans: [scraper.example]\n")
    srv = await serve(WebConfigWatcher(write_cfg(tmp_path, cfg)))
    try:
        assert (await get(srv.url, client_ctx(tls_files, "client")))[0] == 200
        with pytest.raises(aiohttp.ClientError):  # no client certificate
            await get(srv.url, client_ctx(tls_files))
        with pytest.raises(aiohttp.ClientError):  # certificate from an untrusted CA
            await get(srv.url, client_ctx(tls_files, "rogue"))
        # trusted CA but SAN not in client_allowed_sans
        status, _, body = await get(srv.url, client_ctx(tls_files, "intruder"))
        assert (status, body) == (403, "Forbidden\n")
    finally:
        await srv.runner.cleanup()


async def _peer_cn(port: int, ctx: ssl.SSLContext) -> str:
    _r, w = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    cert = w.get_extra_info("peercert")
    w.close()
    return dict(x[0] for x in cert["subject"])["commonName"]


@pytest.mark.asyncio
async def test_rotated_certificate_applies_without_restart(tmp_path, tls_files):
    d = tmp_path / "tls"
    d.mkdir()
    shutil.copy(tls_files["server.pem"], d / "tls.crt")
    shutil.copy(tls_files["server.key"], d / "tls.key")
    p = write_cfg(tmp_path, "tls_server_config:\n  cert_file: tls/tls.crt\n  key_file: tls/tls.key\n")
    srv = await serve(WebConfigWatcher(p, min_check_interval=0))
    ctx = client_ctx(tls_files)
    try:
        assert await _peer_cn(srv.port, ctx) == "server"
        # rotate like cert-manager / a Secret update: write new files, atomically renamed
        shutil.copy(tls_files["server2.pem"], d / "new.crt")
        shutil.copy(tls_files["server2.key"], d / "new.key")
        os.replace(d / "new.key", d / "tls.key")
        os.replace(d / "new.crt", d / "tls.crt")
        assert await _peer_cn(srv.port, ctx) == "server2"
        assert (await get(srv.url, ctx))[0] == 200
        # a broken rotation keeps the last good certificate
        (d / "tls.crt").write_text("garbage\n")
        assert await _peer_cn(srv.port, ctx) == "server2"
    finally:
        await srv.runner.cleanup()


@pytest.mark.asyncio
async def test_static_config_context_also_follows_cert_files(tmp_path, tls_files):
    """WebConfig.ssl_context() without a watcher still picks up rotated cert/key files."""
    shutil.copy(tls_files["server.pem"], tmp_path / "tls.crt")
    shutil.copy(tls_files["server.key"], tmp_path / "tls.key")
    cfg = WebConfig.load(write_cfg(tmp_path, "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n"))
    server = await asyncio.start_server(lambda _r, w: w.close(), "127.0.0.1", 0, ssl=cfg.ssl_context())
    port = server.sockets[0].getsockname()[1]
    try:
        assert await _peer_cn(port, client_ctx(tls_files)) == "server"
        shutil.copy(tls_files["server2.key"], tmp_path / "tls.key")
        shutil.copy(tls_files["server2.pem"], tmp_path / "tls.crt")
        assert await _peer_cn(port, client_ctx(tls_files)) == "server2"
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.asyncio
async def test_curl_client_with_mtls_and_basic_auth(tmp_path, tls_files):
    curl = require_binary("curl", "curl")
    cfg = tls_cfg(tls_files, f"  client_auth_type: RequireAndVerifyClientCert\n"
                             f"  client_ca_file: {tls_files['clientca.pem']}\n"
                             f"basic_auth_users:\n  prometheus: '{HASH}'\n")
    srv = await serve(WebConfigWatcher(write_cfg(tmp_path, cfg)))
    base = [curl, "-sS", "--cacert", str(tls_files["ca.pem"]), "--cert", str(tls_files["client.pem"]),
            "--key", str(tls_files["client.key"]), "-o", "-", "-w", "\n%{http_code}"]
    try:
        ok = await asyncio.create_subprocess_exec(*base, "-u", f"prometheus:{PASSWORD}", srv.url,
                                                  stdout=asyncio.subprocess.PIPE)
        out, _ = await ok.communicate()
        assert out.decode().endswith(METRICS + "\n200")
        bad = await asyncio.create_subprocess_exec(*base, "-u", "prometheus:nope", srv.url,
                                                   stdout=asyncio.subprocess.PIPE)
        out, _ = await bad.communicate()
        assert out.decode() == "Unauthorized\n\n401"
    finally:
        await srv.runner.cleanup()


# --------------------------------------------------------------------------- real Prometheus
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(prom: str, expr: str) -> list[dict]:
    url = f"{prom}/api/v1/query?query={urllib.request.quote(expr)}"
    with urllib.request.urlopen(url, timeout=2) as r:
        return json.load(r)["data"]["result"]


@pytest.mark.asyncio
async def test_real_prometheus_scrapes_over_mtls_with_basic_auth(tmp_path, tls_files):
    prometheus = require_binary("prometheus", "prometheus")
    cfg = tls_cfg(tls_files, f"  client_auth_type: RequireAndVerifyClientCert\n"
                             f"  client_ca_file: {tls_files['clientca.pem']}\n"
                             f"basic_auth_users:\n  prometheus: '{HASH}'\n")
    srv = await serve(WebConfigWatcher(write_cfg(tmp_path, cfg)))
    tls = {"ca_file": str(tls_files["ca.pem"]), "cert_file": str(tls_files["client.pem"]),
           "key_file": str(tls_files["client.key"])}
    target = {"static_configs": [{"targets": [f"127.0.0.1:{srv.port}"]}], "scheme": "https",
              "tls_config": tls}
    prom_cfg = {"global": {"scrape_interval": "1s", "scrape_timeout": "900ms"}, "scrape_configs": [
        {"job_name": "good", **target, "basic_auth": {"username": "prometheus", "password": PASSWORD}},
        {"job_name": "badpass", **target, "basic_auth": {"username": "prometheus", "password": "x"}},
    ]}
    (tmp_path / "prom.yml").write_text(yaml.safe_dump(prom_cfg))
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        prometheus, f"--config.file={tmp_path / 'prom.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}", stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL)
    prom = f"http://127.0.0.1:{port}"
    try:
        up: dict[str, str] = {}
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            try:
                res = await asyncio.to_thread(_query, prom, "up")
            except OSError:
                continue
            up = {r["metric"]["job"]: r["value"][1] for r in res}
            if up == {"good": "1", "badpass": "0"}:  # a first scrape of "good" may time out: wait on
                break  # its next one rather than on the first pair of values
        assert up == {"good": "1", "badpass": "0"}
        value = await asyncio.to_thread(_query, prom, 'tls_test_value{job="good"}')
        assert value[0]["value"][1] == "42"
    finally:
        proc.terminate()
        await proc.wait()
        await srv.runner.cleanup()


@pytest.mark.asyncio
async def test_rate_limit_returns_429_after_burst(tmp_path, tls_files):
    cfg = tls_cfg(tls_files) + "rate_limit:\n  interval: 1m\n  burst: 2\n"
    srv = await serve(WebConfigWatcher(write_cfg(tmp_path, cfg)))
    try:
        statuses = [(await get(srv.url, client_ctx(tls_files)))[0] for _ in range(3)]
    finally:
        await srv.runner.cleanup()
    assert statuses == [200, 200, 429]
