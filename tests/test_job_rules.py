"""The optional job-charging recording rules (deploy/prometheus/jobs): promtool's lints, its unit
test (deploy/prometheus/tests/jobs.test.yml, also run with the others by tests/test_rules.py),
a broken split caught by it, and every series they read declared in mappings/canonical.yaml."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.conftest import REPO, require_binary
from tests.promql_names import load_canonical, metric_names

PROM = REPO / "deploy" / "prometheus"
RULES = PROM / "jobs" / "unified-gpu-exporter.jobs.rules.yml"
UNIT = PROM / "tests" / "jobs.test.yml"


def _promtool(*args: str, cwd: Path = PROM) -> subprocess.CompletedProcess:
    return subprocess.run([require_binary("promtool", "prometheus"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def _records() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_rules_pass_promtool_lints_and_unit_test():
    r = _promtool("check", "rules", "--lint=all", "--lint-fatal", str(RULES))
    assert r.returncode == 0 and "SUCCESS: 6 rules found" in r.stdout, r.stdout + r.stderr
    r = _promtool("test", "rules", str(UNIT.relative_to(PROM)))
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_rules_read_only_declared_series():
    canonical = load_canonical(REPO / "mappings" / "canonical.yaml")
    recorded = {r["record"] for r in _records()}
    for rule in _records():
        for name in metric_names(rule["expr"]) - recorded:
            assert name in canonical, (rule["record"], name)
    assert {"job_id", "job_user", "job_partition", "job_cluster"} <= canonical["gpu_job_info"]


def test_a_broken_cost_split_is_caught(tmp_path):
    """Charging each job the whole GPU's dollars (no split) fails the unit test."""
    text = RULES.read_text()
    split = "              / on (cluster, instance, vendor, gpu, uuid) group_left ()\n"
    assert split in text
    broken = text.replace(split, "              * on (cluster, instance, vendor, gpu, uuid) group_left ()\n")
    (tmp_path / "jobs").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "jobs" / RULES.name).write_text(broken)
    (tmp_path / "tests" / UNIT.name).write_text(UNIT.read_text())
    r = _promtool("test", "rules", f"tests/{UNIT.name}", cwd=tmp_path)
    assert r.returncode != 0 and "gpu_contention_cost_dollars" in r.stdout + r.stderr


def test_optional_not_loaded_by_the_shipped_configs():
    for conf in PROM.glob("prometheus*.yml"):
        assert "jobs/" not in conf.read_text(), conf.name


def test_jobs_dashboard_agrees_with_the_rules(tmp_path):
    """The dashboard's queries (deploy/grafana/gpu-jobs.json, which work without the optional
    rules) give the recorded values on the unit test's series."""
    import json

    dash = json.loads((REPO / "deploy" / "grafana" / "gpu-jobs.json").read_text())
    exprs = {p["title"]: p["targets"][0]["expr"] for p in dash["panels"]}
    subst = {"$cluster": ".*", "$cloud": ".*", "$job_user": ".*", "$__rate_interval": "2m", "$__range": "30m"}

    def plain(expr: str) -> str:
        for var, value in subst.items():
            expr = expr.replace(var, value)
        return expr

    unit = yaml.safe_load(UNIT.read_text())
    seconds = plain(exprs["Contended seconds per second, by job"])
    dollars = plain(exprs["Contention cost per hour, by user"])
    total = plain(exprs["Contended seconds over the range, by job"])
    job = '{{job_cluster="hpc1", job_id="{}", job_user="{}"}}'
    test = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "15s", "input_series": unit["tests"][0]["input_series"],
        "promql_expr_test": [
            {"expr": seconds, "eval_time": "15m", "exp_samples": [
                {"labels": job.format(j, u), "value": v}
                for j, u, v in (("100", "alice", 0.5), ("200", "bob", 0.2), ("201", "bob", 0.2),
                                ("300", "carol", 0.1), ("301", "carol", 0.1))]},
            {"expr": f"round({dollars}, 1e-6)", "eval_time": "15m", "exp_samples": [
                {"labels": f'{{job_cluster="hpc1", job_user="{u}"}}', "value": v}
                for u, v in (("alice", 36), ("bob", 21.6), ("carol", 14.4))]},
            {"expr": f'round({total}, 1e-6) and on (job_id) label_replace(vector(1), "job_id", "100", "", "")',
             "eval_time": "30m", "exp_samples": [{"labels": job.format("100", "alice"), "value": 300}]},
        ]}]}
    (tmp_path / "dash.test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    r = _promtool("test", "rules", "dash.test.yml", cwd=tmp_path)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
