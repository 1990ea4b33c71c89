"""Fake sysfs roots with N amdgpu cards, cloned from the real text dumps in the shared fixtures.

Card i is a copy of dump ``REAL_CARDS[i % 4]`` (vega56, rx580, rx6900xt, rx7800xt) at its own PCI
address, arranged as on a real node by ``tests/amd_fixture_tree.add_card``:

    devices/pci0000:00/<pci>/...                 the dump (attribute files, hwmon/hwmonK/)
    class/drm/cardN -> ../../devices/pci0000:00/<pci>/drm/cardN   (cardN/device -> ../..)
    class/hwmon/hwmonK -> ../../devices/pci0000:00/<pci>/hwmon/hwmonK (hwmonK/device -> ../..)

so node_exporter's drm and hwmon collectors and our amdgpu source read the same files.  Each
clone gets a unique hwmon number, ``unique_id`` (where the dump has one) and ``PCI_SLOT_NAME``.
Every card also gets the real ``gpu_metrics`` v1_3 table captured on an RX 6900 XT (the dumps
have none; node_exporter does not read it, our source decodes it on every full and fast poll), read
from the shared fixtures (``gpu_metrics=None`` leaves it out).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.amd_fixture_tree import REAL_CARDS, add_card  # noqa: E402

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "fixtures"
DUMPS = SHARED / "amd" / "sysfs-amdgpu-sysfs-rs"
GPU_METRICS = SHARED / "amd" / "gpu_metrics_v1_3_rx6900xt_navi21.bin"


def pci_address(i: int) -> str:
    return f"0000:{0x10 + i // 8:02x}:{i % 8:02x}.0"


def build_tree(root: Path, cards: int, dumps: Path = DUMPS, gpu_metrics: Path | None = GPU_METRICS) -> Path:
    """Create ``root`` (a sysfs mount point) with ``cards`` amdgpu cards; returns ``root``."""
    if not dumps.is_dir():
        raise FileNotFoundError(f"real amdgpu dumps not found at {dumps}")
    table = gpu_metrics.read_bytes() if gpu_metrics is not None else None
    root.mkdir(parents=True, exist_ok=True)
    for i in range(cards):
        name = REAL_CARDS[i % len(REAL_CARDS)]
        pci = pci_address(i)
        dev = add_card(root, i, pci, source_dir=dumps / name)
        if table is not None:
            (dev / "gpu_metrics").write_bytes(table)
        uevent = dev / "uevent"
        lines = [f"PCI_SLOT_NAME={pci}" if ln.startswith("PCI_SLOT_NAME=") else ln
                 for ln in uevent.read_text().splitlines()]
        uevent.write_text("\n".join(lines) + "\n")
        uid = dev / "unique_id"
        if uid.exists():
            uid.write_text(f"{uid.read_text().strip()[:-4]}{i:04x}\n")
        for hw in sorted((dev / "hwmon").glob("hwmon*")):
            new = dev / "hwmon" / f"hwmon{i}"
            hw.rename(new)
            os.symlink("../..", new / "device")  # as in sysfs: hwmonK/device -> the PCI device
            link = root / "class" / "hwmon" / f"hwmon{i}"
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.relpath(new, link.parent), link)
            break  # one hwmon per card, as amdgpu registers
    return root


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--cards", type=int, default=8)
    args = ap.parse_args()
    build_tree(args.root, args.cards)
    print(args.root)


if __name__ == "__main__":
    main()
