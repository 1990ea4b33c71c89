"""What the start path loads and when the server opens (issue 17's start-up budget).

Not timed: these check *what* runs (which modules a default start imports, that start() ends on
the last first poll rather than on a timer, that both YAML parsers read the shipped files alike);
the seconds are measured by ``make bench`` (``bench/node_exporter_peer.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from exporter import yamlfile
from exporter.map.schema import default_mappings_dir
from exporter.run import daemon as daemon_mod
from exporter.run.daemon import Daemon, Settings
from exporter.sources import registry
from tests import fault_sources
from tests.conftest import ci_strict

REPO = Path(__file__).resolve().parent.parent

# loaded only when configured: basic auth / TLS (web config), profiler importers, the upstream
# source and its Prometheus text parsers (prometheus_client as a whole), pod attribution, the profiles
# drop directory
NOT_ON_DEFAULT_PATH = ("bcrypt", "exporter.serve.webconfig", "exporter.importers", "exporter.sources.upstream",
                       "exporter.sources.upstream_fetch", "prometheus_client.parser",
                       "prometheus_client", "exporter.enrich.kubernetes", "exporter.importers.profiles_source",
                       "opentelemetry", "google.protobuf", "grpc", "requests", "exporter.otlp.pusher")
# the OTLP push (exporters.otlp): the OpenTelemetry SDK and exporters, protobuf, gRPC, requests and
# the push's own modules other than its config section, hook and self-metrics
OTLP_MODULES = ("opentelemetry", "google.protobuf", "grpc", "requests", "urllib3", "exporter.otlp.naming",
                "exporter.otlp.convert", "exporter.otlp.pusher", "exporter.otlp.sdk", "exporter.otlp.encode",
                "exporter.otlp.transport", "exporter.otlp.resource")


# aiohttp's client side: loaded on the first use of the package's client names (the cloud probe)
AIOHTTP_CLIENT = ("aiohttp.client_proto", "aiohttp.client_middlewares", "aiohttp.connector", "aiohttp.client_reqrep", "aiohttp.client_ws",
                  "aiohttp.cookiejar", "aiohappyeyeballs")


def _loaded(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if m.startswith(prefixes))


def _run_py(code: str, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         timeout=120, cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


CHECK_CONFIG = """
import json, sys
from exporter import cli
rc = cli.main(["--check-config", "--path.sysfs", sys.argv[1], "--path.procfs", sys.argv[1]])
print(json.dumps({"rc": rc, "modules": sorted(sys.modules)}))
"""


def test_check_config_loads_no_http_client_server_or_optional_code(tmp_path):
    res = _run_py(CHECK_CONFIG, str(tmp_path))
    assert res["rc"] == 0
    assert _loaded(res["modules"], NOT_ON_DEFAULT_PATH + ("aiohttp",)) == []
    # the positive side: the check did load and validate config, schema and mappings
    assert "exporter.map.mapping" in res["modules"] and "pydantic" in res["modules"]


# serves for real (aiohttp, listeners, sources on an empty sysfs), answers one scrape, then lists
# what the process imported; SIGTERM ends _serve as in production
SERVE = """
import asyncio, json, os, signal, sys
from exporter import cli

port, root = int(sys.argv[1]), sys.argv[2]
argv = ["--web.listen-address", f"127.0.0.1:{port}", "--path.sysfs", root, "--path.procfs", root,
        "--log.level", "error", *sys.argv[3:]]
args = cli.build_parser().parse_args(argv)
daemon = cli.Daemon(cli.settings_from(args))
daemon.load()
status = []

async def scrape():
    for _ in range(600):
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            break
        except OSError:
            await asyncio.sleep(0.05)
    writer.write(b"GET /metrics HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n")
    status.append((await reader.readline()).decode().split()[1])
    writer.close()
    os.kill(os.getpid(), signal.SIGTERM)

async def main():
    task = asyncio.ensure_future(scrape())
    await cli._serve(args, daemon)
    await task

asyncio.run(main())
print(json.dumps({"status": status, "modules": sorted(sys.modules)}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_default_serve_path_leaves_optional_code_unloaded(tmp_path):
    """A default start (no web config, no upstream targets, no profiles, no importers) never loads
    bcrypt, the web-config models, the importers, the Prometheus text parsers or aiohttp's client
    (``import aiohttp.web`` would run aiohttp/__init__, which imports it: issue 35)."""
    res = _run_py(SERVE, str(_free_port()), str(tmp_path))
    assert res["status"] and res["status"][0] in ("200", "503")
    assert _loaded(res["modules"], NOT_ON_DEFAULT_PATH + AIOHTTP_CLIENT) == []
    assert "aiohttp.client" not in res["modules"]
    assert "aiohttp.web" in res["modules"]


def test_configured_basic_auth_does_load_the_web_config_code(tmp_path):
    """The other side of the test above: the same check sees bcrypt once basic auth is on."""
    import bcrypt

    web = tmp_path / "web.yml"
    hashed = bcrypt.hashpw(b"secret", bcrypt.gensalt(4)).decode()
    web.write_text(f"basic_auth_users:\n  alice: {hashed}\n")
    res = _run_py(SERVE, str(_free_port()), str(tmp_path), "--web.config.file", str(web))
    assert res["status"] == ["401"]  # the scrape carried no credentials
    assert {"bcrypt", "exporter.serve.webconfig"} <= set(res["modules"])


ONCE = """
import json, sys
from exporter import cli
rc = cli.main(["--once", "--simulate", "--config.file", sys.argv[1], "--log.level", "error"])
print()
print(json.dumps({"rc": rc, "modules": sorted(sys.modules)}))
"""


@pytest.mark.parametrize("enabled", [False, True])
def test_the_otlp_push_loads_opentelemetry_only_when_enabled(tmp_path, enabled):
    """A --once run renders, offers the cycle to the push and exits: with the push off nothing of
    OpenTelemetry, protobuf, gRPC or requests is imported; the other side shows the check sees
    them once it is on (the push to a closed port fails; --once still ends)."""
    if enabled:
        pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otlp extra (make install)")
    conf = tmp_path / "config.yml"
    conf.write_text(f"exporters:\n  otlp:\n    enabled: {str(enabled).lower()}\n"
                    f"    endpoint: http://127.0.0.1:{_free_port()}/v1/metrics\n    timeout: 1s\n"
                    "enrich: {cloud: {enabled: false}}\n")
    res = _run_py(ONCE, str(conf))
    assert res["rc"] == 0
    loaded = _loaded(res["modules"], OTLP_MODULES)
    if enabled:
        assert {"opentelemetry.sdk", "google.protobuf", "requests", "exporter.otlp.pusher",
                "exporter.otlp.transport"} <= set(loaded)
    else:
        assert loaded == []
        assert "exporter.otlp.hook" in res["modules"]  # the push's hook ran, and imported nothing


# ---------------------------------------------------------------- start(): no fixed sleeps

TEST_MAPPING = """vendor: nvidia
fields:
  - {raw: util, metric: gpu_compute_utilization_percent}
"""


@pytest.fixture
def mappings_dir(tmp_path):
    d = tmp_path / "mappings"
    d.mkdir()
    shutil.copy(default_mappings_dir() / "canonical.yaml", d)
    (d / "testsrc.yaml").write_text(TEST_MAPPING)
    return d


@pytest.fixture
def fault_collectors(monkeypatch):
    for name, cls in [("good", "GoodSource"), ("hanging", "HangingSource")]:
        monkeypatch.setitem(registry.COLLECTORS, name,
                            registry.Collector(name, "tests.fault_sources", cls, False, name))
    fault_sources.RELEASE.clear()
    yield
    fault_sources.RELEASE.set()


def _settings(mappings_dir: Path, tmp_path: Path, on: list[str], config: str = "") -> Settings:
    collectors = {n: False for n in registry.COLLECTORS}
    collectors.update({n: True for n in on})
    cfg = tmp_path / "config.yaml"
    cfg.write_text(config or "{}\n")
    return Settings(config_path=cfg, mappings_dir=mappings_dir, poll_interval=1.0,
                    collectors=collectors, sysfs=tmp_path, procfs=tmp_path)


async def test_start_returns_with_the_last_first_poll_not_a_timer(mappings_dir, tmp_path, fault_collectors,
                                                                  monkeypatch):
    # a start that waited for its timer would sit here for an hour; the first poll ends it
    monkeypatch.setattr(daemon_mod, "STARTUP_WAIT", 3600.0)
    d = Daemon(_settings(mappings_dir, tmp_path, ["good"]))
    try:
        await asyncio.wait_for(d.start(), 60)
        assert d.rendered is not None and b"gpu_compute_utilization_percent{" in d.rendered.text
        assert d.ready
    finally:
        await d.stop()


async def test_a_hung_first_poll_holds_the_start_only_for_startup_wait(mappings_dir, tmp_path,
                                                                      fault_collectors, monkeypatch):
    monkeypatch.setattr(daemon_mod, "STARTUP_WAIT", 0.2)
    conf = "collectors:\n  hanging: {timeout: 1h}\n"  # its poll neither ends nor times out
    d = Daemon(_settings(mappings_dir, tmp_path, ["good", "hanging"], conf))
    try:
        await asyncio.wait_for(d.start(), 60)
        assert "hanging" not in d._polled
        assert b"gpu_compute_utilization_percent{" in d.rendered.text  # the good source is served
    finally:
        fault_sources.RELEASE.set()
        await d.stop()


# ---------------------------------------------------------------- YAML: the C parser

def _shipped_yaml() -> list[Path]:
    return sorted(p for p in default_mappings_dir().rglob("*.yaml"))


def test_libyaml_parser_is_used_where_pyyaml_has_it():
    if not yaml.__with_libyaml__:
        if ci_strict():
            pytest.fail("PyYAML without libyaml: config and mapping loads take ~10x longer")
        pytest.skip("PyYAML built without libyaml (the pure-Python parser is used)")
    assert yamlfile._SafeLoader is yaml.CSafeLoader


@pytest.mark.parametrize("path", _shipped_yaml(), ids=lambda p: p.relative_to(default_mappings_dir()).as_posix())
def test_both_parsers_give_the_same_data_and_lines(path, monkeypatch):
    """The C parser and the pure-Python one read every shipped file to the same values and the
    same field -> line map (errors name the same lines whichever is installed)."""
    fast = yamlfile.load_yaml(path)
    monkeypatch.setattr(yamlfile, "_SafeLoader", yaml.SafeLoader)
    slow = yamlfile.load_yaml(path)
    assert fast == slow


@pytest.mark.parametrize("text", ["a: 1\nb: [1, 2\n", "a: 1\na: 2\n", "a:\n  - &x {b: 1}\n  - *y\n"])
def test_both_parsers_refuse_alike_naming_the_line(tmp_path, text, monkeypatch):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(yamlfile.ConfigError) as fast:
        yamlfile.load_yaml(p)
    monkeypatch.setattr(yamlfile, "_SafeLoader", yaml.SafeLoader)
    with pytest.raises(yamlfile.ConfigError) as slow:
        yamlfile.load_yaml(p)
    assert str(fast.value).split(":")[:2] == str(slow.value).split(":")[:2]  # file and line
    assert str(fast.value).startswith(f"{p}:")


AIOHTTP_IMPORT = """
import json, ssl, sys
real = ssl.create_default_context
from exporter.serve.aiohttp_import import import_aiohttp_web
import_aiohttp_web()
from aiohttp import connector
print(json.dumps({
    "restored": ssl.create_default_context is real
                and "set_default_verify_paths" not in ssl.SSLContext.__dict__,
    "aiohttp_cas": [connector._SSL_CONTEXT_VERIFIED.cert_store_stats()["x509_ca"],
                    connector._SSL_CONTEXT_UNVERIFIED.cert_store_stats()["x509_ca"]],
    "aiohttp_verifies": connector._SSL_CONTEXT_VERIFIED.verify_mode == ssl.CERT_REQUIRED,
    "fresh_cas": ssl.create_default_context().cert_store_stats()["x509_ca"],
}))
"""


def test_serving_import_skips_aiohttps_client_ca_loading_and_restores_ssl():
    """aiohttp's default client contexts trust nothing (fail closed; this program's HTTPS clients
    bring their own contexts), and ``ssl`` is the real module again afterwards."""
    res = _run_py(AIOHTTP_IMPORT)
    assert res["restored"]
    assert res["aiohttp_cas"] == [0, 0]
    assert res["aiohttp_verifies"]
    if ssl_default_cas() == 0:
        pytest.skip("this system's default CA store is empty: nothing to compare with")
    assert res["fresh_cas"] > 0  # contexts made after the import load the system store again


def ssl_default_cas() -> int:
    import ssl

    return ssl.create_default_context().cert_store_stats()["x509_ca"]


DEFERRED_CLIENT = """
import json, sys
from exporter.serve.aiohttp_import import import_aiohttp_web
import_aiohttp_web()
before = sorted(m for m in sys.modules if m.startswith(("aiohttp.client.", "aiohttp.connector")) or m == "aiohttp.client")
from aiohttp import web
import aiohttp
session = aiohttp.ClientSession  # the first client name: aiohttp/__init__ runs now, whole
from aiohttp import ClientTimeout, connector
from aiohttp import client
print(json.dumps({
    "before": before, "web": web.Application.__module__,
    "same": session is client.ClientSession and ClientTimeout is client.ClientTimeout,
    "all": sorted(set(aiohttp.__all__) - set(dir(aiohttp))),
    "version": aiohttp.__version__, "server": __import__("aiohttp.http").http.SERVER_SOFTWARE,
    "aiohttp_cas": connector._SSL_CONTEXT_VERIFIED.cert_store_stats()["x509_ca"],
    "lazy_workers": aiohttp.__getattr__.__module__,
}))
"""


def test_the_aiohttp_client_loads_whole_on_first_use_without_the_ca_store():
    """The serving import leaves the client out; the first client name runs aiohttp's own
    ``__init__`` into the package (every name of its ``__all__`` there, its own ``__getattr__``
    in place), with the default client contexts still trusting nothing."""
    import aiohttp

    res = _run_py(DEFERRED_CLIENT)
    assert res["before"] == []
    assert res["web"] == "aiohttp.web_app"
    assert res["same"] and res["all"] == []
    assert res["version"] == aiohttp.__version__ and aiohttp.__version__ in res["server"]
    assert res["aiohttp_cas"] == 0
    assert res["lazy_workers"] == "aiohttp"


def test_the_ca_skip_holds_only_in_the_importing_thread():
    """While the client loads (possibly long after the start, from the event loop), another thread
    making a context of its own (an upstream target's, the Kubernetes API's) gets the CA store."""
    import ssl
    import threading

    from exporter.serve.aiohttp_import import _without_client_cas

    seen: dict[str, int] = {}

    def other() -> None:
        seen["other"] = ssl.create_default_context().cert_store_stats()["x509_ca"]
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.set_default_verify_paths()
        seen["other_paths"] = ctx.cert_store_stats()["x509_ca"]

    def load() -> None:
        seen["here"] = ssl.create_default_context().cert_store_stats()["x509_ca"]
        t = threading.Thread(target=other)
        t.start()
        t.join()

    _without_client_cas(load)
    assert seen["here"] == 0
    assert "set_default_verify_paths" not in ssl.SSLContext.__dict__
    if ssl_default_cas() == 0:
        pytest.skip("this system's default CA store is empty: nothing to compare with")
    assert seen["other"] > 0 and seen["other_paths"] > 0


CLIENT_RACE = """
import json, sys, threading
from exporter.serve import aiohttp_import
aiohttp_import.import_aiohttp_web()
import aiohttp
started = threading.Event()
real = aiohttp_import._without_client_cas
def slow(load):  # the first thread is inside aiohttp's __init__ when the second one asks
    def wrapped():
        started.set()
        threading.Event().wait(0.3)
        load()
    real(wrapped)
aiohttp_import._without_client_cas = slow
out = {}
def first():
    out["first"] = aiohttp.ClientSession.__name__
def second():
    started.wait(10)
    try:
        out["second"] = aiohttp.ClientTimeout.__name__
    except Exception as exc:
        out["second"] = type(exc).__name__
a, b = threading.Thread(target=first), threading.Thread(target=second)
a.start(); b.start(); a.join(); b.join()
print(json.dumps(out))
"""


def test_a_second_thread_asking_for_a_client_name_waits_for_the_whole_package():
    """While one thread runs aiohttp's ``__init__`` (the client's first use), another asking for a
    client name waits for it instead of finding the name missing (AttributeError before)."""
    assert _run_py(CLIENT_RACE) == {"first": "ClientSession", "second": "ClientTimeout"}
