"""The watched drop directory: every file imported once, atomically, bad files set aside.

Layout under ``root``::

    root/              producers write here (write ``x.tmp`` / ``.x`` then rename: those are ignored)
    root/processing/   files claimed by one scan (rename: atomic on one filesystem)
    root/imported/     imported files (and companions such as hip_api_trace, sysinfo)
    root/rejected/     bad files, each with ``<name>.reason`` saying why

A file is claimed once it has not changed for ``settle`` seconds.  A sidecar
``<name>.meta.json`` ({"trace_id": ...}) travels with its file.  Files of a triggered capture
never pass through the root: ``adopt`` moves (or copies) them from the capture's private
staging directory straight into processing/ and imports them.  Files left in processing/ by a
daemon that stopped mid-import are moved to rejected/ at start (not retried: a file that
crashed or hung the importer must not do it again); drop them again to retry.  An imported file
that no longer imports at start (``restore``) is moved to rejected/ once, never re-read.

The root is writable by other users (the producers), so it is handled like a spool someone else
owns.  ``setup()`` opens the root and the three folders once and keeps the directory fds; every
later operation is relative to those fds (``dir_fd``/``openat``/``renameat``) and never follows a
symlink, so replacing ``processing/`` (or any other folder) with a symlink or another directory
after the start changes nothing.  The folders must be owned by the exporter's user and writable
by nobody else: an attacker who created them first is refused with a message, not trusted.  A
claimed entry that is not a plain file with one link (a symlink or hard link swapped in between
the scan and the claim) is deleted unread.  Files and sidecars are read under the
``exporter.safefile`` rule (through the held fd, ``O_NOFOLLOW|O_NONBLOCK``, regular with one
link, ``max_bytes`` a hard limit while reading and after decompression): a file under a write
lease is rejected at once instead of stalling the import thread.  ``importer`` parses each file
in a child process with memory, CPU and time limits (``isolate``).  ``.reason`` files are created
exclusively (``O_CREAT|O_EXCL|O_NOFOLLOW``) under names the exporter chooses, readable by
group/others only where the rejected file itself is (a reason may quote its first line).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from .. import safefile
from ..render.textformat import valid_utf8
from .detect import SIDECAR
from .isolate import Imported, Importer
from .model import CompanionFile, Profile, ProfileRejected

log = logging.getLogger("unified_gpu_exporter")
_IGNORED_SUFFIXES = (".tmp", ".part", ".partial", ".reason", ".crdownload", SIDECAR)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_FOLDERS = ("processing", "imported", "rejected")
MAX_REASON = 500  # characters of a reason written to .reason (never a file's content at length)


class UnsafeDropDir(OSError):
    """The drop directory's folders have an owner or mode that would let others redirect us."""


@dataclass
class Outcome:
    name: str
    profile: Profile | None = None  # its description (no kernels when parsed in a child)
    reason: str = ""
    companion: bool = False
    result: Imported | None = None  # its devices and readings
    kind: str = ""  # the limit a rejected file hit (ProfileRejected.kind)


class DropDir:
    def __init__(self, root: str | os.PathLike, settle: float = 1.0, max_bytes: int | None = None,
                 importer: Importer | None = None):
        self.root = Path(root)
        self.processing = self.root / "processing"
        self.imported = self.root / "imported"
        self.rejected = self.root / "rejected"
        self._last_stamp = 0
        self.settle = settle
        self.importer = importer if importer is not None else Importer()
        if max_bytes is not None:
            self.importer.limits = replace(self.importer.limits, max_bytes=max_bytes)
        self.stopping = threading.Event()  # set: a running SQLite import stops at once
        self._fds: dict[str, int] = {}  # "root" and each folder -> held directory fd

    # ------------------------------------------------------------------ directory fds
    def _fd(self, which: str) -> int:
        fd = self._fds.get(which)
        if fd is None:
            raise OSError(f"drop directory {self.root}: not set up")
        return fd

    def close(self) -> None:
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            try:
                os.close(fd)
            except OSError:
                pass

    def _open_root(self) -> int:
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root, _DIR_FLAGS)
        st = os.fstat(fd)
        if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
            os.close(fd)
            raise UnsafeDropDir(f"drop directory {self.root} is world-writable without the sticky bit "
                                "(anyone could replace its folders): chmod o-w or chmod +t it")
        return fd

    def _open_folder(self, root_fd: int, name: str) -> int:
        try:
            os.mkdir(name, 0o755, dir_fd=root_fd)
        except FileExistsError:
            pass
        try:
            fd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=root_fd)
        except OSError as exc:
            raise UnsafeDropDir(f"drop directory {self.root}: {name}/ is not a directory the exporter "
                                f"can use ({exc.strerror}; a symlink is refused): remove it") from None
        problem = safefile.owner_problem(os.fstat(fd))
        if problem:
            os.close(fd)
            raise UnsafeDropDir(f"drop directory {self.root}: {name}/ is {problem}; another user "
                                f"could redirect imports: remove it (the exporter recreates it) or "
                                f"chown/chmod it")
        return fd

    # ------------------------------------------------------------------ API
    def setup(self) -> int:
        """Open the root and its folders (creating them); move files left in processing/ aside.
        Returns how many were moved.  Raises OSError (UnsafeDropDir) naming an unsafe folder."""
        self.close()
        root_fd = self._open_root()
        fds = {"root": root_fd}
        try:
            for name in _FOLDERS:
                fds[name] = self._open_folder(root_fd, name)
        except BaseException:
            for fd in fds.values():
                os.close(fd)
            raise
        self._fds = fds
        moved = 0
        for name in sorted(os.listdir(self._fd("processing"))):
            if name.endswith(SIDECAR):
                continue
            if self._plain_file("processing", name) is None:
                self._discard("processing", name)
                continue
            self._reject(name, "interrupted: the exporter stopped while importing this file; "
                               "drop it again to retry")
            moved += 1
        return moved

    def ready(self, now: float | None = None) -> list[Path]:
        now = time.time() if now is None else now
        out = []
        try:
            entries = list(os.scandir(self._fd("root")))
        except OSError:
            return []
        for e in entries:
            if e.name.startswith(".") or e.name.endswith(_IGNORED_SUFFIXES) or e.name in _FOLDERS:
                continue
            try:
                if not e.is_file(follow_symlinks=False):
                    continue
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if now - st.st_mtime >= self.settle:
                out.append((st.st_mtime, e.name))
        return [self.root / n for _, n in sorted(out)]

    def scan(self, now: float | None = None) -> list[Outcome]:
        """Claim every ready file, import each, move it to imported/ or rejected/."""
        if not self._fds:
            return []
        root, proc = self._fd("root"), self._fd("processing")
        claimed: list[str] = []
        for p in self.ready(now):
            dest = self._unique("processing", p.name)
            try:
                side = p.name + SIDECAR
                if self._plain_file("root", side) is not None:
                    os.rename(side, dest + SIDECAR, src_dir_fd=root, dst_dir_fd=proc)
                os.rename(p.name, dest, src_dir_fd=root, dst_dir_fd=proc)  # atomic
            except FileNotFoundError:
                continue  # claimed by someone else
            except OSError as exc:
                log.warning("profile claim failed", extra={"file": p.name, "reason": str(exc)})
                continue
            claimed.append(dest)
        return self._import_claimed(claimed)

    def adopt(self, staging_fd: int, names: list[str], meta: dict[str, str]) -> list[Outcome]:
        """Import the files of a finished capture from its private staging directory: each is
        moved (copied across filesystems) into processing/ with a sidecar holding ``meta``
        (the trace id), never through the drop root, then imported like a dropped file."""
        if not self._fds:
            return []
        claimed = []
        for name in names:
            try:
                claimed.append(self._take(staging_fd, name, meta))
            except OSError as exc:
                log.warning("capture file not imported", extra={"file": name, "reason": str(exc)})
        return self._import_claimed(claimed)

    def _take(self, staging_fd: int, name: str, meta: dict[str, str]) -> str:
        proc = self._fd("processing")
        src, st = safefile.open_regular(name, staging_fd, single_link=True)
        try:
            if st.st_size > self.max_bytes:
                raise safefile.TooLarge(errno.EFBIG, f"{st.st_size} bytes, above the import limit of "
                                                     f"{self.max_bytes}")
            dest = self._unique("processing", name)
            self._create(proc, dest + SIDECAR, (json.dumps(meta) + "\n").encode(), 0o644)
            try:
                self._move_in(src, st, staging_fd, name, dest)
            except BaseException:
                self._discard("processing", dest + SIDECAR)
                raise
        finally:
            os.close(src)
        return dest

    def _move_in(self, src: int, st: os.stat_result, staging_fd: int, name: str, dest: str) -> None:
        proc = self._fd("processing")
        try:
            os.rename(name, dest, src_dir_fd=staging_fd, dst_dir_fd=proc)
            return
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
        # another filesystem: copy through the opened fd, never more than max_bytes (the
        # capture command may still be writing to it: the size checked above is no bound)
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      stat.S_IMODE(st.st_mode) & 0o644, dir_fd=proc)
        try:
            with os.fdopen(out, "wb") as w:
                for chunk in safefile.chunks(src, self.max_bytes):
                    w.write(chunk)
        except BaseException:
            self._discard("processing", dest)
            raise

    def _import_claimed(self, claimed: list[str]) -> list[Outcome]:
        outcomes = []
        for name in claimed:  # all claimed first: companions of one run sit together in processing/
            # swapped for a symlink, a device or a hard link between the scan and the claim:
            # never opened, never moved where its content could be read
            if self._plain_file("processing", name) is None:
                self._discard("processing", name)
                outcomes.append(Outcome(name, reason="not a plain file with one link"))
                log.warning("profile rejected", extra={"file": name,
                                                       "reason": "not a plain file with one link"})
                continue
            try:
                got = self._read("processing", name)
            except CompanionFile as exc:
                outcomes.append(Outcome(name, reason=str(exc), companion=True))
                continue
            except ProfileRejected as exc:
                outcomes.append(Outcome(name, reason=str(exc), kind=exc.kind))
                self._reject(name, str(exc))
                continue
            outcomes.append(Outcome(name, profile=got.profile, result=got))
        for o in outcomes:
            if (o.profile is not None or o.companion) and self._plain_file("processing", o.name):
                self._move("processing", o.name, "imported")
        return outcomes

    @property
    def max_bytes(self) -> int:
        return self.importer.limits.max_bytes

    def _read(self, folder: str, name: str) -> Imported:
        """Parse one file of a held folder (``ProfileRejected``/``CompanionFile`` when not kept)."""
        got = self.importer(self._fd(folder), name, path=str(getattr(self, folder) / name), single_link=True,
                            cancel=self.stopping.is_set)
        got.profile.path = str(self.imported / name)
        return got

    def restore(self, limit: int) -> list[Outcome]:
        """Re-read the newest ``limit`` imported files (after a restart), oldest first (each with
        its devices and readings).  One that no longer imports (under today's limits too) is
        moved to rejected/ (once: it is never re-read at the next start)."""
        if not self._fds or limit <= 0:
            return []
        try:
            names = os.listdir(self._fd("imported"))
        except OSError:
            return []
        files = []
        for name in names:
            if name.endswith(SIDECAR):
                continue
            st = self._plain_file("imported", name)
            if st is not None:
                files.append((st.st_mtime_ns, name))
        files.sort()
        out = []
        for _, name in files[-limit:]:
            if self.stopping.is_set():
                break
            try:
                got = self._read("imported", name)
                out.append(Outcome(name, profile=got.profile, result=got))
            except CompanionFile:
                continue
            except ProfileRejected as exc:
                if exc.kind == "stopped":
                    break  # the daemon is stopping: not the file's fault
                self._reject(name, f"no longer imports at start: {exc}", folder="imported")
            except Exception as exc:  # noqa: BLE001 - worse: quarantine it
                self._reject(name, f"no longer imports at start: {exc}", folder="imported")
                continue
        return out

    # ------------------------------------------------------------------ helpers
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
