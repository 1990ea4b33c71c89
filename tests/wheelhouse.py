"""A local wheelhouse for the tests that replay an install path (README's venv, the Dockerfile).

Those paths run ``pip install`` of the project and its pinned dependencies.  Tests talk only to
loopback (tests/netguard), so pip may not reach a package index: the tests run it with
``PIP_NO_INDEX=1`` and ``PIP_FIND_LINKS`` naming a folder of wheels rebuilt here from the
distributions installed in the test venv, which ``make install`` installed with the same
``constraints.txt`` the install paths pin.  A wheel is rebuilt from its installed files (its
RECORD), with a fresh RECORD of their hashes; what an install puts outside site-packages
(console scripts) is left out, since pip writes those again from ``entry_points.txt``.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import zipfile
from importlib import metadata
from pathlib import Path

# what a wheel carries that an install adds, and what pip regenerates
_INSTALL_ONLY = {"INSTALLER", "RECORD", "REQUESTED", "direct_url.json"}


def _tag(dist: metadata.Distribution) -> str | None:
    wheel = dist.read_text("WHEEL") or ""
    tags = re.findall(r"^Tag:\s*(\S+)\s*$", wheel, re.M)
    return tags[0] if tags else None


def _record_line(arcname: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [arcname, f"sha256={digest}", str(len(data))]


def rebuild(dist: metadata.Distribution, out: Path) -> Path | None:
    """The wheel of one installed distribution, or None where it cannot be rebuilt (an
    editable install, one installed without a WHEEL file)."""
    tag = _tag(dist)
    if tag is None or dist.read_text("direct_url.json") and '"editable": true' in (dist.read_text("direct_url.json") or ""):
        return None
    name = re.sub(r"[-_.]+", "_", dist.metadata["Name"])
    version = dist.version
    info_dir = next((str(f).split("/")[0] for f in dist.files or () if str(f).split("/")[0].endswith(".dist-info")),
                    None)
    if info_dir is None:
        return None
    path = out / f"{name}-{version}-{tag}.whl"
    rows = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in dist.files or ():
            arc = str(f)
            parts = f.parts
            if arc.startswith("..") or "__pycache__" in parts or arc.endswith(".pyc"):
                continue
            if parts[0] == info_dir and parts[-1] in _INSTALL_ONLY:
                continue
            src = Path(dist.locate_file(f))
            if not src.is_file():
                continue
            data = src.read_bytes()
            zf.writestr(arc, data)
            rows.append(_record_line(arc, data))
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerows(rows)
        writer.writerow([f"{info_dir}/RECORD", "", ""])
        zf.writestr(f"{info_dir}/RECORD", buf.getvalue())
    return path


def build(out: Path, skip: tuple[str, ...] = ("unified-gpu-exporter", "pip")) -> Path:
    """Every installed distribution of this interpreter as a wheel in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    for dist in metadata.distributions():
        key = re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower()
        if not key or key in seen or key in skip:
            continue
        seen.add(key)
        rebuild(dist, out)
    return out


def offline_pip_env(wheelhouse: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with pip pointed at the wheelhouse and no index."""
    base = dict(os.environ if env is None else env)
    base.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheelhouse), PIP_DISABLE_PIP_VERSION_CHECK="1")
    base.pop("PIP_INDEX_URL", None)
    base.pop("PIP_EXTRA_INDEX_URL", None)
    return base
