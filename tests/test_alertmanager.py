"""Alertmanager routing and inhibition for our alerts (deploy/alertmanager/route.yml, the part to
merge, and alertmanager.yml, the whole configuration generated from it): severity decides pages
(critical -> <team>-pager) and tickets, category the team; one notification per incident per GPU
(issue 39)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

from tests.conftest import REPO, require_binary

CONFIG = REPO / "deploy" / "alertmanager" / "alertmanager.yml"
SNIPPET = REPO / "deploy" / "alertmanager" / "route.yml"
ALERT_RULES = REPO / "deploy" / "prometheus" / "rules" / "unified-gpu-exporter.alerts.yml"
RECEIVER_BASE = "http://alert-receiver.example:9095"

# (labels of an alert as our rules produce it, receivers it must reach)
ROUTES = [
    ({"alertname": "GPUMemoryContention", "category": "memory_contention", "severity": "warning",
      "cloud": "aws", "instance": "n:9632", "gpu": "0"}, ["platform-team"]),
    # one page per node: no gpu or vendor label (rules/unified-gpu-exporter.alerts.yml)
    ({"alertname": "GPUMemoryContentionFraction", "category": "memory_contention", "severity": "critical",
      "cloud": "aws", "instance": "n:9632", "job": "unified-gpu-exporter", "node": "n"}, ["platform-team-pager"]),
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
    ({"alertname": "GPUXidCritical", "category": "hardware", "severity": "critical", "xid": "79"},
     ["platform-team-pager"]),
    ({"alertname": "GPUXidErrors", "category": "hardware", "severity": "warning", "xid": "13"},
     ["platform-team"]),
    # exists only to inhibit (rules/unified-gpu-exporter.health.yml): never sent
    ({"alertname": "GPUUnreadable", "category": "inhibitor", "severity": "none", "gpu": "0"}, ["blackhole"]),
    ({"alertname": "GPUMIGInstanceNotEvaluable", "category": "exporter", "severity": "info"}, ["platform-team"]),
    ({"alertname": "GPUExporterSourceDown", "category": "exporter", "severity": "warning",
      "source": "nvml"}, ["platform-team"]),
    # hardware health (rules/unified-gpu-exporter.health.yml) and the fleet (deploy/fleet/rules)
    ({"alertname": "GPUDeviceLost", "category": "hardware", "severity": "critical", "cloud": "azure",
      "cluster": "c1", "instance": "n:9632", "gpu": "0"}, ["platform-team-pager"]),
    ({"alertname": "GPUPcieLinkDegraded", "category": "hardware", "severity": "warning",
      "degraded": "width"}, ["platform-team"]),
    ({"alertname": "GPUClusterNotReporting", "category": "exporter", "severity": "critical",
      "cluster": "c1", "cloud": "gcp"}, ["platform-team-pager"]),
    # absence (rules/unified-gpu-exporter.absence.yml) and the fleet's collection path
    ({"alertname": "GPUExporterDown", "category": "exporter", "severity": "critical", "cluster": "c1",
      "instance": "n:9632", "node": "n"}, ["platform-team-pager"]),
    ({"alertname": "GPUFleetRuleEvaluationFailing", "category": "exporter", "severity": "critical",
      "instance": "vmalert-0:8880"}, ["platform-team-pager"]),
    ({"alertname": "Watchdog", "category": "watchdog", "severity": "none"}, ["deadmans-switch"]),
]


def _amtool(*args: str) -> subprocess.CompletedProcess:
    binary = require_binary("amtool", "prometheus-alertmanager")
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)


def test_amtool_check_config_passes():
    result = _amtool("check-config", str(CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    assert "6 inhibit rules" in result.stdout


def test_the_whole_configuration_is_generated_from_the_snippet_to_merge():
    gen = subprocess.run([sys.executable, str(REPO / "scripts" / "gen-alertmanager.py"), "--check"],
                         capture_output=True, text=True, timeout=60)
    assert gen.returncode == 0, gen.stderr
    snippet, whole = yaml.safe_load(SNIPPET.read_text()), yaml.safe_load(CONFIG.read_text())
    assert snippet["route"] in whole["route"]["routes"]
    assert snippet["inhibit_rules"] == whole["inhibit_rules"]
    assert set(snippet["receivers"]) <= {r["name"] for r in whole["receivers"]}
    # the snippet is one route a root route can take: it matches our alerts only
    assert snippet["route"]["matchers"] == ['alertname=~"GPU.+"'] and not snippet["route"].get("continue")


@pytest.mark.parametrize("labels,receivers", ROUTES, ids=lambda v: ",".join(v) if isinstance(v, list) else None)
def test_amtool_routes_alert_to_the_expected_receiver(labels, receivers):
    args = [f"{k}={v}" for k, v in labels.items()]
    result = _amtool("config", "routes", "test", f"--config.file={CONFIG}",
                     f"--verify.receivers={','.join(receivers)}", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ",".join(receivers)


def test_amtool_route_verification_can_fail():
    result = _amtool("config", "routes", "test", f"--config.file={CONFIG}",
                     "--verify.receivers=platform-team", "alertname=GPUBaselineDeviation", "category=cloud", "cloud=gcp")
    assert result.returncode != 0
    assert "cloud-ops-gcp" in result.stdout


def test_every_category_our_alerts_use_has_a_route():
    files = [*(REPO / "deploy" / "prometheus" / "rules").glob("*.yml"), *(REPO / "deploy" / "fleet" / "rules").glob("*.yml")]
    rules = [r for path in files for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]
    categories = {r["labels"]["category"] for r in rules if "alert" in r}
    routed = {labels["category"] for labels, _ in ROUTES}
    assert categories == routed


def test_every_category_routes_critical_to_a_pager_and_the_rest_to_tickets():
    """Every (category, severity) our rules use reaches a receiver named for pages exactly when the
    severity is critical (amtool's view of the whole configuration)."""
    files = [*(REPO / "deploy" / "prometheus" / "rules").glob("*.yml"), *(REPO / "deploy" / "fleet" / "rules").glob("*.yml")]
    pairs = {(r["alert"], r["labels"]["category"], r["labels"]["severity"]) for path in files
             for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"] if "alert" in r}
    for name, category, severity in sorted(pairs):
        if name == "Watchdog":
            continue
        result = _amtool("config", "routes", "test", f"--config.file={CONFIG}", f"alertname={name}",
                         f"category={category}", f"severity={severity}", "instance=n:9632")
        got = result.stdout.strip()
        assert got.endswith("-pager") == (severity == "critical"), (name, severity, got)


def test_every_webhook_shares_the_replaceable_base_url():
    doc = yaml.safe_load(CONFIG.read_text())
    for receiver in doc["receivers"]:
        if receiver["name"] == "blackhole":
            assert "webhook_configs" not in receiver
            continue
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


def _alert(**labels):
    return {"labels": labels, "annotations": {"summary": "test."}}


def _states(alertmanager: str, expected: int, settled) -> dict:
    deadline = time.monotonic() + 10
    while True:
        alerts = _http(f"{alertmanager}/api/v2/alerts")
        state = {(a["labels"]["alertname"], a["labels"]["instance"], a["labels"].get("gpu")): a for a in alerts}
        if len(state) == expected and settled(state):
            return state
        assert time.monotonic() < deadline, json.dumps(alerts, indent=1)
        time.sleep(0.2)


def test_real_alertmanager_a_down_source_mutes_exactly_its_gpus_and_their_node_page(alertmanager):
    """amdsmi down on a mixed node: GPUUnreadable (one per GPU it cannot read) mutes that AMD GPU's
    held alerts and the node's contention page; the NVIDIA GPU on the same node keeps alerting;
    GPUExporterSourceDown itself is delivered (one per source and node); another node is
    untouched."""
    gpu = {"instance": "node-m:9632", "cluster": "c1"}
    _http(f"{alertmanager}/api/v2/alerts", [
        _alert(alertname="GPUExporterSourceDown", category="exporter", severity="warning", source="amdsmi", **gpu),
        _alert(alertname="GPUUnreadable", category="inhibitor", severity="none", vendor="amd", gpu="0",
               uuid="amd-m0", **gpu),
        _alert(alertname="GPUTemperatureHigh", category="hardware", severity="warning", vendor="amd", gpu="0",
               uuid="amd-m0", sensor="junction", **gpu),
        _alert(alertname="GPUTemperatureHigh", category="hardware", severity="warning", vendor="nvidia", gpu="1",
               uuid="GPU-m1", sensor="gpu", **gpu),
        _alert(alertname="GPUMemoryContentionFraction", category="memory_contention", severity="critical",
               node="node-m", **gpu),
        _alert(alertname="GPUMemoryContentionFraction", category="memory_contention", severity="critical",
               instance="node-b:9632", cluster="c1", node="node-b"),
    ])
    state = _states(alertmanager, 6, lambda st: st[("GPUTemperatureHigh", "node-m:9632", "0")]["status"]["inhibitedBy"]
                    or False)
    by = {(k[0], v["labels"].get("vendor"), k[1]): v for k, v in state.items()}
    assert by[("GPUTemperatureHigh", "amd", "node-m:9632")]["status"]["state"] == "suppressed"
    assert by[("GPUTemperatureHigh", "nvidia", "node-m:9632")]["status"]["state"] == "active"
    assert by[("GPUMemoryContentionFraction", None, "node-m:9632")]["status"]["state"] == "suppressed"
    assert by[("GPUMemoryContentionFraction", None, "node-b:9632")]["status"]["state"] == "active"
    down = by[("GPUExporterSourceDown", None, "node-m:9632")]
    assert down["status"]["state"] == "active" and [r["name"] for r in down["receivers"]] == ["platform-team"]
    assert [r["name"] for r in by[("GPUUnreadable", "amd", "node-m:9632")]["receivers"]] == ["blackhole"]


def test_real_alertmanager_one_page_per_gpu_incident(alertmanager):
    """A lost GPU mutes its XID, ECC and row-remap alerts; a critical XID mutes the GPU's ECC,
    row-remap and application XID alerts; the same alerts of another GPU stay active."""
    n = {"instance": "node-h:9632", "cluster": "c1", "vendor": "nvidia"}
    hw = {"category": "hardware"}
    _http(f"{alertmanager}/api/v2/alerts", [
        _alert(alertname="GPUDeviceLost", severity="critical", gpu="1", uuid="GPU-1", **hw, **n),
        _alert(alertname="GPUXidCritical", severity="critical", gpu="1", uuid="GPU-1", xid="79", **hw, **n),
        _alert(alertname="GPUEccUncorrectable", severity="critical", gpu="1", uuid="GPU-1", **hw, **n),
        _alert(alertname="GPUXidCritical", severity="critical", gpu="2", uuid="GPU-2", xid="48", **hw, **n),
        _alert(alertname="GPUEccUncorrectable", severity="critical", gpu="2", uuid="GPU-2", **hw, **n),
        _alert(alertname="GPURowRemapFailure", severity="critical", gpu="2", uuid="GPU-2", state="failure", **hw, **n),
        _alert(alertname="GPUXidErrors", severity="warning", gpu="2", uuid="GPU-2", xid="13", **hw, **n),
        _alert(alertname="GPUEccUncorrectable", severity="critical", gpu="3", uuid="GPU-3", **hw, **n),
    ])
    state = _states(alertmanager, 8, lambda st: all(st[k]["status"]["inhibitedBy"] for k in (
        ("GPUXidCritical", "node-h:9632", "1"), ("GPUEccUncorrectable", "node-h:9632", "2"))))
    active = sorted(k[0] + "/" + k[2] for k, a in state.items() if a["status"]["state"] == "active")
    assert active == ["GPUDeviceLost/1", "GPUEccUncorrectable/3", "GPUXidCritical/2"]
    assert [r["name"] for r in state[("GPUDeviceLost", "node-h:9632", "1")]["receivers"]] == ["platform-team-pager"]


def test_real_alertmanager_the_node_contention_page_covers_its_gpus_tickets(alertmanager):
    n = {"instance": "node-c:9632", "cluster": "c1"}
    _http(f"{alertmanager}/api/v2/alerts", [
        _alert(alertname="GPUMemoryContentionFraction", category="memory_contention", severity="critical", **n),
        _alert(alertname="GPUMemoryContention", category="memory_contention", severity="warning",
               vendor="nvidia", gpu="0", uuid="GPU-c0", **n),
        _alert(alertname="GPUArbitrationStallsHigh", category="memory_contention", severity="warning",
               vendor="nvidia", gpu="0", uuid="GPU-c0", **n),
        _alert(alertname="GPUMemoryContention", category="memory_contention", severity="warning",
               vendor="nvidia", gpu="0", uuid="GPU-d0", instance="node-d:9632", cluster="c1"),
    ])
    state = _states(alertmanager, 4, lambda st: st[("GPUMemoryContention", "node-c:9632", "0")]["status"]["inhibitedBy"]
                    and st[("GPUArbitrationStallsHigh", "node-c:9632", "0")]["status"]["inhibitedBy"])
    assert state[("GPUMemoryContention", "node-d:9632", "0")]["status"]["state"] == "active"
    page = state[("GPUMemoryContentionFraction", "node-c:9632", None)]
    assert page["status"]["state"] == "active" and [r["name"] for r in page["receivers"]] == ["platform-team-pager"]


def test_real_alertmanager_a_gpu_below_its_own_baseline_covers_its_bandwidth_drop(alertmanager):
    """The degraded demo phase: a GPU below its own healthy baseline (GPUOwnBaselineDeviation,
    hardware) mutes its GPUBandwidthDropUnderLoad (workload; per GPU, though routed per workload
    or node), so the GPU is one ticket; another GPU's drop without a baseline deviation, and the
    same GPU on another node, still reach their team."""
    n = {"instance": "node-g:9632", "cluster": "c1", "vendor": "nvidia"}
    job = {"namespace": "ml", "workload": "trainer", "pod": "trainer-0"}
    drop = {"alertname": "GPUBandwidthDropUnderLoad", "category": "workload", "severity": "warning"}
    _http(f"{alertmanager}/api/v2/alerts", [
        _alert(alertname="GPUOwnBaselineDeviation", category="hardware", severity="warning", gpu="0", uuid="GPU-g0",
               **n),
        _alert(**drop, gpu="0", uuid="GPU-g0", **job, **n),
        _alert(**drop, gpu="1", uuid="GPU-g1", **job, **n),
        _alert(**drop, gpu="0", uuid="GPU-h0", instance="node-h:9632", cluster="c1", vendor="nvidia"),
    ])
    state = _states(alertmanager, 4, lambda st: st[("GPUBandwidthDropUnderLoad", "node-g:9632", "0")]["status"]
                    ["inhibitedBy"])
    active = sorted(f"{k[0]}/{k[1]}/{k[2]}" for k, a in state.items() if a["status"]["state"] == "active")
    assert active == ["GPUBandwidthDropUnderLoad/node-g:9632/1", "GPUBandwidthDropUnderLoad/node-h:9632/0",
                      "GPUOwnBaselineDeviation/node-g:9632/0"]
    own = state[("GPUOwnBaselineDeviation", "node-g:9632", "0")]
    assert [r["name"] for r in own["receivers"]] == ["platform-team"]
    assert [r["name"] for r in state[("GPUBandwidthDropUnderLoad", "node-g:9632", "1")]["receivers"]] == \
        ["application-team"]
