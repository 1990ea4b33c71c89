"""The OTLP push where it used to lose metrics quietly or fail late: a redirecting receiver, a
per-request TLS override, TLS material rotated or broken, gRPC's no_proxy, a system CA
directory, a pusher that cannot start, a push thread that died.  Real TLS (openssl), a real
gRPC server, a real CONNECT proxy."""

from __future__ import annotations

import collections
import logging
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otlp extra (make install)")

from exporter.config import load_config  # noqa: E402
from exporter.map.schema import load_schema  # noqa: E402
from exporter.otlp import tlsfiles  # noqa: E402
from exporter.otlp.hook import OtlpOutput  # noqa: E402
from exporter.otlp.naming import load_mapping  # noqa: E402
from exporter.otlp.pusher import Pusher  # noqa: E402
from exporter.otlp.transport import PushSession, make_exporter  # noqa: E402
from exporter.render.otlp_stats import STATS, PushStats  # noqa: E402
from exporter.yamlfile import ConfigError  # noqa: E402
from tests.e2e_util import free_port, wait_until  # noqa: E402
from tests.otlp_receiver import ConnectProxy, GrpcReceiver, OtlpReceiver  # noqa: E402
from tests.test_otlp_tls import _server_ctx  # noqa: E402
from tests.test_webconfig_tls import tls_files  # noqa: E402, F401 - the session fixture (openssl PKI)

CYCLE = b'gpu_power_watts{vendor="nvidia",gpu="0",uuid="u"} 10\n'
Paths = collections.namedtuple("Paths", "cafile capath openssl_cafile_env openssl_cafile openssl_capath_env "
                                        "openssl_capath")


class _Cycle:
    failed = False

    def __init__(self) -> None:
        self.text, self.at = CYCLE, time.time()


@pytest.fixture(scope="module")
def names():
    schema = load_schema()
    return schema, load_mapping(schema)


@pytest.fixture(autouse=True)
def _no_proxy_variables(monkeypatch):
    for var in ("no_proxy", "no_grpc_proxy", "NO_PROXY", "grpc_proxy", "https_proxy", "http_proxy",
                "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"):
        monkeypatch.delenv(var, raising=False)


def _load(tmp: Path, endpoint: str, extra: str = "", protocol: str = "http/protobuf", timeout: str = "2s"):  # noqa: ANN202
    conf = tmp / "config.yml"
    conf.write_text(f"exporters:\n  otlp:\n    enabled: true\n    protocol: {protocol}\n    endpoint: {endpoint}\n"
                    f"    interval: 5s\n    timeout: {timeout}\n{extra}")
    return load_config(conf)


def _offer(pusher: Pusher, timeout: float = 30) -> None:
    """One push, due now, and its end."""
    pusher.pushed.clear()
    pusher._next_due = 0.0  # due at once: the interval is what the test skips
    assert pusher.offer(_Cycle(), ())
    assert pusher.pushed.wait(timeout), "the push did not end"


def _pusher(cfg, names, stats: PushStats) -> Pusher:  # noqa: ANN001
    schema, mapping = names
    return Pusher(cfg, mapping, schema, lambda static: {"service.name": "t"}, stats)


@pytest.fixture
def grpc_tls_receiver(tls_files):  # noqa: F811
    pytest.importorskip("grpc", reason="grpcio (the otlp-grpc extra)")
    with GrpcReceiver((tls_files["server.key"].read_bytes(), tls_files["server.pem"].read_bytes())) as receiver:
        yield receiver.port, receiver.requests


@pytest.fixture
def grpc_plain_receiver():
    pytest.importorskip("grpc", reason="grpcio (the otlp-grpc extra)")
    with GrpcReceiver() as receiver:
        yield receiver.port, receiver.requests


# --------------------------------------------------------------------------- OTLP/HTTP transport

def test_a_redirecting_receiver_is_a_failed_push_with_the_status(tmp_path, names, caplog):
    """An ingress that redirects (308 to https://) receives nothing: the SDK would count the 3xx
    a success; the push counts a failure and logs the status and where it points."""
    caplog.set_level(logging.INFO, logger="unified_gpu_exporter")
    stats = PushStats()
    with OtlpReceiver(status=308) as receiver:
        pusher = _pusher(_load(tmp_path, receiver.url).exporters.otlp, names, stats)
        _offer(pusher)
        pusher.close(wait=5)
    assert (stats.success, stats.failure) == (0, 1)
    (record,) = [r for r in caplog.records if r.getMessage().startswith("OTLP push failing")]
    assert record.reason.startswith("HTTP 308 Permanent Redirect: the receiver redirects"), record.reason


def test_the_session_keeps_its_tls_and_proxy_whatever_a_request_passes(tmp_path, tls_files):  # noqa: F811
    """An SDK that passed verify=/cert=/proxies= per request would beat the session's settings:
    verify=False against a receiver the configured CA does not sign still fails, cert=None still
    sends the client certificate, a per-request proxy is not used."""
    session = PushSession(_load(tmp_path, "https://127.0.0.1:1/v1/metrics",
                                f"    tls: {{ca_file: {tls_files['rogueca.pem']}}}\n").exporters.otlp)
    with OtlpReceiver(tls=_server_ctx(tls_files)) as receiver:
        with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
            session.post(receiver.url, data=b"", verify=False, timeout=5)
        assert receiver.requests == []
    tls = (f"    tls: {{ca_file: {tls_files['ca.pem']}, cert_file: {tls_files['client.pem']}, "
           f"key_file: {tls_files['client.key']}}}\n")
    session = PushSession(_load(tmp_path, "https://127.0.0.1:1/v1/metrics", tls).exporters.otlp)
    dead = f"http://127.0.0.1:{free_port()}"
    with OtlpReceiver(tls=_server_ctx(tls_files, client_ca="clientca.pem")) as receiver:
        response = session.post(receiver.url, data=b"", cert=None, proxies={"https": dead, "http": dead},
                                verify=str(tls_files["rogueca.pem"]), timeout=5)
        assert response.status_code == 200
        assert len(receiver.requests) == 1


# --------------------------------------------------------------------------- TLS material at load

def test_tls_files_are_loaded_as_openssl_will_at_config_load(tmp_path, tls_files):  # noqa: F811
    """An encrypted client key, a key of another certificate, a CA file with no certificate: the
    config load fails naming the file, its line and the field, not every push."""
    encrypted = tmp_path / "encrypted.key"
    subprocess.run(["openssl", "pkey", "-in", str(tls_files["client.key"]), "-aes256", "-passout", "pass:s3cret",
                    "-out", str(encrypted)], check=True, capture_output=True, timeout=60)
    url = "https://collector.example:4318/v1/metrics"

    def tls(ca: Path, cert: Path, key: Path) -> str:
        return f"    tls:\n      ca_file: {ca}\n      cert_file: {cert}\n      key_file: {key}\n"

    ok = tls(tls_files["ca.pem"], tls_files["client.pem"], tls_files["client.key"])
    assert _load(tmp_path, url, ok).exporters.otlp.tls.digest
    with pytest.raises(ConfigError) as exc:
        _load(tmp_path, url, tls(tls_files["ca.pem"], tls_files["client.pem"], encrypted))
    assert f"config.yml:11: exporters.otlp.tls.key_file: {encrypted}: the key is encrypted" in str(exc.value)
    assert "s3cret" not in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        _load(tmp_path, url, tls(tls_files["ca.pem"], tls_files["client.pem"], tls_files["intruder.key"]))
    assert (f"config.yml:11: exporters.otlp.tls.key_file: {tls_files['intruder.key']}: not the key of "
            f"cert_file {tls_files['client.pem']}") in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        _load(tmp_path, url, tls(tls_files["client.key"], tls_files["client.pem"], tls_files["client.key"]))
    assert (f"config.yml:9: exporters.otlp.tls.ca_file: {tls_files['client.key']}: not a file of PEM "
            "CA certificates") in str(exc.value)


def test_tls_or_headers_with_a_plaintext_endpoint_need_allow_plaintext(tmp_path, tls_files):  # noqa: F811
    headers = tmp_path / "h"
    headers.write_text("Authorization: Bearer x\n")
    ca = f"    tls: {{ca_file: {tls_files['ca.pem']}}}\n"
    for extra, given in ((f"    headers_file: {headers}\n", "headers_file"), (ca, "tls"),
                         (f"    headers_file: {headers}\n{ca}", "headers_file and tls")):
        for protocol in ("http/protobuf", "grpc"):
            with pytest.raises(ConfigError, match=f"config.yml:2: exporters.otlp: {given} with the plaintext endpoint "
                                                  "http://127.0.0.1:4318/x: the headers"):
                _load(tmp_path, "http://127.0.0.1:4318/x", extra, protocol)
            _load(tmp_path, "http://127.0.0.1:4318/x", extra + "    allow_plaintext: true\n", protocol)
            _load(tmp_path, "https://127.0.0.1:4318/x", extra, protocol)


def test_a_certificate_rotated_at_the_same_path_replaces_the_pusher(tmp_path, tls_files, names):  # noqa: F811
    """gRPC reads the TLS files into memory once: a reload after new contents at the same paths
    (cert-manager, a renewal) must make a new pusher; the same contents keep it."""
    schema, mapping = names
    d = tmp_path / "tls"
    d.mkdir()
    for name in ("ca.pem", "client.pem", "client.key"):
        shutil.copy(tls_files[name], d / name)
    extra = f"    tls: {{ca_file: {d / 'ca.pem'}, cert_file: {d / 'client.pem'}, key_file: {d / 'client.key'}}}\n"
    out = OtlpOutput()
    try:
        out.configure(_load(tmp_path, "https://127.0.0.1:1", extra, "grpc"), schema, mapping)
        first = out.pusher
        out.configure(_load(tmp_path, "https://127.0.0.1:1", extra, "grpc"), schema, mapping)
        assert out.pusher is first
        shutil.copy(tls_files["intruder.pem"], d / "client.pem")  # a renewed certificate and its key
        shutil.copy(tls_files["intruder.key"], d / "client.key")
        out.configure(_load(tmp_path, "https://127.0.0.1:1", extra, "grpc"), schema, mapping)
        assert out.pusher is not first and first._closing
        second = out.pusher
        shutil.copy(tls_files["rogueca.pem"], d / "ca.pem")  # the receiver's CA rotated
        out.configure(_load(tmp_path, "https://127.0.0.1:1", extra, "grpc"), schema, mapping)
        assert out.pusher is not second
    finally:
        out.close()
        STATS.enabled = False


# --------------------------------------------------------------------------- gRPC

def test_grpc_proxy_url_that_no_proxy_would_bypass_is_refused(tmp_path, monkeypatch):
    """gRPC applies no_grpc_proxy (else no_proxy) even to the configured proxy, with no option to
    turn that off: a proxy_url they would bypass for the endpoint is a config error naming the
    variable and its entry; what gRPC would not bypass loads."""
    pytest.importorskip("grpc", reason="grpcio (the otlp-grpc extra)")
    proxy = "    proxy_url: http://proxy.example:3128\n"
    for env, entry in (({"no_proxy": "localhost, 127.0.0.1"}, "no_proxy lists '127.0.0.1'"),
                       ({"no_proxy": "10.0.0.0/8,127.0.0.0/8"}, "no_proxy lists '127.0.0.0/8'"),
                       ({"no_grpc_proxy": ".0.1", "no_proxy": ""}, "no_grpc_proxy lists '.0.1'")):
        with monkeypatch.context() as m:
            for var, value in env.items():
                m.setenv(var, value)
            with pytest.raises(ConfigError) as exc:
                _load(tmp_path, "http://127.0.0.1:4317", proxy, "grpc")
            assert "config.yml:2: exporters.otlp: proxy_url with protocol grpc: gRPC would not use " \
                   f"the proxy for 127.0.0.1, because the environment's {entry}" in str(exc.value)
    for env in ({"no_proxy": "example.com,10.0.0.0/8"}, {"no_grpc_proxy": "", "no_proxy": "127.0.0.1"}):
        with monkeypatch.context() as m:
            for var, value in env.items():
                m.setenv(var, value)
            _load(tmp_path, "http://127.0.0.1:4317", proxy, "grpc")
            _load(tmp_path, "http://127.0.0.1:4317", "", "grpc")  # no proxy configured: nothing to bypass
            _load(tmp_path, "http://127.0.0.1:4318/v1/metrics", proxy)  # OTLP/HTTP reads no variable


def test_the_no_proxy_rule_is_grpcs_own(tmp_path, names, monkeypatch, grpc_plain_receiver):
    """What the refusal stands on, against gRPC itself: with no_proxy naming the endpoint the
    push goes around the configured proxy; with no_grpc_proxy set (even empty) gRPC reads it
    instead, and the push goes through the proxy (the config that loads)."""
    port, got = grpc_plain_receiver
    extra = "    proxy_url: {}\n"
    with ConnectProxy() as proxy:
        cfg = _load(tmp_path, f"http://127.0.0.1:{port}", extra.format(proxy.url), "grpc").exporters.otlp
        monkeypatch.setenv("no_proxy", "127.0.0.1")  # after the load: what the refusal prevents
        stats = PushStats()
        pusher = _pusher(cfg, names, stats)
        _offer(pusher)
        pusher.close(wait=5)
        assert (stats.success, proxy.targets) == (1, [])  # around the proxy
        monkeypatch.setenv("no_grpc_proxy", "")
        cfg = _load(tmp_path, f"http://127.0.0.1:{port}", extra.format(proxy.url), "grpc").exporters.otlp
        stats = PushStats()
        pusher = _pusher(cfg, names, stats)
        _offer(pusher)
        pusher.close(wait=5)
        assert (stats.success, proxy.targets) == (1, [f"127.0.0.1:{port}"])
    assert len(got) == 2


def _verify_paths(monkeypatch, cafile: str, capath: str) -> None:  # noqa: ANN001
    monkeypatch.setattr(tlsfiles.ssl, "get_default_verify_paths",
                        lambda: Paths(None, None, "SSL_CERT_FILE", cafile, "SSL_CERT_DIR", capath))


def test_grpc_verifies_against_a_system_ca_directory(tmp_path, tls_files, names, monkeypatch, grpc_tls_receiver):  # noqa: F811
    """OpenSSL's system store is a directory only (no bundle file): gRPC gets its certificates
    (the hashed names OpenSSL looks up) as one bundle, not gRPC's own bundled roots.  A file
    under another name is not read; a dangling link is skipped."""
    port, got = grpc_tls_receiver
    certs = tmp_path / "certs"
    certs.mkdir()
    shutil.copy(tls_files["ca.pem"], certs / "0a1b2c3d.0")
    shutil.copy(tls_files["rogueca.pem"], certs / "rogue.pem")
    (certs / "deadbeef.0").symlink_to(tmp_path / "gone.pem")
    _verify_paths(monkeypatch, str(tmp_path / "no-bundle.pem"), str(certs))
    assert tlsfiles.system_roots() == tls_files["ca.pem"].read_bytes().strip() + b"\n"
    stats = PushStats()
    pusher = _pusher(_load(tmp_path, f"https://127.0.0.1:{port}", protocol="grpc").exporters.otlp, names, stats)
    _offer(pusher)
    pusher.close(wait=5)
    assert (stats.success, stats.failure) == (1, 0)
    assert len(got) == 1


def test_no_system_ca_store_fails_closed_for_both_protocols(tmp_path, names, monkeypatch):
    """Without tls.ca_file and with no system store at all, neither protocol falls back to a
    bundle of its own (requests' certifi, gRPC's bundled roots): the push cannot start, says why."""
    pytest.importorskip("grpc", reason="grpcio (the otlp-grpc extra)")
    _verify_paths(monkeypatch, str(tmp_path / "no-bundle.pem"), str(tmp_path / "no-dir"))
    for protocol in ("http/protobuf", "grpc"):
        stats = PushStats()
        pusher = _pusher(_load(tmp_path, "https://127.0.0.1:1/v1/metrics", protocol=protocol).exporters.otlp,
                         names, stats)
        with pytest.raises(OSError, match="no system CA store"):
            make_exporter(pusher.cfg)
        _offer(pusher)
        pusher.close(wait=5)
        assert (stats.success, stats.failure) == (0, 1), protocol


def test_a_pusher_that_cannot_start_retries_at_every_interval(tmp_path, tls_files, names, monkeypatch, caplog,  # noqa: F811
                                                             grpc_tls_receiver):
    """No system CA store, and later an unreadable CA file: the pusher cannot make its exporter.
    It counts a failure at every due push (so the alert keeps firing), logs once, and starts
    when the cause is gone, without a reload."""
    port, got = grpc_tls_receiver
    caplog.set_level(logging.INFO, logger="unified_gpu_exporter")
    empty = tmp_path / "certs"
    empty.mkdir()
    _verify_paths(monkeypatch, str(tmp_path / "no-bundle.pem"), str(empty))
    stats = PushStats()
    pusher = _pusher(_load(tmp_path, f"https://127.0.0.1:{port}", protocol="grpc").exporters.otlp, names, stats)
    try:
        for n in (1, 2, 3):
            _offer(pusher)
            assert (stats.success, stats.failure) == (0, n)
        (record,) = [r for r in caplog.records if r.getMessage().startswith("OTLP push failing")]
        assert record.reason.startswith(f"cannot start: OSError: system CA directory {empty} holds no PEM"), \
            record.reason
        assert pusher._thread.is_alive() and pusher.keeps(pusher.cfg, pusher.mapping, pusher.schema)
        shutil.copy(tls_files["ca.pem"], empty / "0a1b2c3d.0")  # the trust store is fixed on disk
        _offer(pusher)
        assert (stats.success, stats.failure) == (1, 3)
        assert any(r.getMessage() == "OTLP push recovered" for r in caplog.records)
        assert len(got) == 1
    finally:
        pusher.close(wait=5)


def test_a_push_thread_that_died_is_replaced_at_reload(tmp_path, names, monkeypatch):
    """keeps() also needs the thread alive: a reload replaces a pusher whose thread ended."""
    schema, mapping = names
    died: list = []
    monkeypatch.setattr(threading, "excepthook", died.append)

    def broken() -> None:
        raise RuntimeError("a bug after the first push")

    with OtlpReceiver() as receiver:
        out = OtlpOutput(after_warmup=broken)
        try:
            cfg = _load(tmp_path, receiver.url)
            out.configure(cfg, schema, mapping)
            first = out.pusher
            assert first.keeps(cfg.exporters.otlp, mapping, schema)  # not started yet: kept
            out.offer(_Cycle(), ())
            first._thread.join(30)
            wait_until(lambda: died, 10, what="the thread's exception")
            assert not first._thread.is_alive() and not first._closing
            out.configure(_load(tmp_path, receiver.url), schema, mapping)
            assert out.pusher is not first
        finally:
            out.close()
            STATS.enabled = False
