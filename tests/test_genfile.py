"""scripts/genfile.py: the write-or-check tail every generator in scripts/ shares."""

from __future__ import annotations

import importlib.util
import re

from tests.conftest import REPO

SCRIPTS = REPO / "scripts"


def _genfile():
    spec = importlib.util.spec_from_file_location("genfile", SCRIPTS / "genfile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_check_names_each_stale_or_missing_file_and_writes_nothing(tmp_path, capsys):
    gen = _genfile()
    ok, stale, missing = tmp_path / "ok.yml", tmp_path / "stale.yml", tmp_path / "missing.yml"
    ok.write_text("a\n")
    stale.write_text("old\n")
    outputs = {ok: "a\n", stale: "new\n", missing: "m\n"}
    assert gen.write_or_check(outputs, check=True, stale="{path} is out of date: run it") == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [f"{stale} is out of date: run it", f"{missing} is out of date: run it"]
    assert stale.read_text() == "old\n" and not missing.exists()
    assert gen.write_or_check({ok: "a\n"}, check=True, stale="{path}") == 0
    assert capsys.readouterr().err == ""


def test_write_writes_only_what_changed_and_says_so(tmp_path, capsys):
    gen = _genfile()
    ok, stale, missing = tmp_path / "ok.yml", tmp_path / "stale.yml", tmp_path / "missing.yml"
    ok.write_text("a\n")
    stale.write_text("old\n")
    before = ok.stat().st_mtime_ns
    assert gen.write_or_check({ok: "a\n", stale: "new\n", missing: "m\n"}, wrote="wrote {path}") == 0
    assert capsys.readouterr().out.splitlines() == [f"wrote {stale}", f"wrote {missing}"]
    assert (stale.read_text(), missing.read_text(), ok.stat().st_mtime_ns) == ("new\n", "m\n", before)


def test_rel_is_relative_to_the_repository():
    gen = _genfile()
    assert str(gen._rel(REPO / "deploy" / "x.yml")) == "deploy/x.yml"
    assert gen._rel(REPO.parent / "elsewhere") == REPO.parent / "elsewhere"


def test_every_generator_writes_through_the_shared_tail():
    """No generator keeps its own copy of the write/check tail."""
    generators = sorted(SCRIPTS.glob("gen-*.py"))
    assert len(generators) >= 4
    for path in generators:
        text = path.read_text()
        assert "from genfile import write_or_check" in text and "write_or_check(" in text.split("def main", 1)[1], path
        assert not re.search(r"\.write_text\(", text), f"{path.name} writes a file itself: use write_or_check"
