"""Optional dcgm-exporter compatibility rules (deploy/prometheus/compat) and the migration guide
(docs/dcgm-migration.md)."""

from __future__ import annotations

import re
import subprocess

import yaml

from tests.conftest import REPO, require_binary
from tests.promql_names import load_canonical, metric_names

COMPAT = REPO / "deploy" / "prometheus" / "compat" / "dcgm-exporter.rules.yml"
TEST = REPO / "deploy" / "prometheus" / "tests" / "dcgm-compat.test.yml"
DOC = REPO / "docs" / "dcgm-migration.md"
# the list: what dashboards built for dcgm-exporter use most
REQUIRED = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP",
            "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_PROF_DRAM_ACTIVE",
            "DCGM_FI_PROF_SM_OCCUPANCY"}
RULES = [r for g in yaml.safe_load(COMPAT.read_text())["groups"] for r in g["rules"]]
DCGM_RECORDS = {r["record"] for r in RULES if r["record"].startswith("DCGM_FI_")}


def _promtool(*args):
    binary = require_binary("promtool", "prometheus")
    return subprocess.run([binary, *args], cwd=REPO / "deploy" / "prometheus", capture_output=True,
                          text=True, timeout=120)


def test_compat_rules_pass_promtool_lint_and_unit_tests():
    result = _promtool("check", "rules", "--lint=all", "--lint-fatal", str(COMPAT))
    assert result.returncode == 0, result.stdout + result.stderr
    result = _promtool("test", "rules", str(TEST.relative_to(REPO / "deploy" / "prometheus")))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_common_fields_are_recreated_and_each_is_unit_tested():
    assert REQUIRED <= DCGM_RECORDS
    tested = set()
    for group in yaml.safe_load(TEST.read_text())["tests"]:
        for case in group["promql_expr_test"]:
            tested |= metric_names(case["expr"])
    assert DCGM_RECORDS <= tested


def test_compat_rules_read_canonical_names_only():
    canonical = load_canonical(REPO / "mappings" / "canonical.yaml")
    for rule in RULES:
        names = metric_names(rule["expr"]) - {"dcgm_compat:gpu_info:labels"}
        assert names and names <= set(canonical), (rule["record"], names)


def test_compat_rules_are_not_loaded_by_default():
    """Optional: the Prometheus configs load rules/*.yml, not compat/."""
    for conf in (REPO / "deploy" / "prometheus").glob("prometheus*.yml"):
        assert "compat" not in conf.read_text(), conf.name


def test_migration_guide_lists_every_compat_rule_and_the_unit_changes():
    text = DOC.read_text()
    for name in DCGM_RECORDS:
        assert f"`{name}`" in text, name
    for fact in ("x100", "MiB x 1048576", "mJ / 1000", "MEM_COPY_UTIL", "gpu_xid_errors_total"):
        assert fact in text, fact
    table = [ln for ln in text.splitlines() if re.match(r"\| `DCGM_FI_", ln)]
    assert len(table) >= 25


# dcgm-exporter 4.9 (DCGM 4.7) renamed the defaults, with base units (issue #25)
REQUIRED_49 = {"DCGM_FI_DEV_GPU_UTIL_RATIO", "DCGM_FI_DEV_FB_USED_BYTES", "DCGM_FI_DEV_FB_FREE_BYTES",
               "DCGM_FI_DEV_GPU_TEMP_CELSIUS", "DCGM_FI_DEV_BOARD_POWER_WATTS", "DCGM_FI_DEV_SM_CLOCK_HERTZ",
               "DCGM_FI_PROF_DRAM_UTIL_RATIO", "DCGM_FI_PROF_SM_OCCUPANCY_RATIO"}


def test_the_4_9_names_are_recreated_with_their_units_and_hostname_label():
    assert REQUIRED_49 <= DCGM_RECORDS
    by_name = {r["record"]: r["expr"] for r in RULES}
    for name in REQUIRED_49:
        assert "hostname)" in by_name[name] and "Hostname" not in by_name[name], name
    assert "/ 100" in by_name["DCGM_FI_DEV_GPU_UTIL_RATIO"]        # % -> 0-1
    assert "* 1000000" in by_name["DCGM_FI_DEV_SM_CLOCK_HERTZ"]     # MHz -> Hz
    assert "1048576" not in by_name["DCGM_FI_DEV_FB_USED_BYTES"]    # bytes as they are


def test_migration_guide_says_which_release_each_name_comes_from():
    text = DOC.read_text()
    for fact in ("4.8.3, 4.8.4 (DCGM 4.6)", "4.9.0 (DCGM 4.7)", "4.10.0 (DCGM 4.8)", "**ratio**",
                 "upstream_schema_info", "upstream_unknown_fields", "profiling_unavailable",
                 "gpu_profiling_available"):
        assert fact in text, fact
    for name in REQUIRED_49:
        assert re.search(rf"^\| `{name}` \(", text, re.MULTILINE), name
