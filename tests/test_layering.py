"""The import graph keeps its direction: the vocabulary at the bottom, sources upstream of
everything that consumes their readings, no consumer reaching back into ``exporter.sources``,
and no circle anywhere.

Every import counts: module level, inside functions (loaded later, still a dependency) and under
``if TYPE_CHECKING:`` (a circle for the reader and the type checker).  ``import_graph()`` is the
graph the rules below read.  The folders say the flow (docs/architecture.md): the rules below also
keep at most a dozen modules at the package root, no module over 400 lines, and one render path.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "exporter"

# modules downstream of the sources: they speak exporter.model, never exporter.sources
DOWNSTREAM = ["map", "indicators", "render", "serve", "enrich"]
# what no source may import: the canonical side of the pipeline, the daemon that runs them, and the
# profiler parsers (the profiles source lives beside them, in importers/)
NOT_FROM_SOURCES = ("map", "config", "indicators", "render", "serve", "run", "importers")


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


def module_name(path: Path, root: Path = PKG.parent) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(pkg: Path = PKG) -> dict[str, set[str]]:
    """Module -> the exporter modules it imports (``from .x import name`` is an edge to ``x``, or
    to ``x.name`` where that is a module; a package's ``__init__`` is the package's node)."""
    root = pkg.parent
    paths = {module_name(p, root): p for p in sorted(pkg.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        edges = set()
        for target in _imports(path, root):
            while target and target not in paths:  # exporter.x.Name -> exporter.x
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 50  # the walk found the package
    circles = {" <-> ".join(c): {m: sorted(graph[m] & set(c)) for m in c} for c in cycles(graph)}
    assert circles == {}


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Which folder of exporter/ imports which other folder (the root's modules aside: they are
    the shared vocabulary and the entry points, imported by and importing every folder)."""
    def folder(module: str) -> str | None:
        parts = module.split(".")
        if len(parts) > 2:
            return parts[1]
        return parts[1] if len(parts) == 2 and any(m.startswith(module + ".") for m in graph) else None

    out: dict[str, set[str]] = {}
    for a, targets in graph.items():
        for b in targets:
            fa, fb = folder(a), folder(b)
            if fa and fb and fa != fb:
                out.setdefault(fa, set()).add(fb)
    return out


def test_no_cycle_between_folders():
    """The folders say the flow (run -> sources/map -> indicators -> render -> serve, with enrich,
    importers, simulate and otlp beside it): no folder imports one that imports it back."""
    folders = folder_graph(import_graph())
    seen = set(folders) | {f for targets in folders.values() for f in targets}
    assert {"run", "map", "indicators", "render", "serve", "sources"} <= seen
    assert cycles(folders) == []


def test_the_folder_check_sees_a_back_edge(tmp_path):
    pkg = tmp_path / "exporter"
    for sub in ("run", "render"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("", encoding="utf-8")
    (pkg / "__init__.py").write_text("", encoding="utf-8")
    (pkg / "run" / "daemon.py").write_text("from ..render import exposition\n", encoding="utf-8")
    (pkg / "render" / "exposition.py").write_text("from ..run import cpustats\n", encoding="utf-8")
    (pkg / "run" / "cpustats.py").write_text("", encoding="utf-8")
    assert cycles(folder_graph(import_graph(pkg))) == [["render", "run"]]


def test_the_cycle_check_sees_a_circle(tmp_path):
    """Through a TYPE_CHECKING import and a relative import from a package's __init__."""
    pkg = tmp_path / "exporter"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("", encoding="utf-8")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n",
                              encoding="utf-8")
    (pkg / "b.py").write_text("from .sub import helper\n", encoding="utf-8")
    (pkg / "sub" / "__init__.py").write_text("from ..a import A\n", encoding="utf-8")
    (pkg / "c.py").write_text("from . import a\n", encoding="utf-8")  # on the circle's edge only
    assert cycles(import_graph(pkg)) == [["exporter.a", "exporter.b", "exporter.sub"]]


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


# the folders that say the flow (docs/architecture.md): run -> sources -> map -> indicators ->
# render -> serve, with enrich, importers and simulate beside them
ROOT_MODULES_MAX = 12
LINES_MAX = 400


def _package_modules() -> list[Path]:
    return [p for p in sorted(PKG.rglob("*.py")) if not p.name.endswith("_pb2.py")]  # generated (grpcio-tools)


def test_at_most_a_dozen_modules_at_the_root():
    root = sorted(p.name for p in PKG.glob("*.py"))
    assert len(root) <= ROOT_MODULES_MAX, root


def test_no_module_over_400_lines():
    long = {str(p.relative_to(PKG)): n for p in _package_modules()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > LINES_MAX}
    assert long == {}


def test_one_render_path():
    """Exposition text is written in one module (render/textformat.py, ``write``), for /metrics, the
    import command and the bench alike; the older second path (``Renderer.build``) is gone."""
    from exporter.render.exposition import Renderer

    writers = {str(p.relative_to(PKG)) for p in _package_modules()
               if "# HELP " in p.read_text(encoding="utf-8")}
    assert writers == {"render/textformat.py"}
    assert not hasattr(Renderer, "build")
