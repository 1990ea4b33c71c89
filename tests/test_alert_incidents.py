"""One page per incident (issue 39): deploy/prometheus/tests/incidents.test.yml holds one promtool
test per fault scenario the simulator ships; here it runs with every shipped alert that a test
does not list at one of its eval_times added as ``exp_alerts: []``, so what a test lists is
exactly what fires then, nothing else (a second alert for the same fault, a GPU of a down source
read as lost, a health alert resolved by a vanished series all fail it)."""

from __future__ import annotations

import subprocess

import yaml

from tests.conftest import REPO, require_binary

PROM = REPO / "deploy" / "prometheus"
INCIDENTS = PROM / "tests" / "incidents.test.yml"


def shipped_alerts() -> set[str]:
    return {r["alert"] for path in (PROM / "rules").glob("*.yml")
            for g in (yaml.safe_load(path.read_text()) or {}).get("groups", []) for r in g["rules"] if "alert" in r}


def exact(doc: dict, alerts: set[str]) -> dict:
    """``doc`` with every alert not listed at an eval_time of a test expected not to fire then."""
    doc = {**doc, "rule_files": [str(PROM / "rules" / "*.yml")]}
    for test in doc["tests"]:
        listed: dict[str, set[str]] = {}
        for case in test["alert_rule_test"]:
            listed.setdefault(case["eval_time"], set()).add(case["alertname"])
        for at, names in listed.items():
            test["alert_rule_test"] += [{"eval_time": at, "alertname": a, "exp_alerts": []}
                                        for a in sorted(alerts - names)]
    return doc


def test_each_fault_scenario_fires_exactly_its_alerts(tmp_path):
    doc = yaml.safe_load(INCIDENTS.read_text())
    assert len(doc["tests"]) >= 2
    path = tmp_path / "incidents-exact.test.yml"
    path.write_text(yaml.safe_dump(exact(doc, shipped_alerts()), sort_keys=False))
    result = subprocess.run([require_binary("promtool", "prometheus"), "test", "rules", str(path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def test_exact_adds_the_unlisted_alerts():
    doc = {"rule_files": [], "tests": [{"alert_rule_test": [{"eval_time": "5m", "alertname": "A", "exp_alerts": []}]}]}
    cases = exact(doc, {"A", "B"})["tests"][0]["alert_rule_test"]
    assert cases[1] == {"eval_time": "5m", "alertname": "B", "exp_alerts": []}
