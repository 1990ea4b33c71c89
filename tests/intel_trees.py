"""Arrange the real LACT Intel sysfs captures (../shared/fixtures/intel) as a sysfs root.

The captures hold paths relative to ``/sys/class/drm``; the sources take a sysfs root, so
``<tmp>/sys/class/drm/cardN`` is made a symlink to the read-only capture (or a copy of it when a
test must change a file).
"""

from __future__ import annotations

import shutil
from pathlib import Path

INTEL_TREES = ("sysfs-lact-a380-i915", "sysfs-lact-a380-xe", "sysfs-lact-b580", "sysfs-lact-cometlake")


def sysfs_root(shared_fixtures: Path, tmp_path: Path, tree: str, *, copy: bool = False) -> Path:
    """A sysfs root whose class/drm holds the card directories of one captured tree."""
    src = shared_fixtures / "intel" / tree
    root = tmp_path / f"sys-{tree}"
    drm = root / "class" / "drm"
    drm.mkdir(parents=True)
    for card in sorted(src.glob("card*")):
        if copy:
            # skip the LACT-only MEI / fan-curve noise; keep everything the source reads
            shutil.copytree(card, drm / card.name, symlinks=True,
                            ignore=shutil.ignore_patterns("xe.mei-*", "pwm*", "config", "telem"))
            for p in (drm / card.name).rglob("*"):
                p.chmod(0o755 if p.is_dir() else 0o644)
            (drm / card.name).chmod(0o755)
        else:
            (drm / card.name).symlink_to(card)
    return root


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
