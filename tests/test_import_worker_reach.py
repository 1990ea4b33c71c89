"""`import` run as root from a checkout in a private folder (issue 38).

The worker runs under a uid of its own (exporter/importers/spawn.py).  From a checkout under a
0700 folder (root's home, `mktemp -d`, a CI clone) that uid could neither execute the venv's
`.venv/bin/python` nor import the package by its path, so every run warned "the import worker
could not start: Permission denied .venv/bin/python" and parsed as uid 0.  Now the package goes
to the worker as a directory fd and the worker runs the interpreter the venv's python links to;
where no other uid can reach any interpreter, the uid-0 fallback says which folder is in the way
and what to do.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from exporter.importers import isolate, spawn
from exporter.importers.isolate import Importer
from tests.readable_copy import REPO, SYSTEM_PYTHON

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the worker switches users only as root")
NSYS = "nsys-2026.1.1-schema3.24.14-torch-tiny.sqlite"  # an SQLite copy in a private folder too


@pytest.fixture
def base():
    """A folder every user may pass through (tmp_path sits under a 0700 folder itself)."""
    path = Path(tempfile.mkdtemp(prefix="ugx-reach-"))
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _private_checkout(tmp_path: Path, monkeypatch, python: Path) -> Path:
    """``<0700 folder>/checkout`` holding the package (modes as git leaves them: 0755/0644) and
    ``.venv/bin/python``, a symlink to ``python`` as `python3 -m venv` makes it; this process
    then looks as if it ran from there."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    checkout = private / "checkout"
    shutil.copytree(REPO / "exporter", checkout / "exporter", ignore=shutil.ignore_patterns("__pycache__"))
    for d, _, files in os.walk(checkout):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)
    (checkout / ".venv" / "bin").mkdir(parents=True)
    venv_python = checkout / ".venv" / "bin" / "python"
    venv_python.symlink_to(python)
    monkeypatch.setattr(sys, "executable", str(venv_python))
    monkeypatch.setattr(sys, "_base_executable", str(venv_python), raising=False)
    monkeypatch.setattr(isolate, "_PACKAGE_ROOT", str(checkout))
    return private


@pytest.mark.skipif(spawn.blocked(str(SYSTEM_PYTHON)) != "", reason=f"{SYSTEM_PYTHON} is out of other users' reach")
def test_a_checkout_in_a_private_folder_still_gets_a_worker_under_a_uid_of_its_own(tmp_path, monkeypatch,
                                                                                  shared_fixtures):
    private = _private_checkout(tmp_path, monkeypatch, SYSTEM_PYTHON)
    imp = Importer()
    assert imp.python == os.path.realpath(SYSTEM_PYTHON)  # what .venv/bin/python links to
    assert imp.probe() == []  # no "could not start", no uid-0 fallback
    assert imp.creds["user"] in spawn.OWN_UIDS
    out = imp.file(shared_fixtures / "profilers" / NSYS)
    assert [d.uuid for d in out.devices] == ["GPU-554a6988-03dd-6206-3dd1-f43fb60a3ed0"]
    assert out.sample.readings
    assert not spawn.blocked(imp.python) and spawn.blocked(str(private / "checkout" / "exporter"))


def test_no_interpreter_within_reach_falls_back_to_uid0_and_says_what_to_do(base, monkeypatch, shared_fixtures):
    """A Python installed inside the private folder (pyenv under /root, a venv made with
    --copies): no other uid can run it.  The worker runs as uid 0 without capabilities (the
    documented fallback: docs/hardening.md "The import worker") and the one warning names the
    folder in the way and the remedy, not a bare "Permission denied"."""
    inside = base / "private-python"
    inside.mkdir(mode=0o700)
    copied = inside / "python3"
    shutil.copy2(os.path.realpath(SYSTEM_PYTHON), copied)
    _private_checkout(base, monkeypatch, copied)
    imp = Importer()
    [warning] = imp.probe()
    assert imp.creds == {}
    assert f"{inside} (mode 0700) lets no other user through" in warning, warning
    assert "a venv made from /usr/bin/python3" in warning and "non-root user" in warning, warning
    assert "Permission denied" not in warning, warning
    out = imp.file(shared_fixtures / "profilers" / NSYS)  # and the import still works
    assert out.sample.readings


def test_blocked_names_the_first_folder_in_the_way(base):
    outer = base / "a"
    (outer / "b").mkdir(parents=True)
    tool = outer / "b" / "tool"
    tool.write_text("")
    os.chmod(outer, 0o751)
    os.chmod(outer / "b", 0o750)
    os.chmod(tool, 0o755)
    assert spawn.blocked(str(tool)).startswith(f"{outer / 'b'} (mode 0750)")
    os.chmod(outer / "b", 0o755)
    os.chmod(tool, 0o754)
    assert spawn.blocked(str(tool)) == f"{tool} (mode 0754) is not executable by others"
    link = outer / "link"
    link.symlink_to(tool)
    os.chmod(tool, 0o755)
    assert spawn.blocked(str(link)) == ""
    os.chmod(outer / "b", 0o700)  # the link's folder is open, the file it points to is not
    assert spawn.blocked(str(link)).startswith(f"{outer / 'b'} (mode 0700)")
