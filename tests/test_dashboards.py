"""Grafana dashboards (deploy/grafana/*.json): importable shape, the seed's panels, valid queries
on names that exist."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from tests.conftest import REPO, require_binary
from tests.promql_names import (
    CORRELATION_METRICS,
    PENDING_INDICATOR_NAMES,
    SELF_METRICS,
    TARGET_LABELS,
    grafana_expr_to_promql,
    load_canonical,
    metric_names,
    selectors,
    variable_query_names,
)

GRAFANA = REPO / "deploy" / "grafana"
DASHBOARDS = {p.name: json.loads(p.read_text()) for p in sorted(GRAFANA.glob("*.json"))}
CANONICAL = load_canonical(REPO / "mappings" / "canonical.yaml")
RECORDED = {rule["record"]
            for path in (REPO / "deploy" / "prometheus" / "rules").glob("*.yml")
            for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"] if "record" in rule}
DS_REF = {"type": "prometheus", "uid": "${datasource}"}


def _panels(dash):
    return [p for p in dash["panels"] if p["type"] != "row"]


def _queries(dash) -> list[tuple[str, str]]:
    """(where, PromQL with Grafana variables) for every target, annotation and variable query."""
    out = []
    for panel in _panels(dash):
        for target in panel["targets"]:
            out.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    for note in dash["annotations"]["list"]:
        if "expr" in note:
            out.append((f"annotation {note['name']!r}", note["expr"]))
    return out


def _variable_queries(dash) -> list[tuple[str, str]]:
    return [(v["name"], v["query"]) for v in dash["templating"]["list"] if v["type"] == "query"]


def test_five_dashboards_ship():
    assert set(DASHBOARDS) == {"gpu-memory-contention.json", "gpu-fleet-contention.json", "gpu-cost.json",
                               "gpu-health.json", "gpu-jobs.json"}


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_is_importable(name):
    dash = DASHBOARDS[name]
    assert dash["id"] is None
    assert 8 <= len(dash["uid"]) <= 40
    assert dash["title"] and isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 36
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in _panels(dash):
        assert panel["datasource"] == DS_REF, panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        assert all(t["datasource"] == DS_REF and t["expr"].strip() for t in panel["targets"])


def test_uids_and_titles_are_unique_across_dashboards():
    assert len({d["uid"] for d in DASHBOARDS.values()}) == len(DASHBOARDS)
    assert len({d["title"] for d in DASHBOARDS.values()}) == len(DASHBOARDS)


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_panels_fit_the_grid_without_overlapping(name):
    cells: dict[tuple[int, int], str] = {}
    for panel in DASHBOARDS[name]["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_datasource_variable_and_query_variables_use_it(name):
    variables = {v["name"]: v for v in DASHBOARDS[name]["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for var in variables.values():
        if var["type"] == "query":
            assert var["datasource"] == DS_REF
            assert isinstance(var["query"], str)  # the string form validates against Grafana's schema
            assert var["includeAll"] and var["allValue"] == ".*"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_dashboard_has_a_cluster_variable_that_filters_the_others(name):
    variables = DASHBOARDS[name]["templating"]["list"]
    assert [v["name"] for v in variables][:3] == ["datasource", "cluster", "cloud"]
    assert variables[1]["query"] == "label_values(gpu_info, cluster)"
    for var in variables[2:]:
        assert 'cluster=~"$cluster"' in var["query"], var["name"]


@pytest.mark.parametrize("name", ["gpu-memory-contention.json", "gpu-fleet-contention.json", "gpu-health.json"])
def test_gpu_dashboards_select_a_gpu_by_vendor_and_index_together(name):
    """The gpu variable lists "<node> <vendor> <index>" and its value is the GPU's uuid, so
    picking NVIDIA 0 does not also pick AMD 0 and Intel 0."""
    names = [v["name"] for v in DASHBOARDS[name]["templating"]["list"]]
    assert names[:6] == ["datasource", "cluster", "cloud", "node", "vendor", "gpu"]
    gpu = next(v for v in DASHBOARDS[name]["templating"]["list"] if v["name"] == "gpu")
    assert gpu["query"] == ('query_result(label_join(gpu_info{cluster=~"$cluster", cloud=~"$cloud", node=~"$node", '
                            'vendor=~"$vendor"}, "device", " ", "node", "vendor", "gpu"))')
    pattern = re.compile(gpu["regex"].strip("/").replace("?<", "?P<"))
    line = ('gpu_info{cloud="aws", cluster="c1", device="n1 amd 0", gpu="0", instance="n1:9632", '
            'model="MI300X", node="n1", uuid="0xabc", vendor="amd"}')
    m = pattern.search(line)
    assert m and m.group("text") == "n1 amd 0" and m.group("value") == "0xabc"
    for where, expr in _queries(DASHBOARDS[name]):
        assert 'gpu=~"$gpu"' not in expr, where
        if "$vendor" in expr and "gpu_info" not in expr and "device_up" not in expr:
            assert 'uuid=~"$gpu"' in expr, where


def test_health_dashboard_panels_cover_the_health_signals():
    names = set().union(*(metric_names(e) for _, e in _queries(DASHBOARDS["gpu-health.json"])))
    assert {"gpu_temperature_celsius", "gpu_power_watts", "gpu_energy_joules_total", "gpu_memory_used_bytes",
            "gpu_clock_mhz", "gpu_throttle_active", "gpu_ecc_errors_total", "gpu_memory_remapped_rows",
            "gpu_xid_errors_total", "gpu_pcie_bytes_total", "gpu_pcie_link_speed_gts", "gpu_pcie_link_max_speed_gts",
            "gpu_pcie_link_width", "gpu_pcie_link_max_width", "gpu_interconnect_bytes_total",
            "gpu_process_memory_bytes", "gpu_process_utilization_percent",
            "unified_gpu_exporter_device_up"} <= names


def test_seed_panels_are_on_the_contention_dashboard():
    panels = {p["title"]: p for p in _panels(DASHBOARDS["gpu-memory-contention.json"])}
    bandwidth = panels["Memory Bandwidth"]
    assert bandwidth["fieldConfig"]["defaults"]["unit"] == "GBs"
    exprs = {t["refId"]: t["expr"] for t in bandwidth["targets"]}
    assert exprs["A"].startswith("gpu_memory_bandwidth_gbps{")
    assert exprs["C"].startswith("gpu_compute_utilization_percent{")
    right = {o["matcher"]["options"]: {p["id"]: p["value"] for p in o["properties"]}
             for o in bandwidth["fieldConfig"]["overrides"]}
    assert right["C"]["unit"] == "percent" and right["C"]["custom.axisPlacement"] == "right"
    assert right["D"]["unit"] == "percent" and right["D"]["custom.axisPlacement"] == "right"

    stalls = panels["Arbitration Stall"]
    steps = [s["value"] for s in stalls["fieldConfig"]["defaults"]["thresholds"]["steps"]]
    assert steps == [None, 5, 15, 20]
    assert metric_names(stalls["targets"][0]["expr"]) == {"gpu_memory_arbitration_stalls_percent"}

    cross = [p for t, p in panels.items() if t.startswith("Cross-Cloud Comparison")]
    cross_names = set().union(*(metric_names(t["expr"]) for p in cross for t in p["targets"]))
    assert "cloud_model_workload:gpu_memory_bandwidth_gbps:avg" in cross_names
    assert "model_cloud:gpu_memory_latency_nanoseconds:avg" in cross_names

    temporal = [p for t, p in panels.items() if t.startswith("Temporal Correlation")]
    temporal_names = set().union(*(metric_names(t["expr"]) for p in temporal for t in p["targets"]))
    assert {"gpu_memory_bandwidth_gbps", "node_cpu_seconds_total", "node_network_receive_bytes_total",
            "node_disk_reads_completed_total", "node_disk_read_time_seconds_total", "kube_pod_info"} <= temporal_names


def test_fleet_and_cost_views_cover_contention_and_cost():
    fleet = set().union(*(metric_names(e) for _, e in _queries(DASHBOARDS["gpu-fleet-contention.json"])))
    assert {"gpu_memory_contention", "cloud:gpu_memory_contention_seconds:avg_rate5m", "gpu_contention_cause",
            "gpu_metric_cov", "gpu_baseline_zscore", "unified_gpu_exporter_source_up"} <= fleet
    cost = set().union(*(metric_names(e) for _, e in _queries(DASHBOARDS["gpu-cost.json"])))
    assert {"namespace_workload:gpu_effective_cost_dollars_per_busy_hour:ratio",
            "namespace_workload:gpu_contention_cost_dollars:sum_rate5m", "gpu_contention_cost_dollars_total",
            "cloud:gpu_price_dollars_per_hour:sum"} <= cost


def test_cost_per_hour_panels_are_not_an_hour_late():
    """Issue 39: a "per hour" cost panel shows the current rate (5-minute window), not a 1-hour
    trailing average (0.12 $/h while contention cost 1.9 $/h)."""
    late = [(where, expr) for where, expr in _queries(DASHBOARDS["gpu-cost.json"])
            if "gpu_contention_cost_dollars" in expr and ("sum_rate1h" in expr or "[1h]" in expr)]
    assert late == []


# ------------------------------------------------------------------------------- names and syntax

def _allowed(name: str) -> bool:
    return (name in CANONICAL or name in SELF_METRICS or name in RECORDED or name in CORRELATION_METRICS
            or name in PENDING_INDICATOR_NAMES)


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_query_references_only_known_metric_names(name):
    dash = DASHBOARDS[name]
    for where, expr in [*_queries(dash), *_variable_queries(dash)]:
        names = variable_query_names(expr)
        assert names, (where, expr)
        unknown = {n for n in names if not _allowed(n)}
        assert not unknown, f"{name} {where}: unknown metric names {unknown}"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_query_matchers_use_labels_the_metric_has(name):
    for where, expr in _queries(DASHBOARDS[name]):
        for metric, labels in selectors(expr):
            if metric in CANONICAL:
                extra = labels - CANONICAL[metric] - TARGET_LABELS
                assert not extra, f"{name} {where}: {metric} has no label {extra}"


def test_every_dashboard_query_is_valid_promql(tmp_path):
    """promtool parses each query (variables set to All) as the expression of a recording rule."""
    promtool = require_binary("promtool", "prometheus")
    rules = []
    for dash in DASHBOARDS.values():
        for where, expr in _queries(dash):
            rules.append({"record": f"dashboard:query:n{len(rules)}", "expr": grafana_expr_to_promql(expr),
                          "labels": {"where": f"{dash['uid']} {where}"}})
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_query_validation_can_fail(tmp_path):
    promtool = require_binary("promtool", "prometheus")
    path = tmp_path / "bad.yml"
    bad = grafana_expr_to_promql("sum by (node) (rate(gpu_energy_joules_total{node=~\"$node\"}[$__rate_interval])")
    path.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [{"record": "a:b:c", "expr": bad}]}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0


def test_every_dashboard_has_the_schema_version_the_readme_names():
    """README: "the JSON model of Grafana 10.4 (`schemaVersion` 39)"."""
    named = re.search(r"JSON model of Grafana [\d.]+ \(`schemaVersion` (\d+)\)", (REPO / "README.md").read_text())
    assert named, "README no longer names the dashboards' schema version"
    assert {name: d["schemaVersion"] for name, d in DASHBOARDS.items()} == dict.fromkeys(DASHBOARDS, int(named[1]))
