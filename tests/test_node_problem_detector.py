"""The node-problem-detector component: its custom-plugin-monitor config checked against NPD's
own config schema and validation, its rules wired to the plugin's classes, and the component
rendered with kubectl kustomize (NPD's own ServiceAccount, none for the exporter on Nodes, no
taints).

NPD's schema, from kubernetes/node-problem-detector@6632ca67148f7a23df9cdbd98d9e89b388561a3a
(2026-08-22): pkg/custompluginmonitor/types/config.go (CustomPluginConfig, pluginGlobalConfig,
ApplyConfiguration, Validate), pkg/custompluginmonitor/types/types.go (CustomRule) and
pkg/types/types.go (Condition, Type).  Go's encoding/json drops a misspelt field silently; this
check does not."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib

import pytest
import yaml

from exporter.health import probe
from exporter.health.definition import CLASSES
from tests.conftest import REPO, require_binary

COMPONENT = REPO / "deploy/kubernetes/components/node-problem-detector"
CONFIG = COMPONENT / "gpu-health-monitor.json"

# json field names of NPD's structs
CUSTOM_PLUGIN_CONFIG = {"plugin", "pluginConfig", "source", "conditions", "rules", "metricsReporting"}
PLUGIN_GLOBAL_CONFIG = {"invoke_interval", "timeout", "max_output_length", "concurrency",
                        "enable_message_change_based_condition_update", "skip_initial_status"}
CUSTOM_RULE = {"type", "condition", "reason", "path", "args", "timeout", "invoke_interval"}
CONDITION = {"type", "status", "transition", "reason", "message"}
RULE_TYPES = {"temporary", "permanent"}  # types.Temp, types.Perm
DEFAULTS = {"timeout": "5s", "invoke_interval": "30s", "max_output_length": 80, "concurrency": 3}
_GO_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
PASCAL = re.compile(r"^[A-Z][a-z0-9]*(?:[A-Z][a-z0-9]*)*$|^GPU[A-Z][A-Za-z0-9]*$")


def go_duration(text: str) -> float:
    """time.ParseDuration: a sequence of decimal numbers with units (ns, us, ms, s, m, h)."""
    parts = re.findall(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text.lstrip("+"):
        raise ValueError(f"not a Go duration: {text!r}")
    return sum(float(n) * _GO_UNIT[u] for n, u in parts)


def validate(cfg: dict) -> None:
    """CustomPluginConfig: json fields (strictly), ApplyConfiguration and Validate."""
    assert set(cfg) <= CUSTOM_PLUGIN_CONFIG, set(cfg) - CUSTOM_PLUGIN_CONFIG
    glob = cfg.get("pluginConfig", {})
    assert set(glob) <= PLUGIN_GLOBAL_CONFIG, set(glob) - PLUGIN_GLOBAL_CONFIG
    assert cfg["plugin"] == "custom", "NPD supports only the custom plugin"
    assert isinstance(cfg["source"], str) and cfg["source"]
    timeout = go_duration(glob.get("timeout", DEFAULTS["timeout"]))
    assert go_duration(glob.get("invoke_interval", DEFAULTS["invoke_interval"])) > 0
    for key in ("max_output_length", "concurrency"):
        assert isinstance(glob.get(key, DEFAULTS[key]), int) and glob.get(key, DEFAULTS[key]) > 0
    for key in ("enable_message_change_based_condition_update", "skip_initial_status"):
        assert isinstance(glob.get(key, False), bool)
    assert isinstance(cfg.get("metricsReporting", True), bool)
    conditions = {}
    for c in cfg["conditions"]:
        assert set(c) <= CONDITION, set(c) - CONDITION
        assert isinstance(c["type"], str) and isinstance(c["reason"], str) and isinstance(c["message"], str)
        conditions[c["type"]] = c
    for r in cfg["rules"]:
        assert set(r) <= CUSTOM_RULE, set(r) - CUSTOM_RULE
        assert r["type"] in RULE_TYPES
        assert isinstance(r["path"], str) and all(isinstance(a, str) for a in r.get("args", []))
        if "timeout" in r:
            assert go_duration(r["timeout"]) <= timeout, "plugin timeout is greater than global timeout"
        if "invoke_interval" in r:
            assert go_duration(r["invoke_interval"]) > 0
        if r["type"] == "permanent":
            assert r["condition"] in conditions, f"permanent problem {r['condition']} has no default condition"


@pytest.fixture(scope="module")
def cfg() -> dict:
    return json.loads(CONFIG.read_text())


def test_config_passes_npds_schema_and_validation(cfg):
    validate(cfg)


@pytest.mark.parametrize("mutate", [
    lambda c: c["pluginConfig"].__setitem__("invoke_intervall", "10s"),  # misspelt: Go would drop it
    lambda c: c["rules"][0].__setitem__("timeout", "1m"),  # above the global timeout
    lambda c: c["rules"][0].__setitem__("type", "perm"),
    lambda c: c["conditions"].pop(0),  # a permanent rule without its default condition
    lambda c: c["pluginConfig"].__setitem__("timeout", "10 seconds"),
])
def test_the_schema_check_can_fail(cfg, mutate):
    bad = json.loads(json.dumps(cfg))
    mutate(bad)
    with pytest.raises((AssertionError, ValueError)):
        validate(bad)


def test_one_condition_per_problem_class(cfg):
    """Each class of the health definition has one rule asking the plugin for that class only;
    hardware states that last until someone acts are permanent conditions, thermal is events."""
    by_class = {}
    for r in cfg["rules"]:
        args = probe.build_parser().parse_args(r["args"][1:])
        assert r["args"][0] == "health" and args.node and len(args.check) == 1
        by_class[args.check[0]] = r
        # the plugin gives up before NPD kills it: its own deadline plus start-up, below the rule's
        assert args.timeout + 2 <= go_duration(r["timeout"])
        assert PASCAL.match(r["reason"]), r["reason"]
    assert set(by_class) == set(CLASSES)
    for cls, (condition, _) in CLASSES.items():
        r = by_class[cls]
        if cls == "thermal":
            assert r["type"] == "temporary"
        else:
            assert r["type"] == "permanent" and r["condition"] == condition and PASCAL.match(condition)
    assert {c["type"] for c in cfg["conditions"]} == {r["condition"] for r in cfg["rules"] if r["type"] == "permanent"}
    for c in cfg["conditions"]:
        assert PASCAL.match(c["reason"]) and "status" not in c  # NPD starts them False itself
    assert cfg["pluginConfig"]["max_output_length"] >= probe.MAX_MESSAGE


def test_rule_path_is_the_images_console_script(cfg):
    script = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert script["unified-gpu-exporter"] == "exporter.cli:main"
    assert "python -m venv /opt/venv" in (REPO / "Dockerfile").read_text()
    assert {r["path"] for r in cfg["rules"]} == {"/opt/venv/bin/unified-gpu-exporter"}


def _render(target: str) -> list[dict]:
    kubectl = require_binary("kubectl", "kubectl")
    out = subprocess.run([kubectl, "kustomize", str(REPO / "deploy/kubernetes" / target)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_component_renders_with_kustomize(cfg):
    docs = _render("overlays/node-health")
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("DaemonSet", "unified-gpu-exporter") in kinds and ("DaemonSet", "unified-gpu-exporter-npd") in kinds
    npd = next(d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "unified-gpu-exporter-npd")
    pod = npd["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "unified-gpu-exporter-npd"
    (c,) = pod["containers"]
    assert "--config.custom-plugin-monitor=/config/gpu-health-monitor.json" in c["command"]
    # the ConfigMap mounted at /config holds the file as written
    vol = next(v for v in pod["volumes"] if v["name"] == "config")["configMap"]["name"]
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == vol)
    assert json.loads(cm["data"]["gpu-health-monitor.json"]) == cfg
    # the plugin's URL is the node-local Service, on the exporter's port
    svc = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "unified-gpu-exporter-node")
    assert svc["spec"]["internalTrafficPolicy"] == "Local"
    url = f"http://{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc:{svc['spec']['ports'][0]['port']}/metrics"
    assert {r["args"][r["args"].index("--url") + 1] for r in cfg["rules"]} == {url}
    # only NPD's ServiceAccount is bound to a role on Nodes; the exporter's is not; no taints
    exporter_sa = next(d for d in docs if d["kind"] == "DaemonSet"
                       and d["metadata"]["name"] == "unified-gpu-exporter")["spec"]["template"]["spec"]["serviceAccountName"]
    for b in (d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        names = {s["name"] for s in b["subjects"]}
        if b["roleRef"]["name"] == "system:node-problem-detector":
            assert names == {"unified-gpu-exporter-npd"}
        assert exporter_sa not in names or b["roleRef"]["name"] != "system:node-problem-detector"
    for role in (d for d in docs if d["kind"] in ("ClusterRole", "Role")):
        for rule in role.get("rules", []):
            if {"nodes", "nodes/status"} & set(rule.get("resources", [])):
                assert not {"patch", "update", "create", "delete", "*"} & set(rule["verbs"]), role
    assert "taint" not in json.dumps(docs).lower()

