"""The reference fleet's configuration (deploy/fleet): agent config, fleet rules and their
promtool tests, topology, the vmagent relabeling that keeps per-GPU series out of long-term
storage.  The running fleet is tests/test_fleet_e2e.py."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO, require_binary
from tests.promql_names import (
    SELF_METRICS,
    TARGET_HEALTH_METRICS,
    TARGET_LABELS,
    load_canonical,
    metric_names,
    selectors,
)

FLEET = REPO / "deploy" / "fleet"
RULES = sorted((FLEET / "rules").glob("*.yml"))
CANONICAL = load_canonical(REPO / "mappings" / "canonical.yaml")
PROM_RULES = sorted((REPO / "deploy" / "prometheus" / "rules").glob("*.yml"))
UNIT_TESTS = sorted((FLEET / "tests").glob("*.test.yml"))
# the collection path's own metrics (rules/unified-gpu-exporter.fleet-pipeline.yml): vmagent,
# vmalert, Alertmanager
PIPELINE_METRICS = frozenset({
    "vmagent_remotewrite_errors_total", "vmagent_remotewrite_pending_data_bytes",
    "vmagent_remotewrite_packets_dropped_total", "vm_persistentqueue_bytes_dropped_total",
    "vmalert_alerting_rules_error", "vmalert_recording_rules_error", "vmalert_alerts_send_errors_total",
    "alertmanager_notifications_failed_total",
})


def load_fleet_module():
    """deploy/fleet/fleet.py is a script, not a package module: load it by path (once)."""
    if "ugpu_fleet" not in sys.modules:
        spec = importlib.util.spec_from_file_location("ugpu_fleet", FLEET / "fleet.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["ugpu_fleet"] = module  # dataclasses look their module up while executing it
        spec.loader.exec_module(module)
    return sys.modules["ugpu_fleet"]


def _rules(paths):
    return [r for p in paths for g in yaml.safe_load(p.read_text())["groups"] for r in g["rules"]]


def _promtool(*args, cwd=FLEET):
    binary = require_binary("promtool", "prometheus")
    return subprocess.run([binary, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_edge_configs_are_valid_and_set_the_tenant_labels():
    vmagent = require_binary("vmagent", "victoria-metrics")
    result = subprocess.run([vmagent, "-promscrape.config=vmagent-edge.yml", "-promscrape.config.dryRun",
                             "-promscrape.config.strictParse"], cwd=FLEET, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    doc = yaml.safe_load((FLEET / "vmagent-edge.yml").read_text())
    assert {j["job_name"] for j in doc["scrape_configs"]} == {"unified-gpu-exporter", "node-exporter", "fleet-agent"}
    assert "external_labels" not in doc["global"]  # the tenant labels come from the relabel file, over any value
    relabel = yaml.safe_load((FLEET / "vmagent-edge-relabel.yml").read_text())
    assert [r["target_label"] for r in relabel] == ["cluster", "cloud", "region", "replica"]
    assert all(set(r) == {"target_label", "replacement"} for r in relabel)  # unconditional replace
    # the comparison edge: a Prometheus agent pair with the same tenant labels
    result = _promtool("check", "config", "--agent", "prometheus-agent.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    doc = yaml.safe_load((FLEET / "prometheus-agent.yml").read_text())
    assert set(doc["global"]["external_labels"]) == {"replica"}
    rw = doc["remote_write"][0]
    assert rw["url"].startswith("https://") and "credentials_file" in rw["authorization"]
    assert {r.get("target_label") for r in rw["write_relabel_configs"]} >= {"cluster", "cloud", "region"}
    assert "rule_files" not in doc and "alerting" not in doc  # rules run centrally


def absence_liveness() -> tuple[re.Pattern, str]:
    """What GPUExporterAbsent's list of expected nodes takes for a live node: the job regex of
    node_exporter's `up`, and the text of the whole expression (deploy/prometheus/rules)."""
    path = REPO / "deploy" / "prometheus" / "rules" / "unified-gpu-exporter.absence.yml"
    (expr,) = [r["expr"] for r in _rules([path]) if r.get("record") == "cluster_node:gpu_exporter_target:expected"]
    (regex,) = re.findall(r'up\{job=~"([^"]+)"\} == 1', expr)
    return re.compile(rf"^(?:{regex})$"), expr


def test_demo_edges_scrape_the_node_liveness_that_exporter_absent_reads():
    """GPUExporterAbsent pages only for a node that is alive (node_exporter's `up` == 1, or
    kube_node_info): both demo edges scrape a node_exporter job under a name the rule reads, per
    node label, and send nothing of it but the scrape's own series."""
    alive, _ = absence_liveness()
    for name in ("vmagent-edge.yml", "prometheus-agent.yml"):
        doc = yaml.safe_load((FLEET / name).read_text())
        (job,) = [j for j in doc["scrape_configs"] if j["job_name"] == "node-exporter"]
        assert alive.match(job["job_name"]), name
        assert job["metric_relabel_configs"] == [{"source_labels": ["__name__"], "regex": ".+", "action": "drop"}]
        assert job["file_sd_configs"][0]["files"] == ["node-exporter/*.json"]
        exporters = next(j for j in doc["scrape_configs"] if j["job_name"] == "unified-gpu-exporter")
        assert exporters["file_sd_configs"][0]["files"] == ["targets/*.json"]  # the two target lists apart


def test_central_store_drops_replica_except_on_the_agents_own_series():
    rules = yaml.safe_load((FLEET / "victoria-metrics-relabel.yml").read_text())
    assert rules[0]["source_labels"] == ["job"] and rules[0]["regex"] == "fleet-agent"
    assert rules[1]["target_label"] == "replica" and rules[1]["replacement"] == ""


def test_fleet_rules_pass_promtool_lint_and_unit_tests():
    result = _promtool("check", "rules", "--lint=all", "--lint-fatal", *map(str, RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(UNIT_TESTS) >= 2
    for path in UNIT_TESTS:
        result = _promtool("test", "rules", str(path.relative_to(FLEET)))
        assert result.returncode == 0, result.stdout + result.stderr


def test_every_fleet_rule_is_unit_tested_and_named_level_metric_operation():
    tested, fired, silent = set(), set(), set()
    groups = [g for path in UNIT_TESTS for g in yaml.safe_load(path.read_text())["tests"]]
    for group in groups:
        for case in group.get("promql_expr_test", []):
            tested |= metric_names(case["expr"])
        for case in group.get("alert_rule_test", []):
            (fired if case.get("exp_alerts") else silent).add(case["alertname"])
    records = {r["record"] for r in _rules(RULES) if "record" in r}
    alerts = {r["alert"] for r in _rules(RULES) if "alert" in r}
    assert records - tested == set()
    # Watchdog fires always: it has no case where it is silent
    assert alerts == fired == silent | {"Watchdog"}
    for name in records:
        level, metric, ops = name.split(":")
        assert re.fullmatch(r"[a-z]+(_[a-z]+)*", level) and metric.startswith("gpu_") and ops, name
    # no name clashes with the single-cluster rules evaluated beside them
    assert records.isdisjoint({r["record"] for r in _rules(PROM_RULES) if "record" in r})


def test_fleet_rules_use_known_names_and_labels():
    recorded = {r["record"] for r in _rules(RULES + PROM_RULES) if "record" in r}
    for rule in _rules(RULES):
        names = metric_names(rule["expr"])
        assert names <= set(CANONICAL) | SELF_METRICS | TARGET_HEALTH_METRICS | PIPELINE_METRICS | recorded, names
        for name, labels in selectors(rule["expr"]):
            if name in CANONICAL:
                assert labels <= CANONICAL[name] | TARGET_LABELS, (name, labels)


def test_fleet_alerts_link_their_runbook_section_without_external_labels():
    """Every fleet alert links its section of runbooks.md by the repository path; no fleet rule
    reads $externalLabels (vmalert's -external.label would label every recorded series and alert
    it writes: the base is rendered into the central copies instead)."""
    runbooks = (REPO / "deploy" / "prometheus" / "runbooks.md").read_text()
    for path in RULES:
        assert "$externalLabels" not in path.read_text(), path.name
    for rule in _rules(RULES):
        if "alert" in rule:
            assert rule["annotations"]["runbook_url"] == "deploy/prometheus/runbooks.md#" + rule["alert"].lower()
            assert re.search(rf"^## {rule['alert']}$", runbooks, re.M)


def test_central_rule_copies_carry_the_rendered_runbook_base(tmp_path, monkeypatch):
    """What vmalert evaluates (fleet.py's copies, the Kubernetes ConfigMap) has every alert's link
    under the fleet's runbook base (--runbook-base, else $FLEET_RUNBOOK_BASE, else the repository
    path), deploy/prometheus/rules' alerts included, and no $externalLabels left."""
    fleet = load_fleet_module()
    base = "https://git.example.com/ops/unified-gpu-exporter/blob/main/deploy/prometheus/runbooks.md"

    def links(paths) -> dict[str, str]:
        for p in paths:
            assert "$externalLabels" not in p.read_text(), p.name
        return {r["alert"]: r["annotations"]["runbook_url"] for r in _rules(paths) if "alert" in r}

    got = links(fleet.prepare_rules(tmp_path / "given", "30s", base))
    assert {"GPUExporterAbsent", "GPUCrossCloudPerformanceVariance", "Watchdog", "GPUClusterNotReporting"} <= set(got)
    assert got == {name: f"{base}#{name.lower()}" for name in got}
    monkeypatch.setenv("FLEET_RUNBOOK_BASE", "https://runbooks.example/gpu.md")
    assert set(links(fleet.prepare_rules(tmp_path / "env", None)).values()) == \
        {f"https://runbooks.example/gpu.md#{name.lower()}" for name in got}
    monkeypatch.delenv("FLEET_RUNBOOK_BASE")
    assert set(links(fleet.prepare_rules(tmp_path / "default", None)).values()) == \
        {f"deploy/prometheus/runbooks.md#{name.lower()}" for name in got}
    for bad in ("https://x.example/a b.md", "https://x.example/r.md#x", '{{ template "x" }}', "it's", ""):
        with pytest.raises(ValueError, match="runbook base"):
            fleet.prepare_rules(tmp_path / "bad", None, bad)
    # the Kubernetes ConfigMap, rendered with a base
    spec = importlib.util.spec_from_file_location("gen_k8s", REPO / "scripts" / "gen-kubernetes-monitoring.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    docs = list(yaml.safe_load_all(gen.render_fleet_config(base)))
    (rules,) = [d["data"] for d in docs if d["metadata"]["name"] == "gpu-fleet-rules"]
    (tmp_path / "cm").mkdir()
    for name, text in rules.items():
        (tmp_path / "cm" / name).write_text(text)
    assert links(sorted((tmp_path / "cm").iterdir())) == got


def _agent_keep_list() -> re.Pattern:
    doc = yaml.safe_load((FLEET / "vmagent-edge.yml").read_text())
    (job,) = [j for j in doc["scrape_configs"] if j["job_name"] == "fleet-agent"]
    (keep,) = [r for r in job["metric_relabel_configs"] if r["action"] == "keep"]
    assert keep["source_labels"] == ["__name__"]
    return re.compile(rf"^(?:{keep['regex']})$")


def test_agents_keep_every_own_metric_the_pipeline_alerts_and_the_sizing_read():
    """The edge agents send only a keep list of their own series: every agent metric a
    collection-path alert reads, and every one deploy/fleet/fleet_faults.py's sizing() queries
    (job="fleet-agent"), must be on it, or the alert is blind and the sizing reads 0."""
    load_fleet_module()
    import fleet_faults  # deploy/fleet, on sys.path now

    kept = _agent_keep_list()
    pipeline = FLEET / "rules" / "unified-gpu-exporter.fleet-pipeline.yml"
    from_agents = {n for r in _rules([pipeline]) for n in metric_names(r["expr"])
                   if n.startswith(("vmagent_", "vm_persistentqueue_"))}
    assert len(from_agents) >= 4, from_agents

    class Recorder:  # the fleet sizing() reads: queries recorded, every answer empty
        clusters = [load_fleet_module().Cluster("c1", "aws", "r", 1, "fleet")]
        nodes, scrape_interval, urls = [{}], "15s", {"vm-raw": "http://127.0.0.1:1"}
        exprs: list[str] = []

        def query(self, expr):
            self.exprs.append(expr)
            return []

    recorder = Recorder()
    fleet_faults.sizing(recorder)
    sized = {m.group(1) for e in recorder.exprs for m in re.finditer(r'([A-Za-z_:][\w:]*)\{[^{}]*job="fleet-agent"', e)}
    assert "vmagent_remotewrite_conn_bytes_written_total" in sized and len(sized) >= 3, sized
    assert sorted(n for n in from_agents | sized if not kept.match(n)) == []


def test_longterm_relabeling_keeps_rollups_and_drops_per_gpu_series():
    rules = yaml.safe_load((FLEET / "vmagent-longterm-relabel.yml").read_text())
    drop = re.compile(rf"^(?:{rules[0]['regex']})$")
    keep = re.compile(rf"^(?:{rules[1]['regex']})$")

    def kept(name):
        return not drop.match(name) and bool(keep.match(name))

    assert kept("cluster_cloud_region_model_workload:gpu_memory_bandwidth_gbps:avg")
    assert kept("model_cloud:gpu_memory_bandwidth_gbps:avg7d")
    assert kept("cloud_model_workload:gpu_memory_bandwidth_gbps:avg")
    for name in ("instance_gpu:gpu_info:max", "fleet_gpu:gpu_info:max", "ALERTS", "ALERTS_FOR_STATE",
                 "gpu_memory_bandwidth_gbps", "unified_gpu_exporter_device_up"):
        assert not kept(name), name


def test_topology_spans_three_clouds_two_clusters_and_one_degraded_cloud():
    fleet = load_fleet_module()
    clusters = fleet.load_topology(FLEET / "topology.yaml")
    assert len({c.cloud for c in clusters}) == 3 and len(clusters) >= 2
    degraded = {c.cloud for c in clusters if c.scenario == "fleet-degraded"}
    healthy = {c.cloud for c in clusters if c.scenario == "fleet"}
    assert len(degraded) == 1 and degraded.isdisjoint(healthy)
    for c in clusters:
        assert (REPO / "mappings" / "scenarios" / f"{c.scenario}.yaml").is_file()


def test_prepared_rules_cap_for_and_drop_group_intervals(tmp_path):
    fleet = load_fleet_module()
    paths = fleet.prepare_rules(tmp_path, "30s")
    assert {p.name for p in paths} == {p.name for p in PROM_RULES + RULES}
    capped = {r["alert"]: fleet._duration_seconds(r["for"]) for r in _rules(paths) if "for" in r}
    assert capped["GPUExporterDown"] == 30 and capped["GPUCrossCloudPerformanceVariance"] == 30
    # a failure-counter alert keeps twice its window: one failed request must not page
    assert capped["GPUFleetAgentRemoteWriteFailing"] == 240 and capped["GPUFleetComponentDown"] == 120
    assert all(s <= 30 for name, s in capped.items() if not name.startswith(("GPUFleet", "GPUContentionCost")))
    assert all("interval" not in g for p in paths for g in yaml.safe_load(p.read_text())["groups"])
    unchanged = fleet.prepare_rules(tmp_path / "real", None)
    assert any(r.get("for") == "15m" for r in _rules(unchanged))


@pytest.mark.parametrize("expr,own,cap,expected", [
    ("up == 0", "3m", "30s", "30s"),
    ("increase(e[2m]) > 0", "10m", "30s", "240s"),
    ("increase(e[2m]) > 0", "3m", "30s", "3m"),          # never above the rule's own
    ("absent_over_time(up{job=\"x\"}[1m])", "5m", "0s", "120s"),
    ("max_over_time(x[1h]) > 2", "15m", "30s", "30s"),   # other windows do not hold the cap
])
def test_capped_for_keeps_twice_a_failure_window(expr, own, cap, expected):
    assert load_fleet_module().capped_for({"expr": expr, "for": own}, cap) == expected


@pytest.mark.parametrize("text,seconds", [("30s", 30), ("15m", 900), ("1h30m", 5400), ("0s", 0)])
def test_duration_parsing(text, seconds):
    assert load_fleet_module()._duration_seconds(text) == seconds


def test_supervisor_keeps_running_reports_deaths_and_carries_out_kill_requests(tmp_path):
    """fleet.py --kill: a request file in the fleet's workdir; a process that dies on its own is
    reported (failed), one killed on request is not, and --down restarts it later."""
    import os
    import signal as sig
    import time

    load_fleet_module()
    from fleet_procs import Supervisor

    sup = Supervisor(tmp_path)
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    try:
        sup.spawn("a", sleeper, None)
        sup.spawn("b", sleeper, None)
        os.kill(sup.procs["b"].popen.pid, sig.SIGKILL)
        sup.procs["b"].popen.wait(timeout=10)
        assert sup.failed() == ["b"] and sup.running("a")
        sup.request("kill", "a", down_for=0.5)
        sup.request("kill", "nope")
        done = sup.handle_requests()
        assert done[0] == "killed a for 0.5s" and "refused" in done[1] and "nope" in done[1]
        assert not sup.running("a") and sup.failed() == ["b"]  # killed on purpose: not a failure
        time.sleep(0.6)
        assert sup.handle_requests() == ["restarted a"] and sup.running("a")
        state = yaml.safe_load((tmp_path / "fleet-state.json").read_text())
        assert state["a"]["running"] is True and state["a"]["pid"] == sup.procs["a"].popen.pid
        with pytest.raises(ValueError):
            sup.request("explode", "a")
    finally:
        sup.stop_all()


def test_kill_command_needs_a_running_fleet_and_a_known_name(tmp_path, capsys):
    fleet = load_fleet_module()
    with pytest.raises(SystemExit):
        fleet.main(["--workdir", str(tmp_path), "--kill", "vm-raw"])
    (tmp_path / "fleet-state.json").write_text('{"vm-raw": {"pid": 1, "cmd": [], "running": true}}')
    with pytest.raises(SystemExit):
        fleet.main(["--workdir", str(tmp_path), "--kill", "vm-nope"])
    assert fleet.main(["--workdir", str(tmp_path), "--kill", "vm-raw", "--down", "30"]) == 0
    (request,) = (tmp_path / "control").glob("*.json")
    assert yaml.safe_load(request.read_text()) == {"action": "kill", "name": "vm-raw", "down_for": 30.0}


def test_an_automatic_restart_that_fails_is_reported_and_the_fleet_keeps_running(tmp_path):
    """--kill NAME --down N: when the restart N s later fails (the process exits before it is
    ready), the supervision loop reports it and goes on; it used to raise out of
    handle_requests, which fleet.main turned into a stop of the whole fleet."""
    from tests.e2e_util import wait_until

    load_fleet_module()
    from fleet_procs import Supervisor

    sup = Supervisor(tmp_path)
    marker = tmp_path / "started-once"
    # runs the first time; every later start exits at once with status 3 (a broken restart)
    flaky = [sys.executable, "-c", f"import os, sys, time; p = {str(marker)!r}\n"
             "if os.path.exists(p): sys.exit(3)\nopen(p, 'w').close(); time.sleep(120)"]
    try:
        sup.spawn("a", flaky, "http://127.0.0.1:9/never-ready")
        sup.spawn("b", [sys.executable, "-c", "import time; time.sleep(120)"], None)
        wait_until(marker.exists, timeout=30, interval=0.1, what="the first start")
        sup.kill("a", down_for=0.0)
        done = sup.handle_requests()
        assert len(done) == 1 and done[0].startswith("restart of a failed:") and "exited with 3" in done[0], done
        assert sup.running("b") and sup.failed() == ["a"]  # reported like any death, not stopped
        assert sup.handle_requests() == []  # no restart loop
    finally:
        sup.stop_all()
