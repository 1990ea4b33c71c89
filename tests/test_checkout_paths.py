"""Running from a checkout: its own mappings/ win over an installed copy (a second checkout that
shares an editable venv reads its own files), and `make docs` regenerates without installing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from tests.conftest import REPO, require_binary


def test_a_second_checkout_sharing_the_venv_reads_its_own_mappings(tmp_path):
    """The venv's editable install maps ``exporter.mappings`` to the checkout it was installed
    from; a second checkout run with that venv must still read the mapping files beside its own
    ``exporter/``."""
    second = tmp_path / "second"
    second.mkdir()
    shutil.copytree(REPO / "exporter", second / "exporter", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "mappings", second / "mappings")
    shutil.copy(REPO / "pyproject.toml", second)
    canonical = second / "mappings" / "canonical.yaml"
    canonical.write_text(canonical.read_text().replace(
        "help: Fan speed in revolutions per minute.", "help: Fan speed, second checkout."))
    code = ("import exporter; from exporter.map.schema import default_mappings_dir, load_schema; "
            "print(exporter.__file__); print(default_mappings_dir()); "
            "print(load_schema().metrics['gpu_fan_speed_rpm'].help)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=second, capture_output=True, text=True,
                         env=env, timeout=60, check=True).stdout.splitlines()
    assert out[0] == str(second / "exporter" / "__init__.py"), out  # the second checkout's package
    assert out[1:] == [str(second / "mappings"), "Fan speed, second checkout."], out


def test_make_docs_installs_nothing():
    """`make docs` runs the generators with the venv's Python (or $(PYTHON) without one); it
    neither creates the venv nor reinstalls the package when pyproject.toml is newer."""
    make = require_binary("make", "make")
    for venv in (".venv", str(REPO / "build" / "no-such-venv")):
        out = subprocess.run([make, "-n", "-s", "-W", "pyproject.toml", "docs", f"VENV={venv}"], cwd=REPO,
                             capture_output=True, text=True, timeout=60, check=True).stdout
        assert "pip" not in out and "-m venv" not in out and ".installed" not in out, out
        assert "-m exporter.docs" in out and "-m exporter.otlp.docs" in out and "gen-alert-docs.py" in out, out
