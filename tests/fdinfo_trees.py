"""Build fixture procfs (and matching sysfs) trees for the DRM fdinfo source under tmp_path."""

from __future__ import annotations

import os
from pathlib import Path


def add_fd(proc: Path, pid: int, fd: int, target: str, fdinfo: str | None = None, comm: str = "app") -> None:
    """``<proc>/<pid>/fd/<fd>`` -> target (a dangling link is fine: only readlink is used for
    /dev/dri targets) and ``<proc>/<pid>/fdinfo/<fd>`` with the given text."""
    base = proc / str(pid)
    (base / "fd").mkdir(parents=True, exist_ok=True)
    (base / "fdinfo").mkdir(parents=True, exist_ok=True)
    (base / "comm").write_text(comm + "\n")
    link = base / "fd" / str(fd)
    if link.is_symlink():
        link.unlink()
    os.symlink(target, link)
    (base / "fdinfo" / str(fd)).write_text(fdinfo if fdinfo is not None else f"pos:\t0\nflags:\t02\nmnt_id:\t9\nino:\t{fd}\n")


def set_fdinfo(proc: Path, pid: int, fd: int, text: str) -> None:
    (proc / str(pid) / "fdinfo" / str(fd)).write_text(text)


def add_card(sysfs: Path, card: int, pci: str, *, symlink: bool = True, driver: str | None = None) -> None:
    """``<sysfs>/class/drm/card<N>/device``: a symlink named after the PCI address (as the
    kernel has it), or a directory whose uevent names it (as the LACT captures have it).
    ``driver``: the device's ``driver`` link names that DRM driver (amdgpu, i915, xe)."""
    card_dir = sysfs / "class" / "drm" / f"card{card}"
    card_dir.mkdir(parents=True, exist_ok=True)
    if symlink:
        os.symlink(f"../../../devices/pci0000:00/0000:00:01.0/{pci}", card_dir / "device")
        if driver:
            dev = sysfs / "devices" / "pci0000:00" / "0000:00:01.0" / pci
            dev.mkdir(parents=True, exist_ok=True)
            os.symlink(f"../../../../bus/pci/drivers/{driver}", dev / "driver")
    else:
        (card_dir / "device").mkdir()
        (card_dir / "device" / "uevent").write_text(f"DRIVER=i915\nPCI_SLOT_NAME={pci}\n")


def some_card(sysfs: Path, pci: str = "0000:ff:00.0") -> None:
    """One DRM card in sysfs (unless the tree has one already): the fdinfo source, on by
    default, is absent on a node without any."""
    drm = Path(sysfs) / "class" / "drm"
    if not any(drm.glob("card*")) if drm.is_dir() else True:
        add_card(Path(sysfs), 99, pci)
