"""Prometheus rules, scrape configs and their promtool unit tests (deploy/prometheus)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from exporter.render.otlp_stats import HELP as OTLP_HELP
from tests.conftest import REPO, require_binary
from tests.promql_names import (
    PENDING_INDICATOR_NAMES,
    SELF_METRICS,
    TARGET_HEALTH_METRICS,
    TARGET_LABELS,
    grafana_expr_to_promql,
    load_canonical,
    metric_names,
    selectors,
    variable_query_names,
)

PROM = REPO / "deploy" / "prometheus"
RULE_FILES = sorted((PROM / "rules").glob("*.yml"))
UNIT_TESTS = sorted((PROM / "tests").glob("*.test.yml"))
CANONICAL = load_canonical(REPO / "mappings" / "canonical.yaml")
RUNBOOKS = PROM / "runbooks.md"

SEED_ALERTS = {
    "GPUMemoryContention", "GPUArbitrationStallsHigh", "GPUBandwidthDropUnderLoad",
    "GPUBaselineDeviation", "GPUCrossCloudPerformanceVariance", "GPUThrottling",
    "GPUExporterSourceDown", "GPUXidErrors",
}
# node-side memory-state alerts (issue 14, group unified-gpu-exporter.contention)
CONTENTION_ALERTS = {
    "GPUMemoryContentionFraction", "GPUContentionNotEvaluable", "GPUMIGInstanceNotEvaluable",
    "GPUOwnBaselineDeviation", "GPUContentionCostOverBudget",
}
HEALTH_ALERTS = {
    "GPUDeviceLost", "GPUEccUncorrectable", "GPURowRemapFailure", "GPUXidCritical",
    "GPUTemperatureHigh", "GPUPcieLinkDegraded", "GPUUnreadable",
}
# a dead or missing exporter on a live node (rules/unified-gpu-exporter.absence.yml)
ABSENCE_ALERTS = {"GPUExporterDown", "GPUExporterAbsent"}
# optional rule files, not loaded by the shipped Prometheus configs, unit-tested in tests/ as well
OPTIONAL_RULE_FILES = [PROM / "otlp" / "otlp-push.rules.yml"]
OPTIONAL_ALERTS = {"GPUExporterOtlpPushFailing"}
OTLP_SELF_METRICS = frozenset("unified_gpu_exporter_" + name for name in OTLP_HELP)
CATEGORIES = {"memory_contention", "cloud", "workload", "hardware", "exporter", "inhibitor"}


def _rules(paths: list[Path] = RULE_FILES) -> list[dict]:
    return [rule for path in paths for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"]]


ALERTS = [r for r in _rules() if "alert" in r]
OPTIONAL_RULE_ALERTS = [r for r in _rules(OPTIONAL_RULE_FILES) if "alert" in r]
RECORDS = [r for r in _rules() if "record" in r]
RECORDED_NAMES = {r["record"] for r in RECORDS}


def _promtool(*args: str, cwd: Path = PROM) -> subprocess.CompletedProcess:
    binary = require_binary("promtool", "prometheus")
    return subprocess.run([binary, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


# ------------------------------------------------------------------------------- promtool

def test_rule_files_pass_promtool_check_with_all_lints():
    result = _promtool("check", "rules", "--lint=all", "--lint-fatal", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr
    found = sum(int(n) for n in re.findall(r"SUCCESS: (\d+) rules found", result.stdout))
    assert found == len(ALERTS) + len(RECORDS), result.stdout


@pytest.mark.parametrize("test_file", UNIT_TESTS, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(test_file):
    result = _promtool("test", "rules", str(test_file.relative_to(PROM)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_annotations_sort_every_query_result():
    """`query` returns its series in an order that changes between evaluations: a template listing
    them would change a page's text from one evaluation to the next (promtool's unit test flaked on
    the job list).  Every query in an annotation is sorted by a label (sortByLabel is a stable sort:
    a chain sorts by its last label first, ties by the earlier ones)."""
    texts = [(rule["alert"], key, text) for rule in ALERTS + OPTIONAL_RULE_ALERTS
             for key, text in rule.get("annotations", {}).items()]
    tails = [(alert, key, tail) for alert, key, text in texts
             for tail in re.findall(r"\|\s*query\b([^}]*)\}\}", text)]
    calls = sum(len(re.findall(r"\bquery\b", block)) for _, _, text in texts
                for block in re.findall(r"\{\{(.*?)\}\}", text, re.S))
    assert len(tails) >= 8 and calls == len(tails)  # no query called another way (`query "..."`)
    for alert, key, tail in tails:
        assert re.match(r'(\s*\|\s*sortByLabel\s+"\w+")+\s*$', tail), (alert, key, tail)


def test_promtool_unit_tests_can_fail(tmp_path):
    """A broken threshold is caught: the unit tests are not vacuous."""
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests").mkdir()
    for path in RULE_FILES:
        text = path.read_text()
        if path.name.endswith(".alerts.yml"):
            assert "(gpu_memory_bandwidth_utilization_percent > 85)" in text
            text = text.replace("(gpu_memory_bandwidth_utilization_percent > 85)",
                                "(gpu_memory_bandwidth_utilization_percent >= 85)")
        (tmp_path / "rules" / path.name).write_text(text)
    (tmp_path / "tests" / "alerts.test.yml").write_text((PROM / "tests" / "alerts.test.yml").read_text())
    result = _promtool("test", "rules", "tests/alerts.test.yml", cwd=tmp_path)
    assert result.returncode != 0
    assert "GPUMemoryContention" in result.stdout + result.stderr


def test_optional_rule_files_pass_promtool_check_and_are_not_loaded_by_default():
    result = _promtool("check", "rules", "--lint=all", "--lint-fatal", *map(str, OPTIONAL_RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert {a["alert"] for a in OPTIONAL_RULE_ALERTS} == OPTIONAL_ALERTS
    for alert in OPTIONAL_RULE_ALERTS:
        test_alert_has_severity_category_and_annotations(alert)
        assert metric_names(alert["expr"]) <= SELF_METRICS | OTLP_SELF_METRICS
    for conf in PROM.glob("prometheus*.yml"):
        assert "otlp" not in conf.read_text(), conf.name


def test_plain_scrape_config_passes_promtool_check():
    result = _promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(RULE_FILES)} rule files found" in result.stdout


def test_tls_scrape_config_passes_promtool_syntax_check():
    # --syntax-only: the CA, client certificate and password files live on the Prometheus host.
    result = _promtool("check", "config", "--syntax-only", "prometheus-tls.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    job = yaml.safe_load((PROM / "prometheus-tls.yml").read_text())["scrape_configs"][0]
    assert job["scheme"] == "https"
    assert job["basic_auth"]["username"] and job["basic_auth"]["password_file"]
    assert job["tls_config"]["ca_file"]


def test_kubernetes_scrape_config_is_valid_with_discovery_swapped_for_static(tmp_path):
    # Debian's prometheus build leaves Kubernetes SD out, so its promtool rejects
    # kubernetes_sd_configs; everything else (relabeling, regexes, alerting) is checked with the
    # discovery blocks swapped for static ones, and the discovery itself is asserted below.
    doc = yaml.safe_load((PROM / "prometheus-kubernetes.yml").read_text())
    jobs = {job["job_name"]: job for job in doc["scrape_configs"]}
    exporter = jobs["unified-gpu-exporter"]
    assert exporter["kubernetes_sd_configs"] == [{"role": "pod"}]
    relabel = {tuple(r.get("source_labels", [])): r for r in exporter["relabel_configs"]}
    assert relabel[("__meta_kubernetes_pod_node_name",)]["target_label"] == "node"
    # the exporter's own pod must not take the workload labels `namespace`/`pod`
    assert {r.get("target_label") for r in exporter["relabel_configs"]}.isdisjoint({"namespace", "pod"})
    for section in [*doc["scrape_configs"], *doc["alerting"]["alertmanagers"]]:
        section.pop("kubernetes_sd_configs")
        section["static_configs"] = [{"targets": ["placeholder:9632"]}]
    (tmp_path / "rules").symlink_to(PROM / "rules")
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(doc))
    result = _promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_e2e_config_loads_rules_and_file_sd_targets_relative_to_itself():
    result = _promtool("check", "config", "prometheus-e2e.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(RULE_FILES)} rule files found" in result.stdout
    doc = yaml.safe_load((PROM / "prometheus-e2e.yml").read_text())
    assert doc["rule_files"] == ["rules/*.yml"]
    assert doc["alerting"]["alertmanagers"][0]["file_sd_configs"][0]["files"] == ["e2e-targets/alertmanager.json"]
    assert doc["scrape_configs"][0]["file_sd_configs"][0]["files"] == ["e2e-targets/exporter.json"]


def test_node_relabeling_strips_the_port():
    doc = yaml.safe_load((PROM / "prometheus.yml").read_text())
    rule = doc["scrape_configs"][0]["relabel_configs"][0]
    # Prometheus anchors relabel regexes at both ends
    regex = re.compile(rf"^(?:{rule['regex']})$")
    assert regex.match("gpu-node-1:9632").expand(rule["replacement"].replace("$1", r"\1")) == "gpu-node-1"
    assert regex.match("10.0.0.7").expand(rule["replacement"].replace("$1", r"\1")) == "10.0.0.7"


# ------------------------------------------------------------------------------- rule content

def test_every_seed_alert_is_defined():
    assert {a["alert"] for a in ALERTS} == SEED_ALERTS | CONTENTION_ALERTS | HEALTH_ALERTS | ABSENCE_ALERTS


def test_contention_alerts_survive_an_exporter_restart_and_need_evidence():
    by_name = {a["alert"]: a for a in ALERTS}
    for name in ("GPUMemoryContention", "GPUMemoryContentionFraction", "GPUOwnBaselineDeviation"):
        assert by_name[name].get("keep_firing_for"), name
    assert 'gpu_memory_state{state="contended"} == 1' in by_name["GPUMemoryContention"]["expr"]
    assert "rate(gpu_memory_contention_seconds_total[3m]))\n) > 0.05" in by_name["GPUMemoryContentionFraction"]["expr"]


def _seconds(d: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)([smh])", d))


@pytest.mark.parametrize("name", ["GPUMemoryContention", "GPUMemoryContentionFraction"])
def test_contention_pages_resolve_within_5_minutes_of_the_contention_ending(name):
    """Issue 39: a full window of contention, then none: the rate (or the state) falls below
    the threshold after its window, then keep_firing_for; plus a scrape and an evaluation (1 m)."""
    alert = next(a for a in ALERTS if a["alert"] == name)
    windows = [_seconds(w) for w in re.findall(r"\[(\d+[smh])\]", alert["expr"])]
    fall = max(windows, default=0) * (1 - 0.05 / 1.0)  # a fully contended window drains to 5 %
    assert fall + _seconds(alert.get("keep_firing_for", "0s")) + 60 <= 300, (windows, alert.get("keep_firing_for"))


# labels a series may lack (target labels, enrichment, optional canonical labels)
OPTIONAL_LABELS = ("cluster", "cloud", "node", "namespace", "pod", "workload", "block", "gpu_instance")


@pytest.mark.parametrize("alert", ALERTS, ids=lambda a: f"{a['alert']}-{a['labels']['severity']}")
def test_descriptions_never_render_an_empty_optional_label(alert):
    """Issue 39 ("cluster )"): an optional label appears in a description only inside
    ``{{ with $labels.x }}`` (or as that block's ``.``), never bare."""
    text = alert["annotations"]["description"]
    outside = re.sub(r"\{\{ with \$labels\.(\w+) \}\}.*?\{\{ end \}\}", "", text, flags=re.S)
    # a query's arguments are matchers, not text: printf "...%q..." $labels.cluster | query
    outside = re.sub(r'printf "(?:[^"\\]|\\.)*"(?:\s+\$labels\.\w+)+', "", outside)
    bare = [lab for lab in OPTIONAL_LABELS if re.search(rf"\$labels\.{lab}\b", outside)]
    assert bare == [], f"{alert['alert']}: {bare} rendered bare (empty when the series lacks it)"


@pytest.mark.parametrize("alert", ALERTS, ids=lambda a: f"{a['alert']}-{a['labels']['severity']}")
def test_alert_has_severity_category_and_annotations(alert):
    # info: a known blind spot worth seeing, not acting on every time (GPUMIGInstanceNotEvaluable)
    assert alert["labels"]["severity"] in {"critical", "warning", "info", "none"}
    assert alert["labels"]["category"] in CATEGORIES
    # severity none: an alert that exists only to inhibit (routed to a receiver that sends nothing)
    assert (alert["labels"]["severity"] == "none") == (alert["labels"]["category"] == "inhibitor")
    notes = alert["annotations"]
    assert set(notes) == {"summary", "description", "runbook_url"}
    assert notes["summary"].endswith(".") and "{{" not in notes["summary"]
    assert "{{" in notes["description"]
    anchor = notes["runbook_url"].rsplit("#", 1)[1]
    assert anchor == alert["alert"].lower()
    assert re.search(rf"^## {alert['alert']}$", RUNBOOKS.read_text(), re.M), f"no runbook section for {anchor}"


def test_seed_thresholds_are_in_the_expressions():
    by_name = {a["alert"]: a for a in ALERTS}
    contention = by_name["GPUMemoryContention"]
    assert "gpu_memory_bandwidth_utilization_percent > 85" in contention["expr"]
    assert "gpu_compute_occupancy_percent < 50" in contention["expr"]
    assert contention["for"] == "2m"
    stalls = by_name["GPUArbitrationStallsHigh"]
    assert re.search(r"\) > 20\s*$", stalls["expr"].split(" or")[0]) and stalls["for"] == "5m"
    drop = by_name["GPUBandwidthDropUnderLoad"]["expr"]
    assert "<= 0.7" in drop and "> 85" in drop
    assert "< -2" in by_name["GPUBaselineDeviation"]["expr"]
    assert "> 1.4" in by_name["GPUCrossCloudPerformanceVariance"]["expr"]


def test_recording_rules_are_named_level_metric_operations():
    for name in RECORDED_NAMES:
        level, metric, operations = name.split(":")
        assert re.fullmatch(r"[a-z]+(_[a-z]+)*", level), name
        assert re.fullmatch(r"[a-z][a-z0-9_]*", operations), name
        assert not metric.endswith("_total"), f"{name}: strip _total from counters used with rate()"
        assert metric.startswith("gpu_"), name


def test_every_alert_and_recording_rule_has_a_unit_test():
    fired, silent, checked = set(), set(), set()
    for path in UNIT_TESTS:
        for group in yaml.safe_load(path.read_text())["tests"]:
            for case in group.get("alert_rule_test", []):
                (fired if case.get("exp_alerts") else silent).add(case["alertname"])
            for case in group.get("promql_expr_test", []):
                checked |= metric_names(case["expr"])
                for sample in case.get("exp_samples", []):
                    checked.add(sample["labels"].split("{", 1)[0])
                regex = re.search(r'__name__=~"([^"]+)"', case["expr"])
                if regex:
                    checked |= {n for n in RECORDED_NAMES if re.fullmatch(regex.group(1), n)}
    every = SEED_ALERTS | CONTENTION_ALERTS | HEALTH_ALERTS | ABSENCE_ALERTS | OPTIONAL_ALERTS
    assert fired == every, "alerts without a firing case"
    assert silent == every, "alerts without a not-firing case"
    assert RECORDED_NAMES - checked == set()


# ------------------------------------------------------------------------------- names

# Prometheus's own series of the alerts' states (the hysteresis terms read it)
PROMETHEUS_SERIES = {"ALERTS"}


def _allowed(name: str) -> bool:
    return (name in PROMETHEUS_SERIES or name in CANONICAL or name in SELF_METRICS or name in RECORDED_NAMES
            or name in PENDING_INDICATOR_NAMES or name in TARGET_HEALTH_METRICS)


@pytest.mark.parametrize("rule", _rules(), ids=lambda r: r.get("record") or r["alert"])
def test_rule_references_only_known_metric_names(rule):
    names = metric_names(rule["expr"])
    assert names, rule["expr"]
    assert {n for n in names if not _allowed(n)} == set()


@pytest.mark.parametrize("rule", _rules(), ids=lambda r: r.get("record") or r["alert"])
def test_rule_matchers_use_labels_the_metric_has(rule):
    for name, labels in selectors(rule["expr"]):
        if name in CANONICAL:
            assert labels <= CANONICAL[name] | TARGET_LABELS, (name, labels - CANONICAL[name])


def test_pending_indicator_names_are_still_missing_from_canonical():
    assert PENDING_INDICATOR_NAMES.isdisjoint(CANONICAL), "now in canonical.yaml: remove from PENDING_INDICATOR_NAMES"


def test_recording_rules_only_read_rules_defined_before_them_in_file_order():
    seen: set[str] = set()
    for rule in RECORDS:
        # a rule may read its own previous value (the absence rules' expected-target list)
        used = {n for n in metric_names(rule["expr"]) if n in RECORDED_NAMES} - {rule["record"]}
        assert used <= seen, (rule["record"], used - seen)
        seen.add(rule["record"])


# ------------------------------------------------------------------------------- promql_names helper

@pytest.mark.parametrize("expr,names", [
    ("gpu_power_watts", {"gpu_power_watts"}),
    ('sum by (cloud) (rate(gpu_energy_joules_total{cloud=~"aws|gcp", gpu!="0"}[5m]))', {"gpu_energy_joules_total"}),
    ("a / on (instance, gpu) group_left (model) b:c:d", {"a", "b:c:d"}),
    ("max without (kernel, trace_id) (x) > 20 and ignoring (foo) y unless z", {"x", "y", "z"}),
    ("x offset 15m > bool 1e-9 or vector(1)", {"x"}),
    ('label_replace(up_time, "dst", "$1", "src", "(.*)")', {"up_time"}),
    ("topk(10, node_load1) * 0.7 + 0x1F", {"node_load1"}),
    ("avg_over_time(m:n:avg1h[1d:5m]) - stdvar_over_time(q[7d] offset 1h30m)", {"m:n:avg1h", "q"}),
    ('count by (node) (kube_pod_info{node=~"$node"}) != count by (node) (kube_pod_info offset 1m)', {"kube_pod_info"}),
    ("rate(a_total[$__rate_interval]) * on() group_left() sum(b) by (x)", {"a_total", "b"}),
    ('{__name__="quoted_name", job="x"}', {"quoted_name"}),
    ("sum(x) by (le) @ start()", {"x"}),
])
def test_metric_names_extracts_names_only(expr, names):
    assert metric_names(expr) == names


def test_metric_names_does_not_take_label_names_strings_or_durations_for_metrics():
    expr = 'sum by (inst_a) (m{lbl="not_a_metric"}) / on (inst_b) group_right (lab_c) n[5m:30s]'
    assert metric_names(expr) == {"m", "n"}


def test_selectors_report_label_names_per_metric():
    found = selectors('a{x="1", y=~"$v"} + b{z!="", __name__="b"} + c')
    assert found == [("a", frozenset({"x", "y"})), ("b", frozenset({"z"}))]


def test_grafana_variables_become_valid_promql():
    expr = 'increase(x{node=~"$node", g=~"${gpu}"}[$__range]) / rate(y[$__rate_interval])'
    assert grafana_expr_to_promql(expr) == 'increase(x{node=~".*", g=~".*"}[1h]) / rate(y[1m])'
    assert variable_query_names('label_values(gpu_info{cloud=~"$cloud"}, node)') == {"gpu_info"}
    assert variable_query_names("label_values(gpu_info, cloud)") == {"gpu_info"}


def test_unknown_names_are_reported():
    names = metric_names("gpu_memory_bandwith_gbps > 1")  # typo
    assert {n for n in names if not _allowed(n)} == {"gpu_memory_bandwith_gbps"}
