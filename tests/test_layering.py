"""The import graph keeps its direction: the vocabulary at the bottom, sources upstream of
everything that consumes their readings, no consumer reaching back into ``exporter.sources``."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "exporter"

# modules downstream of the sources: they speak exporter.model, never exporter.sources
DOWNSTREAM = ["mapping.py", "mapper.py", "store.py", "schema.py", "exposition.py", "textformat.py", "series_lines.py",
              "indicator_feed.py", "indicators", "enrich"]
# what no source may import: the canonical side of the pipeline
NOT_FROM_SOURCES = ("schema", "mapping", "mapper", "config", "indicators", "indicator_feed")


def _modules(rel: str) -> list[Path]:
    p = PKG / rel
    return sorted(p.rglob("*.py")) if p.is_dir() else [p]


def _imports(path: Path, root: Path = PKG.parent) -> set[str]:
    """Absolute names of the exporter modules ``path`` imports (relative imports resolved)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return {m for m in out if m.startswith("exporter")}


def test_model_is_at_the_bottom():
    assert _imports(PKG / "model.py") == set()


def test_nothing_downstream_imports_the_sources():
    bad = {str(p.relative_to(PKG)): sorted(m for m in _imports(p) if m.startswith("exporter.sources"))
           for rel in DOWNSTREAM for p in _modules(rel)}
    assert {k: v for k, v in bad.items() if v} == {}


def test_no_source_imports_the_canonical_side():
    bad = {}
    for p in _modules("sources"):
        hits = sorted(m for m in _imports(p)
                      if any(m == f"exporter.{n}" or m.startswith(f"exporter.{n}.") for n in NOT_FROM_SOURCES))
        if hits:
            bad[str(p.relative_to(PKG))] = hits
    assert bad == {}


def test_the_checks_see_a_violation(tmp_path):
    """The import reader resolves relative imports (the checks above can fail)."""
    probe = tmp_path / "exporter" / "sources" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("from ..schema import Schema\nfrom . import base\nimport exporter.config\n", encoding="utf-8")
    got = _imports(probe, tmp_path)
    assert {"exporter.schema", "exporter.schema.Schema", "exporter.sources.base", "exporter.config"} <= got
