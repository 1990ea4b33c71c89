"""docs/upstream-versions.md, the table of exporter versions x names x units with the source of each
row, covers every name the upstream mapping files map, and says which names are inferred."""

from __future__ import annotations

import re

import pytest

from exporter.testing import load_mappings
from tests.conftest import REPO

DOC = REPO / "docs" / "upstream-versions.md"
SOURCES = REPO / "tests" / "upstream_versions" / "SOURCES.md"
FILES = ["upstream/dcgm-exporter", "upstream/amd-device-metrics-exporter", "upstream/xpumanager",
         "upstream/nvidia_gpu_exporter"]
_GROUP = re.compile(r"\(([^()]*\|[^()]*)\)")


def expand(token: str) -> set[str]:
    """`a_(b|c)_d` -> {a_b_d, a_c_d}, every group."""
    m = _GROUP.search(token)
    if m is None:
        return {token}
    out: set[str] = set()
    for alt in m[1].split("|"):
        out |= expand(token[:m.start()] + alt + token[m.end():])
    return out


def table_rows(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("| ") and not ln.startswith("|---")]


def documented_names(text: str) -> set[str]:
    names: set[str] = set()
    for row in table_rows(text):
        served = row.split(" | ")[1]  # the "served name" column
        for token in re.findall(r"`([^`]+)`", served):
            names |= {t.partition("{")[0] for t in expand(token)}
    return names


@pytest.mark.parametrize("mapping", FILES)
def test_every_mapped_upstream_name_is_in_the_version_table(mapping) -> None:
    cm = load_mappings().get(mapping)
    documented = documented_names(DOC.read_text())
    missing = sorted({raw.partition("{")[0] for raw in cm.rules} - documented)
    assert not missing, f"{mapping}: add rows to docs/upstream-versions.md for {missing}"


def test_every_row_has_a_version_and_a_source() -> None:
    rows = [r for r in table_rows(DOC.read_text()) if not r.startswith("| exporter version")]
    assert len(rows) >= 60
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert len(cells) == 6 and cells[0] and cells[5], row


def test_the_inferred_rows_are_named_the_same_in_the_table_the_summary_and_the_fixture_notes() -> None:
    text = DOC.read_text()
    inferred = set()
    for row in table_rows(text):
        if "**inferred**" in row:
            inferred |= {t for tok in re.findall(r"`([^`]+)`", row.split(" | ")[1]) for t in expand(tok)}
    summary = text[text.index("## Inferred rows"):]
    assert inferred == set(re.findall(r"`(DCGM_FI_[A-Z_]+)`", summary))
    assert len(inferred) == 7
    notes = SOURCES.read_text()
    spelled = set(re.findall(r"`(?:DCGM_FI_DEV_)?([A-Z_]+)`", notes))
    spelled |= {f"FB_{w}_BYTES" for w in ("USED", "FREE", "RESERVED") if "FB_{USED,FREE,RESERVED}_BYTES" in notes}
    for name in inferred:  # SOURCES.md names each, in full or without the DCGM_FI_DEV_ prefix
        assert name.removeprefix("DCGM_FI_DEV_") in spelled, name
