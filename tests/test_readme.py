"""The README's configuration example is a valid configuration (it is what users copy)."""

from __future__ import annotations

import re
from pathlib import Path

from exporter.run.daemon import Daemon, Settings

REPO = Path(__file__).resolve().parent.parent


def test_readme_config_example_validates(tmp_path):
    text = (REPO / "README.md").read_text()
    m = re.search(r"## Configuration\n\n```yaml\n(.*?)```", text, re.S)
    assert m, "README lost its configuration example"
    cfg = tmp_path / "config.yaml"
    cfg.write_text(m.group(1))
    daemon = Daemon(Settings(config_path=cfg))
    daemon.load()  # raises ConfigError naming file, line and field when invalid
    assert daemon.config.collector("nvml").options_dict()["processes"] == "series"
    assert daemon.config.indicators.contention.bandwidth_utilization_percent == 85


def test_readme_names_the_two_commands():
    text = (REPO / "README.md").read_text()
    assert "make run" in text and "make test" in text


# ------------------------------------------------------------------- the user's path through it

def _gen_alert_docs():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_alert_docs", REPO / "scripts" / "gen-alert-docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_alert_table_is_generated_from_the_rules_and_current():
    import yaml

    gen = _gen_alert_docs()
    text = (REPO / "README.md").read_text()
    assert gen.render(text) == text, "README alert table drifted: run scripts/gen-alert-docs.py (make docs)"
    block = text[text.index(gen.BEGIN):text.index(gen.END)]
    alerts = [r["alert"] for p in sorted((REPO / "deploy/prometheus/rules").glob("*.yml"))
              for g in yaml.safe_load(p.read_text())["groups"] for r in g["rules"] if "alert" in r]
    assert sorted(re.findall(r"^\| \[(\w+)\]", block, re.M)) == sorted(alerts)


def test_profiles_keep_every_critical_alert_alive_and_the_table_names_what_each_loses():
    """Computed from the rule files: the inputs each alert reads (through recording rules) that a
    profile does not serve.  A critical alert (a page) must keep all of its inputs everywhere."""
    gen = _gen_alert_docs()
    rules = gen.rules()
    records = {r["record"]: r["expr"] for r in rules if "record" in r}
    by_name = {r["alert"]: r for r in rules if "alert" in r and r["labels"]["severity"] == "critical"}
    assert gen.exporter_inputs(by_name["GPUMemoryContentionFraction"]["expr"], records) == \
        {"gpu_memory_contention_seconds_total"}
    for profile in gen.PROFILES:
        lost = {n: gen.dropped_inputs(r["expr"], records, profile) for n, r in by_name.items()}
        assert {n: d for n, d in lost.items() if d} == {}, profile
    contention = next(r for r in rules if r.get("alert") == "GPUMemoryContention")
    assert "gpu_memory_state" in gen.dropped_inputs(contention["expr"], records, "minimal")


def test_readme_scrape_config_is_valid_and_relabels_node(tmp_path):
    import shutil
    import subprocess

    from tests.conftest import require_binary

    promtool = require_binary("promtool", "prometheus")
    text = (REPO / "README.md").read_text()
    m = re.search(r"## Point Prometheus at it\n\n```yaml\n(.*?)```", text, re.S)
    assert m and "target_label: node" in m.group(1)
    prom = tmp_path / "prometheus"
    shutil.copytree(REPO / "deploy" / "prometheus", prom)
    (prom / "readme.yml").write_text(m.group(1))
    result = subprocess.run([promtool, "check", "config", "readme.yml"], cwd=prom, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_readme_joins_gpu_info_on_instance():
    text = (REPO / "README.md").read_text()
    joins = re.findall(r"group_left \(model\) gpu_info", text)
    assert joins and "on (vendor, gpu, uuid) group_left" not in text
