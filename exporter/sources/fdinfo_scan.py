"""Finding DRM clients under a procfs root: which fds of which processes are DRM devices, and their
fdinfo text.  One ``readlink`` per fd (no open) decides; only DRM fds have their fdinfo read, each
through its directory fd under the ``exporter.safefile`` rule (a host ``/proc`` mounted into a
container, or a fixture, is a tree another user may shape)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

from .. import safefile
from .evidence import pid_entries

DRM_MAJOR = 226
FDINFO_MAX_BYTES = 64 * 1024  # a DRM client's fdinfo is a few KB


class FdScanner:
    """Finds DRM fds under a procfs root and returns their fdinfo text, cheaply."""

    def __init__(self, procfs: Path) -> None:
        self.procfs = str(procfs)
        self._dev_cache: dict[tuple[str, str, str], bool] = {}
        self.unreadable = 0  # fd tables of the last scan that could not be read (EACCES)

    def _is_drm_target(self, pid: str, fd: str, dir_fd: int, target: str, cache: dict) -> bool:
        if target.startswith("/dev/dri/"):
            return True
        if not target.startswith("/dev/"):
            return False  # sockets, pipes, anon inodes, regular files
        key = (pid, fd, target)
        verdict = self._dev_cache.get(key)
        if verdict is None:
            try:
                st = os.stat(fd, dir_fd=dir_fd)  # follows the magic link to the device node
                verdict = stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == DRM_MAJOR
            except OSError:
                verdict = False
        cache[key] = verdict
        return verdict

    def _drm_fds(self, pid: str, base: str, cache: dict) -> list[str] | None:
        """Names of the DRM fds of one process via readlink relative to its fd/ directory;
        None when the tree has no fd/ directory (then every fdinfo file is read)."""
        try:
            dir_fd = os.open(f"{base}/fd", os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            return None
        except PermissionError:
            self.unreadable += 1  # other users' processes without CAP_SYS_PTRACE: no evidence
            return []
        except OSError:
            return []
        try:
            out = []
            readlink, is_drm = os.readlink, self._is_drm_target
            for fd in os.listdir(dir_fd):
                try:
                    target = readlink(fd, dir_fd=dir_fd)
                except OSError:
                    continue
                if target.startswith("/dev/") and is_drm(pid, fd, dir_fd, target, cache):
                    out.append(fd)
            return out
        except OSError:
            return []
        finally:
            os.close(dir_fd)

    def scan(self, errors: dict) -> Iterator[tuple[str, str, str]]:
        """Yield ``(pid, fd, fdinfo text)`` for every DRM fd, pids in numeric order."""
        new_cache: dict[tuple[str, str, str], bool] = {}
        self.unreadable = 0
        try:  # a pid is a directory
            pids = sorted((e.name for e in pid_entries(self.procfs) if e.is_dir(follow_symlinks=False)), key=int)
        except OSError:
            pids = []
        for pid in pids:
            base = f"{self.procfs}/{pid}"
            fds = self._drm_fds(pid, base, new_cache)
            from_links = fds is not None
            if fds is None:
                try:
                    fds = os.listdir(f"{base}/fdinfo")
                except OSError:
                    continue
            if not fds:
                continue
            try:
                info_fd = safefile.open_dir(f"{base}/fdinfo")
            except OSError:
                continue  # the process exited meanwhile
            try:
                yield from self._read_fdinfo(pid, info_fd, fds, from_links, errors)
            finally:
                os.close(info_fd)
        self._dev_cache = new_cache

    @staticmethod
    def _read_fdinfo(pid: str, info_fd: int, fds: list[str], from_links: bool,
                     errors: dict) -> Iterator[tuple[str, str, str]]:
        for fd in fds:
            try:
                data = safefile.read_at(info_fd, fd, FDINFO_MAX_BYTES)
            except FileNotFoundError:
                continue  # fd closed or process exited meanwhile
            except OSError:  # also safefile.Refused: a FIFO, a symlink, above the limit
                if from_links:
                    errors["read_error"] = errors.get("read_error", 0) + 1
                continue
            yield pid, fd, data.decode("utf-8", "replace")
