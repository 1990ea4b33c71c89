"""Job names and runbook links from one user-set place (issue 39): deploy/prometheus/rules-settings.yml
and scripts/gen-rules.py.  The defaults match every scrape configuration the repository ships;
rules rendered for other job names page for a dead exporter under those names (promtool, two
names), while the shipped rules, which do not know them, stay silent; runbook links need no
external label."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO, require_binary

PROM = REPO / "deploy" / "prometheus"
GEN = REPO / "scripts" / "gen-rules.py"
SETTINGS = yaml.safe_load((PROM / "rules-settings.yml").read_text())


def _gen(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(GEN), *args], capture_output=True, text=True, timeout=120)


def _job_names(path) -> list[str]:
    return [j["job_name"] for j in yaml.safe_load(path.read_text())["scrape_configs"]]


def test_default_selectors_match_every_shipped_scrape_configuration():
    exporter, node = set(), set()
    for path in [*PROM.glob("prometheus*.yml"), REPO / "deploy/fleet/prometheus-agent.yml",
                 REPO / "deploy/fleet/vmagent-edge.yml"]:
        for job in _job_names(path):
            (exporter if "gpu-exporter" in job else node if "node" in job else set()).add(job)
    # prometheus-operator: a ServiceMonitor's job is its Service's name, a PodMonitor's <namespace>/<name>
    svc = yaml.safe_load((REPO / "deploy/kubernetes/base/service.yaml").read_text())["metadata"]["name"]
    pm = yaml.safe_load((REPO / "deploy/kubernetes/components/podmonitor/podmonitor.yaml").read_text())["metadata"]
    exporter |= {svc, f"{pm['namespace']}/{pm['name']}"}
    assert exporter and node
    assert [j for j in sorted(exporter) if not re.fullmatch(SETTINGS["exporter_job"], j)] == []
    assert [j for j in sorted(node) if not re.fullmatch(SETTINGS["node_job"], j)] == []
    assert not re.fullmatch(SETTINGS["exporter_job"], "gpu-exporter")  # why the setting exists


def test_shipped_rules_follow_the_shipped_settings():
    result = _gen("--check")
    assert result.returncode == 0, result.stderr


def _absence_test_for(job: str, rules_dir, tmp_path):
    """absence.test.yml with the exporter's job renamed in its input and expectations."""
    text = (PROM / "tests" / "absence.test.yml").read_text()
    text = text.replace('job="unified-gpu-exporter"', f'job="{job}"').replace(
        "job: unified-gpu-exporter", f"job: {job}").replace('job="gpu-monitoring/unified-gpu-exporter"',
                                                              f'job="gpu-monitoring/{job}"')
    doc = yaml.safe_load(text)
    doc["rule_files"] = [str(rules_dir / "unified-gpu-exporter.absence.yml")]
    path = tmp_path / f"absence-{job}.test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return subprocess.run([require_binary("promtool", "prometheus"), "test", "rules", str(path)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("job", ["gpu-exporter", "dcgm"])
def test_rules_rendered_for_another_job_name_page_for_a_dead_exporter(job, tmp_path):
    settings = tmp_path / "settings.yml"
    settings.write_text(f"exporter_job: '(.*/)?{job}'\n")
    out = tmp_path / "rules"
    result = _gen("--settings", str(settings), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert f'up{{job=~"(.*/)?{job}"}}' in (out / "unified-gpu-exporter.absence.yml").read_text()
    passed = _absence_test_for(job, out, tmp_path)
    assert passed.returncode == 0, passed.stdout[-4000:] + passed.stderr
    # the shipped rules do not know the name: the same test fails (no GPUExporterDown)
    silent = _absence_test_for(job, PROM / "rules", tmp_path)
    assert silent.returncode != 0 and "alertname: GPUExporterDown" in silent.stdout + silent.stderr


def test_runbook_links_are_rendered_from_the_setting_without_external_labels(tmp_path):
    settings = tmp_path / "settings.yml"
    base = "https://git.example.com/ops/gpu/blob/main/runbooks.md"
    settings.write_text(f"runbook_base: {base}\n")
    out = tmp_path / "rules"
    assert _gen("--settings", str(settings), "--out", str(out)).returncode == 0
    alerts = [r for p in out.glob("*.yml") for g in yaml.safe_load(p.read_text())["groups"] for r in g["rules"]
              if "alert" in r]
    assert alerts and all(a["annotations"]["runbook_url"] == f"{base}#{a['alert'].lower()}" for a in alerts)
    shipped = [r for p in (PROM / "rules").glob("*.yml") for g in yaml.safe_load(p.read_text())["groups"]
               for r in g["rules"] if "alert" in r]
    assert all("$externalLabels" not in a["annotations"]["runbook_url"] for a in shipped)


@pytest.mark.parametrize("text,error", [
    ("exporter_jobs: x\n", "unknown setting"),
    ("exporter_job: 'a\"b'\n", "without quotes"),
    ("node_job: '(unclosed'\n", "not a regular expression"),
    ("runbook_base: 'has space'\n", "runbook base"),
])
def test_a_bad_setting_is_a_clear_error(text, error, tmp_path):
    settings = tmp_path / "settings.yml"
    settings.write_text(text)
    result = _gen("--settings", str(settings), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and error in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()
