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


def write_clients(sysfs: Path, minor: int, rows: list[tuple[str, int]], *, layout: str = "id",
                  link: bool = True) -> Path:
    """``<sysfs>/kernel/debug/dri/<minor>/clients`` as drivers/gpu/drm/drm_debugfs.c (its printf formats)
    ``drm_clients_info`` prints it: one line per drm_file (``rows``: (command, tgid)).
    ``layout``: "id" (name and client id columns, Linux 6.16+), "name" (6.13+), "tgid" (6.4+),
    "pid" (older: the opening thread).  ``link``: the device-centred layout (6.7+): ``dri/<minor>``
    is a symlink to ``dri/<pci address>``."""
    dri = Path(sysfs) / "kernel" / "debug" / "dri"
    dri.mkdir(parents=True, exist_ok=True)
    if link:
        target = dri / f"0000:{minor:02x}:00.0"
        target.mkdir(exist_ok=True)
        if not (dri / str(minor)).is_symlink():
            os.symlink(target.name, dri / str(minor))
    else:
        target = dri / str(minor)
        target.mkdir(exist_ok=True)
    pid = "pid" if layout == "pid" else "tgid"
    head = "%20s %5s %3s master a %5s %10s" % ("command", pid, "dev", "uid", "magic")  # noqa: UP031
    if layout in ("name", "id"):
        head += " %*s" % (64, "name")  # noqa: UP031
    if layout == "id":
        head += " %20s" % "id"  # noqa: UP031
    lines = [head]
    for i, (comm, tgid) in enumerate(rows):
        line = "%20s %5d %3d   %c    %c %5d %10u" % (comm, tgid, minor, "n", "y", 1000, 0)  # noqa: UP031
        if layout in ("name", "id"):
            line += " %*s" % (64, "<unset>")  # noqa: UP031
        if layout == "id":
            line += " %20d" % (i + 1)  # noqa: UP031
        lines.append(line)
    path = target / "clients"
    path.write_text("\n".join(lines) + "\n")
    return path


def stat_text(pid: int, comm: str = "app", *, minflt: int = 2000, majflt: int = 3, utime: int = 40, stime: int = 9,
              num_threads: int = 4, starttime: int = 5000, vsize: int = 1 << 30, rss: int = 6000) -> str:
    """``<pid>/stat`` as fs/proc/array.c ``do_task_stat`` writes it for a thread group (proc(5):
    52 fields; ``comm`` in parentheses as the process set it, spaces and ``)`` included)."""
    fields = [pid, f"({comm})", "S", 1, pid, pid, 0, -1, 4194560, minflt, 0, majflt, 0, utime, stime, 0, 0, 20, 0,
              num_threads, 0, starttime, vsize, rss, 18446744073709551615, 1, 1, 0, 0, 0, 0, 0, 4096, 17642, 0, 0,
              0, 17, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    return " ".join(map(str, fields)) + "\n"


def write_stat(proc: Path, pid: int, **fields) -> None:
    """``<proc>/<pid>/stat`` (``stat_text``): the process's activity fingerprint (fdinfo_activity)."""
    (proc / str(pid) / "stat").write_text(stat_text(pid, **fields))
