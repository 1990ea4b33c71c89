"""The files beside an artifact (rocprof companions, ``.meta.json`` sidecars), read under the
``safefile`` rule through the artifact's own directory fd: never by path, never a symlink,
never more than the limit.

The import worker (``isolate``) may run as another user (uid 65534 when the exporter is root)
and gets no directory at all: the parent opens the siblings a parser may read (``wanted``) and
hands over their fds (``open_wanted``); the worker's ``Siblings(opened=...)`` reads those, and
one the parent could not open is refused with the parent's reason, as it would have been here."""

from __future__ import annotations

import errno
import os

from .. import safefile

SIDECAR = ".meta.json"
SYSINFO = "sysinfo.csv"
MAX_SIBLINGS = 16  # fds handed to the worker besides the artifact's own
KERNEL_TRACE = "kernel_trace"
TRACE_COMPANIONS = ("hip_api_trace", "hip_runtime_trace")  # in the order rocprof_csv tries them


def sidecar_names(name: str) -> tuple[str, str]:
    """The sidecars ``detect`` reads a trace id from: ``<name>.meta.json``, then
    ``<name up to its first dot>.meta.json``."""
    return name + SIDECAR, name.split(".")[0] + SIDECAR


def trace_companions(name: str) -> list[str]:
    """The files of the same rocprofv3 run as a ``*kernel_trace*`` file (``<pid>_kernel_trace.csv``
    -> ``<pid>_hip_api_trace.csv``, ``<pid>_hip_runtime_trace.csv``); none for another name."""
    if KERNEL_TRACE not in name:
        return []
    return [name.replace(KERNEL_TRACE, n) for n in TRACE_COMPANIONS]


def is_sysinfo_for(name: str, entry: str) -> bool:
    """Whether ``entry`` is an Omniperf ``*sysinfo.csv`` (not hidden) whose prefix ``name`` starts with."""
    return entry.endswith(SYSINFO) and not entry.startswith(".") and name.startswith(entry[: -len(SYSINFO)])


def wanted(name: str, entries: list[str]) -> list[str]:
    """The ``entries`` beside ``name`` that a parser may read: its sidecars (``detect``), the
    trace companions of a rocprofv3 ``*kernel_trace*`` file and Omniperf ``*sysinfo.csv``
    files whose prefix it starts with (``rocprof_csv``)."""
    cands = [*sidecar_names(name), *trace_companions(name)]
    cands += [e for e in sorted(entries) if is_sysinfo_for(name, e)]
    present = set(entries)
    return [c for c in dict.fromkeys(cands) if c in present and c != name][:MAX_SIBLINGS]


def open_wanted(dir_fd: int, name: str, *, single_link: bool = False) -> dict[str, int | str]:
    """name -> an fd opened under the ``safefile`` rule (the caller closes it), or why it was
    not opened; only the entries ``wanted`` names."""
    out: dict[str, int | str] = {}
    try:
        entries = os.listdir(dir_fd)
    except OSError:
        return out
    try:
        for sib in wanted(name, entries):
            try:
                out[sib] = safefile.open_regular(sib, dir_fd, single_link=single_link)[0]
            except FileNotFoundError:
                continue
            except OSError as exc:
                out[sib] = str(exc.strerror or exc)
    except BaseException:
        close(out)
        raise
    return out


def close(opened: dict[str, int | str]) -> None:
    for fd in opened.values():
        if isinstance(fd, int):
            os.close(fd)


class Siblings:
    def __init__(self, dir_fd: int | None, limit: int, *, single_link: bool = False,
                 opened: dict[str, int | str] | None = None) -> None:
        self.dir_fd, self.limit, self.single_link = dir_fd, limit, single_link
        self.opened = opened

    def names(self) -> list[str]:
        if self.opened is not None:
            return sorted(self.opened)
        if self.dir_fd is None:
            return []
        try:
            return sorted(os.listdir(self.dir_fd))
        except OSError:
            return []

    def exists(self, name: str) -> bool:
        if self.opened is not None:
            return name in self.opened
        if self.dir_fd is None:
            return False
        try:
            os.lstat(name, dir_fd=self.dir_fd)
        except OSError:
            return False
        return True

    def read(self, name: str, limit: int | None = None) -> bytearray | None:
        """The content of ``name``; None when there is no such entry.  Raises OSError
        (``safefile.Refused`` with the reason) for one that is not read."""
        limit = self.limit if limit is None else limit
        if self.opened is not None:
            fd = self.opened.get(name)
            if fd is None:
                return None
            if isinstance(fd, str):
                raise safefile.Refused(errno.EACCES, fd)
            os.lseek(fd, 0, os.SEEK_SET)
            return safefile.read_fd(fd, limit)
        if self.dir_fd is None:
            return None
        try:
            return safefile.read_at(self.dir_fd, name, limit, single_link=self.single_link)
        except FileNotFoundError:
            return None

    def read_text(self, name: str) -> str | None:
        data = self.read(name)
        return None if data is None else data.decode("utf-8", errors="replace")
