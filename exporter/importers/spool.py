"""The drop directory's folders, held open: every file operation relative to a held directory
fd, never following a symlink (``DropDir`` builds on it).

``_fds`` maps "root" and each folder to a directory fd.  Files move between folders with
``renameat`` under names that are free (``_unique``); a rejected file gets a ``.reason`` created
exclusively (``O_CREAT|O_EXCL|O_NOFOLLOW``), readable by group/others only where the rejected
file itself is (a reason may quote its first line); a file whose import was deferred (the
exporter stopping, or no worker could run) goes back to the root, to be claimed again.
"""

from __future__ import annotations

import logging
import os
import stat
import time

from ..render.textformat import valid_utf8
from .siblings import SIDECAR

log = logging.getLogger("unified_gpu_exporter")
MAX_REASON = 500  # characters of a reason written to .reason (never a file's content at length)


class Spool:
    def __init__(self) -> None:
        self._fds: dict[str, int] = {}  # "root" and each folder -> held directory fd
        self._last_stamp = 0
        self._last_deferred = ""

    def _fd(self, which: str) -> int:
        fd = self._fds.get(which)
        if fd is None:
            raise OSError(f"drop directory {getattr(self, 'root', '')}: not set up")
        return fd

    def close(self) -> None:
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            try:
                os.close(fd)
            except OSError:
                pass

    def _plain_file(self, which: str, name: str) -> os.stat_result | None:
        """lstat of ``name`` in a held folder when it is a regular file with one link, else None."""
        try:
            st = os.lstat(name, dir_fd=self._fd(which))
        except OSError:
            return None
        return st if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 else None

    def _discard(self, which: str, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self._fd(which))
        except OSError:
            pass

    def _exists(self, which: str, name: str) -> bool:
        try:
            os.lstat(name, dir_fd=self._fd(which))
        except FileNotFoundError:
            return False
        except OSError:
            return True
        return True

    def _unique(self, which: str, name: str) -> str:
        if not self._exists(which, name):
            return name
        return f"{name}.{time.time_ns()}"

    def _move(self, src_folder: str, name: str, folder: str) -> str:
        src, dst = self._fd(src_folder), self._fd(folder)
        dest = self._unique(folder, name)
        if self._plain_file(src_folder, name + SIDECAR) is not None:
            os.replace(name + SIDECAR, dest + SIDECAR, src_dir_fd=src, dst_dir_fd=dst)
        os.replace(name, dest, src_dir_fd=src, dst_dir_fd=dst)
        if folder == "imported":
            # stamp the import order: file times are coarse (a kernel tick), and restore() keeps
            # the newest files, so two imports in one tick must still be ordered
            stamp = max(time.time_ns(), self._last_stamp + 1)
            self._last_stamp = stamp
            try:
                os.utime(dest, ns=(stamp, stamp), dir_fd=dst, follow_symlinks=False)
            except OSError:
                pass
        return dest

    @staticmethod
    def _create(dir_fd: int, name: str, data: bytes, mode: int) -> None:
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
        try:
            os.fchmod(out, mode)  # not the umask's
            os.write(out, data)
        finally:
            os.close(out)

    def _write_reason(self, dest: str, reason: str) -> None:
        name = dest + ".reason"
        if self._exists("rejected", name):
            name = f"{dest}.{time.time_ns()}.reason"
        st = self._plain_file("rejected", dest)
        # as readable as the file it explains (it may quote the file's first line)
        mode = 0o600 | (stat.S_IMODE(st.st_mode) & 0o044 if st is not None else 0)
        self._create(self._fd("rejected"), name,
                     (valid_utf8(reason)[:MAX_REASON] + "\n").encode("utf-8", "replace"), mode)

    def _reject(self, name: str, reason: str, folder: str = "processing") -> None:
        try:
            dest = self._move(folder, name, "rejected")
            self._write_reason(dest, reason)
        except OSError as exc:
            log.error("cannot move a rejected profile aside", extra={"file": name, "reason": str(exc)})
        log.warning("profile rejected", extra={"file": name, "reason": reason[:MAX_REASON]})

    def _unclaim(self, name: str, reason: str, folder: str = "processing") -> None:
        """Put a claimed file back in the root, to be claimed again by a later scan (its import
        was deferred: no fault of the file)."""
        try:
            self._move(folder, name, "root")
        except OSError as exc:
            log.error("cannot put a profile back in the drop directory", extra={"file": name, "reason": str(exc)})
        if reason != self._last_deferred:  # once per reason, not once per scan
            self._last_deferred = reason
            log.warning("profile import deferred", extra={"file": name, "reason": reason[:MAX_REASON]})
