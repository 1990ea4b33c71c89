"""The GPU health definition and the node-problem-detector plugin (``health --node``): exit codes
and messages for a healthy node, each failure class, an exporter that is down or slow; the
definition agrees with the OTLP ``hw.status`` rules and with the alert rules."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from exporter.health import probe
from exporter.health.definition import (
    CLASSES,
    CRITICAL_XIDS,
    DEGRADED,
    FAILED,
    OK,
    TEMPERATURE_LIMITS,
    judge,
    node_state,
)
from exporter.run.argparsing import DEFAULT_PORT
from tests.conftest import REPO
from tests.e2e_util import ProcessSet, free_port, start_exporter

GPU0 = 'vendor="nvidia",gpu="0",uuid="GPU-aaaa"'
GPU1 = 'vendor="nvidia",gpu="1",uuid="GPU-bbbb"'
HEALTHY = f"""# TYPE gpu_info gauge
gpu_info{{{GPU0},model="H100"}} 1
gpu_info{{{GPU1},model="H100"}} 1
# TYPE unified_gpu_exporter_device_up gauge
unified_gpu_exporter_device_up{{{GPU0},source="nvml"}} 1
unified_gpu_exporter_device_up{{{GPU1},source="nvml"}} 1
# TYPE gpu_xid_errors_total counter
gpu_xid_errors_total{{{GPU0},xid="13"}} 4
# TYPE gpu_temperature_celsius gauge
gpu_temperature_celsius{{{GPU0},sensor="gpu"}} 60
gpu_temperature_celsius{{{GPU1},sensor="memory"}} 70
# TYPE gpu_pcie_link_width gauge
gpu_pcie_link_width{{{GPU1}}} 16
# TYPE gpu_pcie_link_max_width gauge
gpu_pcie_link_max_width{{{GPU1}}} 16
"""
# one sick GPU 1 per class: (class, the lines added, the state, words of the message)
FAULTS = [
    ("lost", f'unified_gpu_exporter_device_up{{{GPU1},source="dcgm"}} 0', FAILED, "lost"),
    ("xid", f'gpu_xid_errors_total{{{GPU1},xid="79"}} 1', FAILED, "critical XID 79"),
    ("ecc", f'gpu_ecc_errors_total{{{GPU1},severity="uncorrected"}} 2', FAILED, "uncorrectable ECC"),
    ("remap", f'gpu_memory_remapped_rows{{{GPU1},state="failure"}} 1', FAILED, "row remap failed"),
    ("remap", f'gpu_memory_remapped_rows{{{GPU1},state="pending"}} 1', DEGRADED, "row remap pending"),
    ("link", f"gpu_pcie_link_width{{{GPU1}}} 8", DEGRADED, "PCIe link x8 of x16"),
    ("thermal", f'gpu_temperature_celsius{{{GPU1},sensor="junction"}} 104', DEGRADED, "junction 104 C > 100 C"),
    ("thermal", f'gpu_throttle_active{{{GPU1},reason="hw_thermal"}} 1', DEGRADED, "thermal throttling"),
]


def _samples(text: str):
    return probe.samples(text)


def _with(line: str) -> str:
    name = line.split("{")[0]
    kept = [ln for ln in HEALTHY.splitlines() if not (ln.startswith(name + "{") and GPU1 in ln)]
    return "\n".join(kept) + "\n" + line + "\n"


# ------------------------------------------------------------------------------ the definition

def test_a_healthy_node_is_ok():
    gpus = judge(_samples(HEALTHY))
    assert len(gpus) == 2 and all(g.state == OK for g in gpus.values())  # XID 13 is the application's
    assert node_state(gpus) == (OK, [])


@pytest.mark.parametrize("cls,line,state,words", FAULTS, ids=[f"{f[0]}-{f[2]}" for f in FAULTS])
def test_each_failure_class(cls, line, state, words):
    gpus = judge(_samples(_with(line)))
    sick = gpus[("nvidia", "1", "GPU-bbbb")]
    assert sick.state == state and [p.cls for p in sick.problems] == [cls]
    assert gpus[("nvidia", "0", "GPU-aaaa")].state == OK
    node, messages = node_state(gpus, [cls])
    assert node == state and len(messages) == 1 and words in messages[0]
    others = [c for c in CLASSES if c != cls]
    assert node_state(gpus, others) == (OK, [])  # one condition per class: the others stay clear


def test_definition_agrees_with_otlp_hw_status():
    """Every hw.status rule of mappings/otel.yaml gives the same verdict here (predicted_failure,
    which a scheduler has no word for, is failed: the alert says drain the GPU)."""
    rules = yaml.safe_load((REPO / "mappings" / "otel.yaml").read_text())["status"]
    assert rules
    same = {"failed": FAILED, "degraded": DEGRADED, "predicted_failure": FAILED}
    for rule in rules:
        when = rule["when"]
        value = when.get("equals", when.get("above", 0) + 1)
        labels = ",".join(f'{k}="{v}"' for k, v in {**when.get("labels", {})}.items())
        line = f"{when['metric']}{{{GPU1}{',' + labels if labels else ''}}} {value}"
        gpus = judge(_samples(_with(line)))
        assert gpus[("nvidia", "1", "GPU-bbbb")].state == same[rule["state"]], (rule, line)


def test_definition_agrees_with_the_alert_rules():
    """The critical XID codes and the temperature thresholds are the alerts' own."""
    doc = yaml.safe_load((REPO / "deploy/prometheus/rules/unified-gpu-exporter.health.yml").read_text())
    rules = {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}
    codes = re.search(r'xid=~"([0-9|]+)"', rules["GPUXidCritical"]["expr"]).group(1)
    assert set(codes.split("|")) == CRITICAL_XIDS
    temp = rules["GPUTemperatureHigh"]["expr"].split(")")[0]  # the firing branch, before the hysteresis
    found = dict(re.findall(r'sensor=~?"([a-z|]+)"\}\s*>\s*(\d+)', temp))
    expected = {}
    for sensors, limit in found.items():
        for s in sensors.split("|"):
            expected[s] = float(limit)
    assert expected == TEMPERATURE_LIMITS


# ---------------------------------------------------------------------------------- the plugin

class _Canned(BaseHTTPRequestHandler):
    body = b""
    delay = 0.0

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.delay:  # a stalled exporter: the status line a byte at a time
            for ch in b"HTTP/1.1 200 OK\r\n":
                self.wfile.write(bytes([ch]))
                self.wfile.flush()
                time.sleep(self.delay)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.fixture
def canned():
    servers = []

    def serve(text: str, delay: float = 0.0) -> str:
        handler = type("H", (_Canned,), {"body": text.encode(), "delay": delay})
        srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}/metrics"

    yield serve
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def plugin(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """The plugin as NPD runs it: the console command's module, its exit code and stdout."""
    return subprocess.run([sys.executable, "-m", "exporter", "health", "--node", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def test_plugin_healthy_exits_0(canned):
    r = plugin("--url", canned(HEALTHY))
    assert (r.returncode, r.stdout.strip()) == (0, "ok: 2 GPUs healthy"), r.stderr


@pytest.mark.parametrize("cls,line,state,words", FAULTS, ids=[f"{f[0]}-{f[2]}" for f in FAULTS])
def test_plugin_each_class_exits_1_with_its_reason(canned, cls, line, state, words):
    url = canned(_with(line))
    r = plugin("--url", url, "--check", cls)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stdout.strip() == f"nvidia GPU 1 (GPU-bbbb) {state}: " + r.stdout.split(": ", 1)[1].strip()
    assert words in r.stdout and len(r.stdout.strip()) <= probe.MAX_MESSAGE
    other = next(c for c in CLASSES if c != cls)
    assert plugin("--url", url, "--check", other).returncode == 0


def test_plugin_exporter_down_exits_2():
    port = free_port()  # nothing listens there
    r = plugin("--url", f"http://127.0.0.1:{port}/metrics", "--timeout", "2")
    assert r.returncode == 2 and r.stdout.startswith("unknown: exporter unreachable"), r.stdout


def test_plugin_exporter_that_never_answers_exits_2_at_its_timeout():
    with socket.socket() as s:  # connections complete in the backlog; nothing is ever read or sent
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        r = plugin("--url", f"http://127.0.0.1:{s.getsockname()[1]}/metrics", "--timeout", "1", timeout=30)
    assert r.returncode == 2 and r.stdout.strip() == "unknown: exporter did not answer within 1s", r.stdout


def test_plugin_exporter_that_dribbles_exits_2_at_its_timeout(canned):
    r = plugin("--url", canned(HEALTHY, delay=0.5), "--timeout", "1", timeout=30)
    assert r.returncode == 2 and "did not answer within 1s" in r.stdout, r.stdout


def test_plugin_no_gpu_and_garbage_are_unknown(canned):
    assert plugin("--url", canned("# nothing\n")).returncode == 2
    r = plugin("--url", canned('gpu_info{vendor="nvidia" 1\n'))
    assert r.returncode == 2 and r.stdout.startswith("unknown:"), r.stdout


def test_default_url_is_the_exporters_default_port():
    assert probe.DEFAULT_URL == f"http://127.0.0.1:{DEFAULT_PORT}/metrics"


def test_nfd_feature_file(canned, tmp_path):
    features = tmp_path / "unified-gpu-exporter"
    r = plugin("--url", canned(_with(FAULTS[1][1])), "--nfd-features", str(features))
    assert r.returncode == 1
    lines = features.read_text().splitlines()
    assert re.fullmatch(r"# \+expiry-time=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", lines[0])
    assert lines[1:] == ["gpu-health=failed", "gpu-health-xid=true"]
    assert [p.name for p in tmp_path.iterdir()] == ["unified-gpu-exporter"]  # no temporary file left


# ------------------------------------------------------------------- against the simulated node

@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> Path:
    """The demo scenario with a critical XID (79) on a GPU that stays up in hardware_fault."""
    doc = yaml.safe_load((REPO / "mappings/scenarios/demo.yaml").read_text())
    phase = next(p for p in doc["phases"] if p["name"] == "hardware_fault")
    phase["events"]["nvidia:1"]['gpu_xid_errors_total{xid="79"}'] = 1
    path = tmp_path_factory.mktemp("scenario") / "demo-xid79.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.parametrize("phase,code,words", [
    ("training", 0, ["ok: 5 GPUs healthy"]),
    ("hardware_fault", 1, ["nvidia GPU 1", "failed", "critical XID 79", "uncorrectable ECC", "row remap failed",
                           "amd GPU 0", "PCIe link x8 of x16"]),
    ("gpu_lost", 1, ["nvidia GPU 1", "failed: lost"]),
])
def test_plugin_against_the_simulated_node(tmp_path, scenario, phase, code, words):
    with ProcessSet() as procs:
        server = start_exporter(procs, tmp_path, ["--simulate", str(scenario), "--simulate.phase", phase,
                                                  "--poll.interval", "250ms"])
        r = plugin("--url", server.url + "/metrics")
    assert r.returncode == code, (r.stdout, r.stderr)
    for w in words:
        assert w in r.stdout, (w, r.stdout)


def test_docs_state_the_definition():
    """docs/health.md's table is the definition's: every class, its condition, the XID codes."""
    text = (REPO / "docs" / "health.md").read_text()
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \| `(\w+)`", text, re.M)}
    assert rows == {cls: condition for cls, (condition, _) in CLASSES.items()}
    codes = re.search(r"for XID ([\d, or]+) \(", text).group(1)
    assert set(re.findall(r"\d+", codes)) == CRITICAL_XIDS
    for sensor, limit in TEMPERATURE_LIMITS.items():
        assert f"{sensor}" in text and f"{limit:.0f} C" in text
