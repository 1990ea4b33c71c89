"""Issue 38: a release a platform team can install. ``scripts/make-dist.py`` (``make dist``) builds
the wheel, the sdist, the image build context, the pinned constraints and SHA256SUMS; a fresh venv
installs the wheel and serves ``--simulate --once``; the CHANGELOG has this release; the version
is named once (plus the one kustomize tag a test ties to it).

No package index is contacted: the build runs without isolation (the venv's pinned setuptools)
and the fresh venv gets the wheel with --no-deps, its dependencies from this venv's
site-packages through a .pth line (a .pth inside that folder, such as the editable install of
the checkout, is not processed, so the wheel's own package is what runs). The SBOM step installs
from the index and is skipped here (--no-sbom); docs/releasing.md says how it is checked."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

import exporter
from tests.conftest import REPO

CI = os.environ.get("CI") == "true"


def _need_build() -> None:
    if importlib.util.find_spec("build") is None:
        if CI:
            pytest.fail("the release extra (build) is missing under CI=true: make install")
        pytest.skip("python -m build not installed (make install installs the release extra)")


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    _need_build()
    out = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "PIP_NO_INDEX": "1"}
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "make-dist.py"), "--out", str(out), "--no-sbom"],
                         capture_output=True, text=True, timeout=900, env=env, cwd=REPO)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return out


def test_dist_has_every_artefact_and_their_sums(dist):
    v = exporter.__version__
    names = {p.name for p in dist.iterdir()}
    assert {f"unified_gpu_exporter-{v}-py3-none-any.whl", f"unified_gpu_exporter-{v}.tar.gz",
            f"unified-gpu-exporter-{v}-image-context.tar.gz", f"unified-gpu-exporter-{v}-constraints.txt",
            "SHA256SUMS"} <= names
    sums = dict(reversed(line.split("  ")) for line in (dist / "SHA256SUMS").read_text().splitlines())
    assert set(sums) == names - {"SHA256SUMS"}
    for name, digest in sums.items():
        assert hashlib.sha256((dist / name).read_bytes()).hexdigest() == digest, name
    assert (dist / f"unified-gpu-exporter-{v}-constraints.txt").read_text() == (REPO / "constraints.txt").read_text()


def test_the_wheel_carries_the_mappings_and_no_tests(dist):
    (whl,) = dist.glob("*.whl")
    names = zipfile.ZipFile(whl).namelist()
    assert "exporter/mappings/canonical.yaml" in names
    assert "exporter/mappings/upstream/dcgm-exporter.yaml" in names
    assert not [n for n in names if n.startswith("tests/")]


def test_the_image_context_is_what_the_dockerfile_copies(dist):
    (ctx,) = dist.glob("*-image-context.tar.gz")
    with tarfile.open(ctx) as tar:
        members = tar.getmembers()
    names = {m.name for m in members}
    assert {"Dockerfile", "pyproject.toml", "README.md", "LICENSE", "constraints.txt",
            "exporter/__init__.py", "mappings/canonical.yaml"} <= names
    assert not [n for n in names if n.startswith(("tests/", "deploy/", ".venv", "dist/"))]
    assert {m.uid for m in members} == {0} and len({m.mtime for m in members}) == 1


def test_a_fresh_venv_installs_the_wheel_and_serves_simulate_once(dist, tmp_path):
    (whl,) = dist.glob("*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    purelib = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    res = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet", "--no-deps",
                          "--no-index", str(whl)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    # then the dependencies, already installed and pinned here, without an index (only after the
    # install: pip would otherwise see this checkout's editable install there and uninstall it)
    (purelib / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    where = subprocess.run([str(py), "-c", "import exporter; print(exporter.__file__)"],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert where.stdout.strip().startswith(str(venv)), where.stdout + where.stderr  # the wheel's copy
    script = venv / "bin" / "unified-gpu-exporter"
    assert script.read_text().startswith(f"#!{py}"), script.read_text()[:200]  # the new venv's python
    out = subprocess.run([str(script), "--simulate", "--once"], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r'^gpu_compute_utilization_percent\{.*vendor="nvidia"', out.stdout, re.M), out.stdout[:2000]
    assert f'version="{exporter.__version__}"' in out.stdout


def test_the_changelog_has_this_release():
    text = (REPO / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[?{re.escape(exporter.__version__)}\]?", text, re.M), "CHANGELOG.md: no section for this version"
    assert "## [Unreleased]" in text
    releasing = (REPO / "docs" / "releasing.md").read_text()
    for must in ("Semantic Versioning", "schema", "deprecat", "make dist", "SHA256SUMS", "SBOM", "sign"):
        assert must.lower() in releasing.lower(), must
