"""Alertmanager routing and inhibition for our alerts (deploy/alertmanager/alertmanager.yml)."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request

import pytest
import yaml

from tests.conftest import REPO, require_binary

CONFIG = REPO / "deploy" / "alertmanager" / "alertmanager.yml"
ALERT_RULES = REPO / "deploy" / "prometheus" / "rules" / "unified-gpu-exporter.alerts.yml"
RECEIVER_BASE = "http://alert-receiver.example:9095"

# (labels of an alert as our rules produce it, receivers it must reach)
ROUTES = [
    ({"alertname": "GPUMemoryContention", "category": "memory_contention", "severity": "warning",
      "cloud": "aws", "instance": "n:9632", "gpu": "0"}, ["platform-team"]),
    # one page per node: no gpu or vendor label (rules/unified-gpu-exporter.alerts.yml)
    ({"alertname": "GPUMemoryContentionFraction", "category": "memory_contention", "severity": "critical",
      "cloud": "aws", "instance": "n:9632", "job": "unified-gpu-exporter", "node": "n"}, ["platform-team"]),
    ({"alertname": "GPUArbitrationStallsHigh", "category": "memory_contention", "severity": "warning",
      "cloud": "gcp"}, ["platform-team"]),
    ({"alertname": "GPUBaselineDeviation", "category": "cloud", "severity": "warning", "cloud": "aws"},
     ["cloud-ops-aws"]),
    ({"alertname": "GPUBaselineDeviation", "category": "cloud", "severity": "warning", "cloud": "azure"},
     ["cloud-ops-azure"]),
    ({"alertname": "GPUCrossCloudPerformanceVariance", "category": "cloud", "severity": "warning",
      "cloud": "gcp", "model": "A100", "workload": "trainer"}, ["cloud-ops-gcp"]),
    ({"alertname": "GPUBaselineDeviation", "category": "cloud", "severity": "warning", "cloud": "oci"},
     ["cloud-ops"]),
    ({"alertname": "GPUBaselineDeviation", "category": "cloud", "severity": "warning"}, ["platform-team"]),
    ({"alertname": "GPUBandwidthDropUnderLoad", "category": "workload", "severity": "warning",
      "namespace": "ml", "workload": "trainer", "pod": "trainer-0"}, ["application-team"]),
    ({"alertname": "GPUBandwidthDropUnderLoad", "category": "workload", "severity": "warning",
      "namespace": "ml"}, ["application-team"]),
    ({"alertname": "GPUBandwidthDropUnderLoad", "category": "workload", "severity": "warning",
      "instance": "n:9632"}, ["platform-team"]),
    ({"alertname": "GPUThrottling", "category": "hardware", "severity": "warning", "cloud": "aws"},
     ["platform-team"]),
    ({"alertname": "GPUXidErrors", "category": "hardware", "severity": "critical", "xid": "79"},
     ["platform-team"]),
    ({"alertname": "GPUExporterSourceDown", "category": "exporter", "severity": "warning",
      "source": "nvml"}, ["platform-team"]),
    # hardware health (rules/unified-gpu-exporter.health.yml) and the fleet (deploy/fleet/rules)
    ({"alertname": "GPUDeviceLost", "category": "hardware", "severity": "critical", "cloud": "azure",
      "cluster": "c1", "instance": "n:9632", "gpu": "0"}, ["platform-team"]),
    ({"alertname": "GPUPcieLinkDegraded", "category": "hardware", "severity": "warning",
      "degraded": "width"}, ["platform-team"]),
    ({"alertname": "GPUClusterNotReporting", "category": "exporter", "severity": "critical",
      "cluster": "c1", "cloud": "gcp"}, ["platform-team"]),
    # absence (rules/unified-gpu-exporter.absence.yml) and the fleet's collection path
    ({"alertname": "GPUExporterDown", "category": "exporter", "severity": "critical", "cluster": "c1",
      "instance": "n:9632", "node": "n"}, ["platform-team"]),
    ({"alertname": "GPUFleetRuleEvaluationFailing", "category": "exporter", "severity": "critical",
      "instance": "vmalert-0:8880"}, ["platform-team"]),
    ({"alertname": "Watchdog", "category": "watchdog", "severity": "none"}, ["deadmans-switch"]),
]


def _amtool(*args: str) -> subprocess.CompletedProcess:
    binary = require_binary("amtool", "prometheus-alertmanager")
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)


def test_amtool_check_config_passes():
    result = _amtool("check-config", str(CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    assert "2 inhibit rules" in result.stdout


@pytest.mark.parametrize("labels,receivers", ROUTES, ids=lambda v: ",".join(v) if isinstance(v, list) else None)
def test_amtool_routes_alert_to_the_expected_receiver(labels, receivers):
    args = [f"{k}={v}" for k, v in labels.items()]
    result = _amtool("config", "routes", "test", f"--config.file={CONFIG}",
                     f"--verify.receivers={','.join(receivers)}", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ",".join(receivers)


def test_amtool_route_verification_can_fail():
    result = _amtool("config", "routes", "test", f"--config.file={CONFIG}",
                     "--verify.receivers=platform-team", "category=cloud", "cloud=gcp")
    assert result.returncode != 0
    assert "cloud-ops-gcp" in result.stdout


def test_every_category_our_alerts_use_has_a_route():
    files = [*(REPO / "deploy" / "prometheus" / "rules").glob("*.yml"), *(REPO / "deploy" / "fleet" / "rules").glob("*.yml")]
    rules = [r for path in files for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]
    categories = {r["labels"]["category"] for r in rules if "alert" in r}
    routed = {labels["category"] for labels, _ in ROUTES}
    assert categories == routed


def test_inhibition_mutes_only_the_down_sources_vendor_on_its_instance():
    per_gpu, per_node = yaml.safe_load(CONFIG.read_text())["inhibit_rules"]
    assert per_gpu["source_matchers"] == ['alertname="GPUExporterSourceDown"', 'vendor=~".+"']
    assert per_gpu["target_matchers"] == ['gpu=~".+"']
    assert per_gpu["equal"] == ["instance", "vendor"]
    # the node's contention page has no vendor or gpu label: muted on the instance
    assert per_node["source_matchers"] == per_gpu["source_matchers"]
    assert per_node["target_matchers"] == ['alertname="GPUMemoryContentionFraction"']
    assert per_node["equal"] == ["instance"]


def test_every_webhook_shares_the_replaceable_base_url():
    doc = yaml.safe_load(CONFIG.read_text())
    for receiver in doc["receivers"]:
        hook, = receiver["webhook_configs"]
        assert hook["url"] == f"{RECEIVER_BASE}/{receiver['name']}"


# ------------------------------------------------------------------------------- real Alertmanager

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(url: str, body: object | None = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        text = response.read()
    return json.loads(text) if text else None


@pytest.fixture
def alertmanager(tmp_path):
    binary = require_binary("prometheus-alertmanager", "prometheus-alertmanager")
    config = tmp_path / "alertmanager.yml"
    # nothing listens on port 9 (discard): notifications fail quietly, routing/inhibition still run
    config.write_text(CONFIG.read_text().replace(RECEIVER_BASE, "http://127.0.0.1:9"))
    port = _free_port()
    proc = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 15
    while True:
        try:
            urllib.request.urlopen(f"{base}/-/ready", timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"alertmanager did not start: {proc.stderr.read().decode()[-2000:]}")
            time.sleep(0.1)
    yield base
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_real_alertmanager_inhibits_gpu_alerts_of_the_instance_whose_source_is_down(alertmanager):
    def alert(**labels):
        return {"labels": labels, "annotations": {"summary": "test."}}

    _http(f"{alertmanager}/api/v2/alerts", [
        alert(alertname="GPUExporterSourceDown", category="exporter", severity="warning",
              instance="node-a:9632", source="nvml", vendor="nvidia"),
        alert(alertname="GPUMemoryContention", category="memory_contention", severity="warning",
              instance="node-a:9632", vendor="nvidia", gpu="0", uuid="GPU-a0"),
        alert(alertname="GPUMemoryContention", category="memory_contention", severity="warning",
              instance="node-b:9632", vendor="nvidia", gpu="0", uuid="GPU-b0"),
        alert(alertname="GPUBaselineDeviation", category="cloud", severity="warning", cloud="gcp",
              instance="node-a:9632", vendor="nvidia", gpu="1", uuid="GPU-a1", model="A100"),
        # the node's contention page (one per node, no vendor or gpu label)
        alert(alertname="GPUMemoryContentionFraction", category="memory_contention", severity="critical",
              instance="node-a:9632", node="node-a"),
        alert(alertname="GPUMemoryContentionFraction", category="memory_contention", severity="critical",
              instance="node-b:9632", node="node-b"),
    ])
    deadline = time.monotonic() + 10
    while True:
        alerts = _http(f"{alertmanager}/api/v2/alerts")
        state = {(a["labels"]["alertname"], a["labels"]["instance"]): a for a in alerts}
        if len(state) == 6 and all(state[(name, "node-a:9632")]["status"]["inhibitedBy"] for name in
                                   ("GPUMemoryContention", "GPUMemoryContentionFraction")):
            break
        assert time.monotonic() < deadline, json.dumps(alerts, indent=1)
        time.sleep(0.2)
    assert state[("GPUMemoryContention", "node-a:9632")]["status"]["state"] == "suppressed"
    assert state[("GPUBaselineDeviation", "node-a:9632")]["status"]["state"] == "suppressed"
    assert state[("GPUMemoryContentionFraction", "node-a:9632")]["status"]["state"] == "suppressed"
    assert state[("GPUMemoryContentionFraction", "node-b:9632")]["status"]["state"] == "active"
    assert state[("GPUMemoryContention", "node-b:9632")]["status"]["state"] == "active"
    assert state[("GPUExporterSourceDown", "node-a:9632")]["status"]["state"] == "active"
    receivers = {k: [r["name"] for r in a["receivers"]] for k, a in state.items()}
    assert receivers[("GPUMemoryContention", "node-b:9632")] == ["platform-team"]
    assert receivers[("GPUBaselineDeviation", "node-a:9632")] == ["cloud-ops-gcp"]


def test_real_alertmanager_a_down_source_never_mutes_another_vendors_gpus(alertmanager):
    """amdsmi down on a mixed node mutes its AMD GPUs only; the NVIDIA GPU's alert is delivered to
    its receiver; a vendor-less SourceDown (an upstream scrape that never listed a GPU) mutes
    nothing."""
    def alert(**labels):
        return {"labels": labels, "annotations": {"summary": "test."}}

    _http(f"{alertmanager}/api/v2/alerts", [
        alert(alertname="GPUExporterSourceDown", category="exporter", severity="warning",
              instance="node-m:9632", source="amdsmi", vendor="amd"),
        alert(alertname="GPUExporterSourceDown", category="exporter", severity="warning",
              instance="node-m:9632", source="upstream"),
        alert(alertname="GPUMemoryContention", category="memory_contention", severity="warning",
              instance="node-m:9632", vendor="nvidia", gpu="0", uuid="GPU-m0"),
        alert(alertname="GPUMemoryContention", category="memory_contention", severity="warning",
              instance="node-m:9632", vendor="amd", gpu="0", uuid="amd-m0"),
        # a node whose only down source is vendor-less keeps its contention page
        alert(alertname="GPUExporterSourceDown", category="exporter", severity="warning",
              instance="node-u:9632", source="upstream"),
        alert(alertname="GPUMemoryContentionFraction", category="memory_contention", severity="critical",
              instance="node-u:9632", node="node-u"),
    ])
    deadline = time.monotonic() + 10
    while True:
        alerts = _http(f"{alertmanager}/api/v2/alerts")
        state = {(a["labels"]["alertname"], a["labels"].get("vendor", a["labels"].get("source")),
                  a["labels"]["instance"]): a for a in alerts}
        state = {k[:2] if k[2] == "node-m:9632" else k: a for k, a in state.items()}
        if len(state) == 6 and state[("GPUMemoryContention", "amd")]["status"]["inhibitedBy"]:
            break
        assert time.monotonic() < deadline, json.dumps(alerts, indent=1)
        time.sleep(0.2)
    assert state[("GPUMemoryContention", "amd")]["status"]["state"] == "suppressed"
    assert state[("GPUMemoryContention", "nvidia")]["status"]["state"] == "active"
    assert state[("GPUMemoryContention", "nvidia")]["status"]["inhibitedBy"] == []
    assert [r["name"] for r in state[("GPUMemoryContention", "nvidia")]["receivers"]] == ["platform-team"]
    fraction = state[("GPUMemoryContentionFraction", None, "node-u:9632")]
    assert fraction["status"]["state"] == "active" and fraction["status"]["inhibitedBy"] == []
