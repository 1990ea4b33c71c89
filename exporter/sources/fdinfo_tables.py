"""The parts of ``fdinfo_scan`` that look at one fd table: listing it within the poll's budget,
and deciding whether an fd's link target is a DRM device without following it."""

from __future__ import annotations

import os
import time
from itertools import compress, repeat
from stat import S_ISDIR

from .. import safefile
from .evidence import pid_entries

FDINFO_MAX_BYTES = 64 * 1024  # a DRM client's fdinfo is a few KB
LIST_AT_ONCE = 262144  # fd tables up to this st_size (procfs: fds) are listed with one listdir
# /dev targets never DRM devices (not looked at further); the subtrees among them any user can
# write, or mount over, must never be followed (``is_drm``)
NOT_DRM = ("/dev/shm/", "/dev/mqueue/", "/dev/pts/", "/dev/hugepages/", "/dev/null", "/dev/zero", "/dev/full",
           "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx", "/dev/console", "/dev/kmsg", "/dev/nvidia",
           "/dev/kfd", "/dev/fuse", "/dev/net/", "/dev/log")
_NOT_DRM = tuple(n.encode() for n in NOT_DRM)


def is_drm(procfs: str, pid: str, fd: str, target: str) -> bool:
    """Whether a ``/dev`` target is a DRM device.  Outside ``/dev/dri/`` (a container's own
    /dev naming its node otherwise) it is decided from the fd's own fdinfo, which procfs
    writes (``drm-driver``), never by stat'ing the target: a stat follows the link into the
    target's filesystem, and a user may mount FUSE (which can leave the call hanging for
    ever, and the counting process with it) on /dev/shm, or anywhere in a mount namespace of
    their own.  Names that are never DRM, and the subtrees any user can write (shm, mqueue,
    pts, hugepages), are not looked at further: they are most /dev fds."""
    if target.startswith("/dev/dri/"):
        return True
    if target.startswith(NOT_DRM) or target.endswith(" (deleted)") or target.count("/") > 3:
        return False
    try:
        text = safefile.read_path(f"{procfs}/{pid}/fdinfo/{fd}", FDINFO_MAX_BYTES)
    except OSError:
        return False
    return b"\ndrm-driver:" in text


def links(dir_fd: int, names: list[bytes]) -> tuple[list[bytes], list[bytes], bool]:
    """The fds of ``names`` still open in an fd directory, their link targets (one ``readlink``
    each, in bytes: the call is most of the cost, and bytes spare it an encoding of the name and a
    decoding of the target; the loop around it does nothing else), and whether one was closed
    meanwhile."""
    readlink = os.readlink
    out: list[bytes | None] = []
    append = out.append
    it = iter(names)
    while True:
        try:
            for n in it:
                append(readlink(n, dir_fd=dir_fd))
            break
        except OSError:
            append(None)
    if None not in out:
        return names, out, False  # type: ignore[return-value]
    kept = [i for i, t in enumerate(out) if t is not None]
    return [names[i] for i in kept], [out[i] for i in kept], True  # type: ignore[misc]


def drm_among(procfs: str, pid: str, names: list[bytes], targets: list[bytes]) -> set[str]:
    """The fds of ``names`` whose link targets are DRM devices (``is_drm``).  The ``/dev``
    targets, a few of a table, are picked without a Python loop over the others."""
    dev = compress(zip(names, targets, strict=True), map(bytes.startswith, targets, repeat(b"/dev/")))
    return {fd.decode() for fd, target in dev if not target.startswith(_NOT_DRM)
            and is_drm(procfs, pid, fd.decode(), os.fsdecode(target))}


def same_size(fd_dir: str, size: int) -> bool:
    """Whether the fd directory ``fd_dir`` is a directory whose ``st_size`` is ``size`` (where it
    counts the entries, a check of an unchanged table: one ``lstat``, not an open, an ``fstat``
    and a close).  A symlink, or anything not there, is not: the table is then opened."""
    try:
        st = os.lstat(fd_dir)
    except OSError:
        return False
    return st.st_size == size and S_ISDIR(st.st_mode)


def pid_names(path: str) -> list[str]:
    """The names of a directory that are pids (``evidence.pid_entries``); none where it cannot be listed."""
    try:
        return [e.name for e in pid_entries(path)]
    except OSError:
        return []


def list_table(dir_fd: int, st, budget) -> tuple[list[int], bool]:
    """The fd numbers of a table, sorted, and whether the listing is whole.  A table that
    says it is large (``st_size`` of a procfs fd directory is its number of fds since Linux
    6.2) is listed entry by entry up to the poll's deadline and the listing goes on at the
    next poll from where it stopped: a million fds cost each poll no more than its budget.
    Smaller ones are listed at once."""
    try:
        if st.listing is None:
            if os.fstat(dir_fd).st_size <= LIST_AT_ONCE:
                names = os.listdir(dir_fd)
                try:
                    return sorted(map(int, names)), True
                except ValueError:  # not a procfs: names that are not numbers
                    return sorted(int(n) for n in names if n.isascii() and n.isdigit()), True
            st.listing = (os.scandir(dir_fd), [])  # its own duplicate of the directory fd
    except OSError:
        return [], False
    it, nums = st.listing
    try:
        for i, e in enumerate(it):
            name = e.name
            if name.isascii() and name.isdigit():
                nums.append(int(name))
            if i & 4095 == 4095 and time.perf_counter() > budget.deadline:
                budget.hit = True
                return [], False
    except OSError:
        nums = []
    it.close()
    st.listing = None
    nums.sort()
    return nums, True


class Budget:
    """One poll's fd-table budget (``fdinfo_scan.ScanLimits``: ``max_fds``, ``max_seconds``)."""

    def __init__(self, limits) -> None:
        self.fds = limits.max_fds
        self.deadline = time.perf_counter() + limits.max_seconds
        self.hit = False

    def take(self, n: int) -> int:
        """Take up to ``n`` fds from the budget; how many it gave (fewer: ``hit``)."""
        if self.hit or time.perf_counter() > self.deadline:
            self.hit = True
            return 0
        given = min(n, self.fds)
        self.fds -= given
        self.hit = given < n
        return given

    def late(self) -> bool:
        """Whether the poll's time is spent (then ``hit``)."""
        if time.perf_counter() > self.deadline:
            self.hit = True
            return True
        return False
