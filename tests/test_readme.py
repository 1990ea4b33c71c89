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


# ------------------------------------------------------------------------------ the flags table

def _flag_rows() -> list[tuple[list[str], list[str], str]]:
    """(flags, defaults, remark) of each row of the README's flags table."""
    text = (REPO / "README.md").read_text()
    table = re.search(r"## Flags\n.*?\n\| flag \| default \| \|\n\|---\|---\|---\|\n(.*?)\n\n", text, re.S)
    assert table, "README lost its flags table"
    rows = []
    for line in table.group(1).splitlines():
        flag, default, remark = (c.strip() for c in line.strip("|").split("|", 2))
        rows.append((re.findall(r"`(--[^`=\[]+)", flag), re.findall(r"`([^`]*)`", default), remark))
    return rows


def test_readme_flag_defaults_are_the_parsers():
    """Each default the flags table claims is the flag's default, or the one its --help names."""
    from exporter.run.argparsing import build_parser

    actions = {o: a for a in build_parser()._actions for o in a.option_strings}
    checked = 0
    for flags, defaults, _ in _flag_rows():
        assert all(f in actions or f.startswith(("--collector.", "--no-collector.")) for f in flags), flags
        if not defaults:
            continue
        assert len(defaults) == len(flags), (flags, defaults)
        for flag, default in zip(flags, defaults, strict=True):
            action = actions[flag]
            value = action.const if action.nargs == "?" else action.default
            assert str(value) == default or f"default {default}" in (action.help or ""), (flag, default)
            checked += 1
    assert checked >= 10


def test_readme_collector_defaults_are_the_registrys():
    from exporter.sources.registry import COLLECTORS

    (remark,) = [r for flags, _, r in _flag_rows() if "--collector.<name>" in flags]
    on = re.search(r"`([a-z ]+)` on by default", remark)
    off = re.search(r"`([a-z ]+)` off by default", remark)
    assert on and off, remark
    hardware = {n: c for n, c in COLLECTORS.items() if n != "simulator"}  # --simulate, its own flag
    assert sorted(on.group(1).split()) == sorted(n for n, c in hardware.items() if c.default)
    assert sorted(off.group(1).split()) == sorted(n for n, c in hardware.items() if not c.default)


# ------------------------------------------------------------------------------ the /metrics sample

_SERIES = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$')


def _series(line: str) -> tuple[str, dict[str, str]]:
    m = _SERIES.match(line)
    assert m, line
    return m["name"], dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m["labels"] or ""))


def test_readme_metrics_sample_is_what_the_demo_serves():
    """Each line of the README's sample: a series of that name with those label names is in the
    demo's exposition in the phase the README names, and every label value but the host-derived
    uuid and serial is the same."""
    import subprocess
    import sys

    text = (REPO / "README.md").read_text()
    m = re.search(r"What a scrape returns \(.*?`--simulate\.phase\s+(\w+)`.*?```\n(.*?)```", text, re.S)
    assert m, "README lost its /metrics sample"
    phase = m.group(1)
    out = subprocess.run([sys.executable, "-m", "exporter", "--simulate", "--simulate.phase", phase, "--once"],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    live = [_series(line) for line in out.stdout.splitlines() if line and not line.startswith("#")]
    sample = [_series(line) for line in m.group(2).splitlines() if line.strip()]
    assert len(sample) >= 5
    for name, labels in sample:
        fixed = {k: v for k, v in labels.items() if k not in ("uuid", "serial")}
        hits = [lv for n, lv in live if n == name and set(lv) == set(labels)
                and all(lv[k] == v for k, v in fixed.items())]
        assert hits, (name, labels)
