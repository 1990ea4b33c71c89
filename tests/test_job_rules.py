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
