"""The OTLP push over real TLS (openssl certificates), through a real proxy, and what of the
environment it ignores: requests' CA bundle and proxy variables, the SDK's certificate variables,
gRPC's proxy variables.  The end-to-end test runs the daemon with a wrong CA bundle in its
environment."""

from __future__ import annotations

import logging
import re
import signal
import ssl
import time
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otlp extra (make install)")

from exporter.config import load_config  # noqa: E402
from exporter.map.schema import load_schema  # noqa: E402
from exporter.otlp.naming import load_mapping  # noqa: E402
from exporter.otlp.pusher import Pusher  # noqa: E402
from exporter.render.otlp_stats import PushStats  # noqa: E402
from tests.e2e_util import ProcessSet, exporter, free_port, http_get, wait_until  # noqa: E402
from tests.otlp_receiver import ConnectProxy, GrpcReceiver, OtlpReceiver  # noqa: E402
from tests.test_webconfig_tls import tls_files  # noqa: E402, F401 - the session fixture (openssl PKI)

CYCLE = b'gpu_power_watts{vendor="nvidia",gpu="0",uuid="u"} 10\n'
CA_VARIABLES = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "OTEL_EXPORTER_OTLP_CERTIFICATE",
                "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE")
PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy", "grpc_proxy")


@pytest.fixture(scope="module")
def names():
    schema = load_schema()
    return schema, load_mapping(schema)


def _server_ctx(files: dict[str, Path], client_ca: str | None = None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(files["server.pem"], files["server.key"])
    if client_ca:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(files[client_ca])
    return ctx


def _environment(monkeypatch, bundle: Path | None, proxies: bool = True) -> None:  # noqa: ANN001
    """A CA bundle in every variable a client library might read, and a dead proxy in every proxy
    variable: a push that honoured any of them would verify against ``bundle`` or go nowhere."""
    dead = f"http://127.0.0.1:{free_port()}"
    for var in CA_VARIABLES:
        if bundle is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, str(bundle))
    for var in PROXY_VARIABLES:
        if proxies:
            monkeypatch.setenv(var, dead)
        else:
            monkeypatch.delenv(var, raising=False)
    for var in ("NO_PROXY", "no_proxy", "no_grpc_proxy"):
        monkeypatch.delenv(var, raising=False)


def _otlp(tmp: Path, endpoint: str, extra: str = "", timeout: str = "3s", protocol: str = "http/protobuf"):  # noqa: ANN202
    conf = tmp / "config.yml"
    conf.write_text(f"exporters:\n  otlp:\n    enabled: true\n    protocol: {protocol}\n    endpoint: {endpoint}\n"
                    f"    interval: 5s\n    timeout: {timeout}\n{extra}")
    return load_config(conf).exporters.otlp


def _push_once(cfg, names) -> PushStats:  # noqa: ANN001
    stats = PushStats()
    schema, mapping = names
    pusher = Pusher(cfg, mapping, schema, lambda static: {"service.name": "t"}, stats)

    class Cycle:
        failed, text, at = False, CYCLE, time.time()

    assert pusher.offer(Cycle(), ())
    assert pusher.pushed.wait(30), "the push did not end"
    pusher.close(wait=5)
    return stats


def _tls(files: dict[str, Path], ca: str, client: bool = False) -> str:
    lines = f"    tls:\n      ca_file: {files[ca]}\n"
    if client:
        lines += f"      cert_file: {files['client.pem']}\n      key_file: {files['client.key']}\n"
    return lines


def test_the_configured_ca_is_used_whatever_bundle_the_environment_names(tmp_path, tls_files, names, monkeypatch):  # noqa: F811
    """REQUESTS_CA_BUNDLE/CURL_CA_BUNDLE (which requests lets override a session's CA) and the
    SDK's certificate variables name another CA, the proxy variables a dead proxy: the push
    verifies against tls.ca_file and connects directly."""
    _environment(monkeypatch, tls_files["rogueca.pem"])
    with OtlpReceiver(tls=_server_ctx(tls_files)) as receiver:
        stats = _push_once(_otlp(tmp_path, receiver.url, _tls(tls_files, "ca.pem")), names)
        assert (stats.success, stats.failure) == (1, 0)
        assert len(receiver.requests) == 1


def test_a_wrong_configured_ca_fails_closed_and_the_log_says_why(tmp_path, tls_files, names, monkeypatch, caplog):  # noqa: F811
    """The right CA in every environment variable does not rescue a wrong tls.ca_file.  The
    timeout is shorter than the SDK's first retry backoff, so the SDK itself logs only its
    summary ("... due to timeout, max retries or shutdown."): the reason logged is the TLS error."""
    _environment(monkeypatch, tls_files["ca.pem"])
    caplog.set_level(logging.INFO, logger="unified_gpu_exporter")
    with OtlpReceiver(tls=_server_ctx(tls_files)) as receiver:
        stats = _push_once(_otlp(tmp_path, receiver.url, _tls(tls_files, "rogueca.pem"), timeout="500ms"), names)
        assert (stats.success, stats.failure) == (0, 1)
        assert receiver.requests == []
    (record,) = [r for r in caplog.records if r.getMessage().startswith("OTLP push failing")]
    assert "CERTIFICATE_VERIFY_FAILED" in record.reason, record.reason


def test_without_ca_file_the_system_store_verifies_not_the_environment(tmp_path, tls_files, names, monkeypatch):  # noqa: F811
    _environment(monkeypatch, tls_files["ca.pem"], proxies=False)
    with OtlpReceiver(tls=_server_ctx(tls_files)) as receiver:
        stats = _push_once(_otlp(tmp_path, receiver.url, timeout="500ms"), names)
        assert (stats.success, stats.failure) == (0, 1)  # the test CA is in no system store
        assert receiver.requests == []


def test_mutual_tls_sends_the_configured_client_certificate(tmp_path, tls_files, names, monkeypatch):  # noqa: F811
    _environment(monkeypatch, None)
    with OtlpReceiver(tls=_server_ctx(tls_files, client_ca="clientca.pem")) as receiver:
        stats = _push_once(_otlp(tmp_path, receiver.url, _tls(tls_files, "ca.pem", client=True)), names)
        assert (stats.success, stats.failure) == (1, 0)
        stats = _push_once(_otlp(tmp_path, receiver.url, _tls(tls_files, "ca.pem"), timeout="500ms"), names)
        assert (stats.success, stats.failure) == (0, 1)  # no client certificate: refused
        assert len(receiver.requests) == 1


def test_proxy_url_tunnels_the_https_push(tmp_path, tls_files, names, monkeypatch):  # noqa: F811
    """Only the configured proxy is used (the environment's is dead): the push reaches the
    receiver through a CONNECT tunnel to the endpoint's host."""
    _environment(monkeypatch, None)
    with OtlpReceiver(tls=_server_ctx(tls_files)) as receiver, ConnectProxy() as proxy:
        endpoint = f"https://localhost:{receiver.port}/v1/metrics"
        extra = _tls(tls_files, "ca.pem") + f"    proxy_url: {proxy.url}\n"
        stats = _push_once(_otlp(tmp_path, endpoint, extra), names)
        assert (stats.success, stats.failure) == (1, 0)
        assert proxy.targets == [f"localhost:{receiver.port}"]
        assert len(receiver.requests) == 1


@pytest.fixture
def grpc_receiver():
    pytest.importorskip("grpc", reason="grpcio (the otlp-grpc extra)")
    with GrpcReceiver() as receiver:
        yield receiver.port, receiver.requests


def test_grpc_ignores_the_proxy_variables_and_uses_proxy_url(tmp_path, names, monkeypatch, grpc_receiver):
    port, got = grpc_receiver
    _environment(monkeypatch, None)
    stats = _push_once(_otlp(tmp_path, f"http://127.0.0.1:{port}", protocol="grpc"), names)
    assert (stats.success, stats.failure) == (1, 0)  # gRPC's grpc_proxy/https_proxy/http_proxy: not read
    with ConnectProxy() as proxy:
        extra = f"    proxy_url: {proxy.url}\n"
        stats = _push_once(_otlp(tmp_path, f"http://127.0.0.1:{port}", extra, protocol="grpc"), names)
        assert (stats.success, stats.failure) == (1, 0)
        assert proxy.targets == [f"127.0.0.1:{port}"]
    assert len(got) == 2


def test_proxy_url_must_be_an_http_proxy(tmp_path):
    from exporter.yamlfile import ConfigError

    with pytest.raises(ConfigError, match="give an HTTP proxy as http://host:port"):
        _otlp(tmp_path, "http://127.0.0.1:1/v1/metrics", "    proxy_url: socks5://127.0.0.1:1080\n")


def test_daemon_pushes_with_the_configured_ca_and_logs_the_tls_error_after_a_reload(tmp_path, tls_files,  # noqa: F811
                                                                                   monkeypatch):
    """End to end: the daemon's environment names the wrong CA bundle and a dead proxy; it pushes
    to the HTTPS receiver with tls.ca_file.  Reloaded with a wrong ca_file, it stops pushing
    (fails closed) and logs the certificate error once."""
    conf = tmp_path / "config.yml"
    with OtlpReceiver(tls=_server_ctx(tls_files)) as receiver, ProcessSet() as procs:
        def write(ca: str) -> None:
            conf.write_text(f"exporters:\n  otlp:\n    enabled: true\n    endpoint: {receiver.url}\n"
                            f"    interval: 1s\n    timeout: 500ms\n{_tls(tls_files, ca)}")

        write("ca.pem")
        with monkeypatch.context() as env:  # the daemon's environment only (the test's client uses no proxy)
            _environment(env, tls_files["rogueca.pem"])
            server = procs.add(exporter(tmp_path, ["--simulate", "--config.file", str(conf), "--poll.interval", "1s"]))
        server.start().wait_ready("/readyz", 15)
        assert receiver.wait_for(2, 30)[1:], "no push over TLS"
        write("rogueca.pem")
        server.signal(signal.SIGHUP)
        wait_until(lambda: "OTLP push failing" in server.log(), 30, what="the failure logged")
        n = len(receiver.requests)
        line = next(ln for ln in server.log().splitlines() if "OTLP push failing" in ln)
        assert "CERTIFICATE_VERIFY_FAILED" in line, line
        failed = _failures(server)
        wait_until(lambda: _failures(server) >= failed + 2, 30, what="two more failed pushes")
        assert len(receiver.requests) <= n + 1  # at most the old push's last cycle, under way at the reload
        assert server.log().count("OTLP push failing") == 1


def _failures(server) -> float:  # noqa: ANN001
    text = http_get(server.url + "/metrics").text
    (value,) = re.findall(r'^unified_gpu_exporter_otlp_exports_total\{result="failure"\} (\S+)$', text, re.M)
    return float(value)
