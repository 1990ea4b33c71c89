#!/usr/bin/env python3
"""make dist: the release artefacts of the checkout's version, in one folder (docs/releasing.md).

    unified_gpu_exporter-<v>-py3-none-any.whl     the wheel (PyPA build, setuptools pinned)
    unified_gpu_exporter-<v>.tar.gz               the sdist
    unified-gpu-exporter-<v>-image-context.tar.gz the image build context: the Dockerfile and
                                                  exactly what it COPYs (docker build - < it)
    unified-gpu-exporter-<v>-constraints.txt      the pinned versions the wheel was tested with
    unified-gpu-exporter-<v>.cdx.json             CycloneDX SBOM of a wheel install ([nvidia],
                                                  with those constraints) in a fresh venv
    SHA256SUMS                                    sha256 of each of the above

Reproducible where the tools allow: the context tarball has sorted names, owner 0, mode from git's
view (0644 / 0755) and SOURCE_DATE_EPOCH (default: the last commit's time) as every mtime; build
honours SOURCE_DATE_EPOCH for the wheel's and sdist's timestamps.  Runs tools from the current
interpreter's venv (make dist installs the `release` extra there); only the SBOM's fresh venv
talks to the package index (pip), and --no-sbom skips it.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NAME = "unified-gpu-exporter"


def version() -> str:
    m = re.search(r'^__version__ = "([^"]+)"', (REPO / "exporter" / "__init__.py").read_text(), re.M)
    assert m, "exporter/__init__.py has no __version__"
    return m[1]


def source_date_epoch() -> int:
    if os.environ.get("SOURCE_DATE_EPOCH"):
        return int(os.environ["SOURCE_DATE_EPOCH"])
    out = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%ct"], capture_output=True, text=True)
    return int(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else 0


def context_files() -> list[str]:
    """The Dockerfile and what its COPY lines name (files and folders, git-tracked files only)."""
    names = {"Dockerfile"}
    for line in (REPO / "Dockerfile").read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["COPY"] and not any(p.startswith("--from") for p in parts):
            names |= {p.rstrip("/") for p in parts[1:-1] if not p.startswith("--")}
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--", *sorted(names)], check=True,
                             capture_output=True, text=True).stdout.split("\0")
    files = sorted(f for f in tracked if f and (REPO / f).is_file())
    missing = [n for n in names if not any(f == n or f.startswith(n + "/") for f in files)]
    assert not missing, f"the Dockerfile copies what git does not track: {missing}"
    return files


def image_context(path: Path, epoch: int) -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in context_files():
            data = (REPO / rel).read_bytes()
            info = tarfile.TarInfo(rel)
            info.size, info.mtime, info.uid, info.gid, info.uname, info.gname = len(data), epoch, 0, 0, "", ""
            info.mode = 0o755 if os.access(REPO / rel, os.X_OK) else 0o644
            tar.addfile(info, io.BytesIO(data))
    with open(path, "wb") as out, gzip.GzipFile(fileobj=out, mode="wb", mtime=epoch, filename="") as gz:
        gz.write(raw.getvalue())


def sbom(wheel: Path, constraints: Path, path: Path) -> None:
    """CycloneDX JSON of what `pip install <wheel>[nvidia] -c constraints` puts in a fresh venv."""
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "--constraint", str(constraints), f"{wheel}[nvidia]"], check=True)
        cyclonedx = Path(sys.executable).parent / "cyclonedx-py"
        subprocess.run([str(cyclonedx), "environment", "--output-format", "JSON", "--output-reproducible",
                        "--output-file", str(path), str(venv / "bin" / "python")], check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "dist")
    ap.add_argument("--no-sbom", action="store_true", help="skip the SBOM (no package index at hand)")
    args = ap.parse_args()
    v, epoch = version(), source_date_epoch()
    out = args.out.resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch), "PIP_CONSTRAINT": str(REPO / "constraints.txt")}
    # --no-isolation: the backend is the setuptools of this venv (pinned by the release extra and
    # constraints.txt), so the build needs no package index
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir", str(out),
                    str(REPO)], check=True, env=env)
    (wheel,) = out.glob(f"unified_gpu_exporter-{v}-*.whl")
    constraints = out / f"{NAME}-{v}-constraints.txt"
    shutil.copyfile(REPO / "constraints.txt", constraints)
    image_context(out / f"{NAME}-{v}-image-context.tar.gz", epoch)
    if not args.no_sbom:
        sbom(wheel, constraints, out / f"{NAME}-{v}.cdx.json")
    sums = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}" for p in sorted(out.iterdir()) if p.is_file()]
    (out / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    print("\n".join(sums))
    return 0


if __name__ == "__main__":
    sys.exit(main())
