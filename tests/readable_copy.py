"""The exporter package, copied where any user can read it, for tests that run it as another uid.

A checkout may sit in a private folder (mode 0700: `mktemp -d`, root's home, a CI workspace),
where a process under uid 65534 or 61234 cannot read or even enter it; an installed wheel is
readable by all.  ``readable_copy()`` gives a 0755 folder holding ``exporter/`` and ``mappings/``
(the checkout layout, so the package finds its mappings) to put on ``sys.path`` / PYTHONPATH, and
``SYSTEM_PYTHON`` an interpreter any user can run (a venv's may sit under the same private folder;
the package needs only the standard library for what these tests run)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SYSTEM_PYTHON = next((p for p in (Path(f"/usr/bin/python3.{sys.version_info.minor}"), Path("/usr/bin/python3"))
                      if p.exists()), Path("/usr/bin/python3"))


@contextmanager
def readable_copy() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="ugx-pkg-"))
    try:
        ignore = shutil.ignore_patterns("__pycache__")
        shutil.copytree(REPO / "exporter", root / "exporter", ignore=ignore)
        shutil.copytree(REPO / "mappings", root / "mappings", ignore=ignore)
        for d, _, files in os.walk(root):
            os.chmod(d, 0o755)
            for f in files:
                os.chmod(os.path.join(d, f), 0o644)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
