"""The watched drop directory: every file imported once, atomically, bad files set aside.

Layout under ``root``::

    root/              producers write here (write ``x.tmp`` / ``.x`` then rename: those are ignored)
    root/processing/   files claimed by one scan (rename: atomic on one filesystem)
    root/imported/     imported files (and companions such as hip_api_trace, sysinfo)
    root/rejected/     bad files, each with ``<name>.reason`` saying why
    root/scratch/      the private copy of an SQLite file (a 0700 folder) while it is imported

A file is claimed once it has not changed for ``settle`` seconds, at most ``CLAIM_BURST`` at once
and ``CLAIMS_PER_MINUTE`` after that (the rest wait in the root; ``waiting`` counts them), and
before a worker starts for it the importer sniffs its head in the parent (``detect.sniff``): a
small file no parser recognises is rejected without a worker.  A sidecar
``<name>.meta.json`` ({"trace_id": ...}) travels with its file.  Files of a triggered capture
never pass through the root: ``adopt`` moves (or copies) them from the capture's private
staging directory straight into processing/ and imports them.  An import that is no fault of
the file (``ProfileRejected.deferred``: the exporter is stopping, or no import worker could be
started) rejects nothing: the file goes back to the root and is claimed again by a later scan
(after a restart, at once); at start-up restore it stays in imported/.  Files left in
processing/ by a daemon that died mid-import are moved to rejected/ at start (not retried: a
file that crashed or hung the importer must not do it again); drop them again to retry.  An
imported file that no longer imports at start (``restore``) is moved to rejected/ once, never
re-read.

The root is writable by other users (the producers), so it is handled like a spool someone else
owns.  ``setup()`` opens the root and the four folders once and keeps the directory fds; every
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
import shutil
import stat
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from .. import safefile
from .isolate import Imported, Importer
from .model import CompanionFile, Profile, ProfileRejected
from .siblings import SIDECAR
from .spool import Spool

log = logging.getLogger("unified_gpu_exporter")
_IGNORED_SUFFIXES = (".tmp", ".part", ".partial", ".reason", ".crdownload", SIDECAR)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_FOLDERS = ("processing", "imported", "rejected", "scratch")
# files claimed from the root: a bucket of CLAIM_BURST refilled at CLAIMS_PER_MINUTE (issue 37: a
# flood of junk files cost seconds of CPU each); the rest wait in the root for a later scan
CLAIMS_PER_MINUTE = 120
CLAIM_BURST = 120


class UnsafeDropDir(OSError):
    """The drop directory's folders have an owner or mode that would let others redirect us."""


@dataclass
class Outcome:
    name: str
    reason: str = ""
    companion: bool = False
    result: Imported | None = None  # its description, devices and readings
    kind: str = ""  # the limit a rejected file hit (ProfileRejected.kind)
    deferred: bool = False  # not the file's fault (stopping, environment): left to be tried again

    @property
    def profile(self) -> Profile | None:
        """The imported file's description (no kernels when parsed in a child); None when not imported."""
        return self.result.profile if self.result is not None else None


class DropDir(Spool):
    def __init__(self, root: str | os.PathLike, settle: float = 1.0, max_bytes: int | None = None,
                 importer: Importer | None = None):
        super().__init__()
        self.root = Path(root)
        self.processing = self.root / "processing"
        self.imported = self.root / "imported"
        self.rejected = self.root / "rejected"
        self.settle = settle
        self.importer = importer if importer is not None else Importer()
        if max_bytes is not None:
            self.importer.limits = replace(self.importer.limits, max_bytes=max_bytes)
        self.stopping = threading.Event()  # set: a running import stops at once
        self._tokens, self._refilled = float(CLAIM_BURST), time.monotonic()
        self.waiting = 0  # ready files the last scan left in the root (the claim rate)

    def _take_token(self) -> bool:
        now = time.monotonic()
        self._tokens = min(float(CLAIM_BURST), self._tokens + (now - self._refilled) * CLAIMS_PER_MINUTE / 60)
        self._refilled = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    # ------------------------------------------------------------------ directory fds
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
        try:  # scratch/: private copies of SQLite files (each in a 0700 folder) while they are imported
            os.mkdir(name, 0o711 if name == "scratch" else 0o755, dir_fd=root_fd)
        except FileExistsError:
            pass
        try:
            fd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=root_fd)
        except OSError as exc:
            raise UnsafeDropDir(f"drop directory {self.root}: {name}/ is not a directory the exporter "
                                f"can use ({exc.strerror}; a symlink is refused): remove it") from None
        st = os.fstat(fd)
        problem = safefile.owner_problem(st)
        if problem:
            os.close(fd)
            raise UnsafeDropDir(f"drop directory {self.root}: {name}/ is {problem}; another user "
                                f"could redirect imports: remove it (the exporter recreates it) or "
                                f"chown/chmod it")
        if name == "scratch" and stat.S_IMODE(st.st_mode) & 0o777 != 0o711:
            os.fchmod(fd, 0o711)  # not the umask's: a worker running as uid 65534 passes through
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
        for name in os.listdir(fds["scratch"]):  # left by an import the exporter did not finish
            shutil.rmtree(name, ignore_errors=True, dir_fd=fds["scratch"])
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
        ready = self.ready(now)
        waiting = 0
        for i, p in enumerate(ready):
            if not self._take_token():
                waiting = len(ready) - i
                if not self.waiting:  # once per episode
                    log.warning("more profiles dropped than the claim rate: the rest wait in the drop directory",
                                extra={"waiting": waiting, "per_minute": CLAIMS_PER_MINUTE})
                break
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
        self.waiting = waiting
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
            if self.stopping.is_set():  # not started: back to the root for the next start
                outcomes.append(Outcome(name, reason="stopped at shutdown", kind="stopped", deferred=True))
                self._unclaim(name, "stopped at shutdown (import not started)")
                continue
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
                outcomes.append(Outcome(name, reason=str(exc), kind=exc.kind, deferred=exc.deferred))
                if exc.deferred:  # stopping, or no worker could run: no fault of the file
                    self._unclaim(name, str(exc))
                else:
                    self._reject(name, str(exc))
                continue
            outcomes.append(Outcome(name, result=got))
        for o in outcomes:
            if (o.profile is not None or o.companion) and self._plain_file("processing", o.name):
                self._move("processing", o.name, "imported")
        return outcomes

    @property
    def max_bytes(self) -> int:
        return self.importer.limits.max_bytes

    def _read(self, folder: str, name: str) -> Imported:
        """Parse one file of a held folder (``ProfileRejected``/``CompanionFile`` when not kept;
        any OSError of the environment is a deferred ``ProfileRejected``)."""
        try:
            got = self.importer(self._fd(folder), name, path=str(getattr(self, folder) / name), single_link=True,
                                cancel=self.stopping.is_set, scratch=self._fd("scratch"))
        except OSError as exc:
            raise ProfileRejected(f"not imported now: {type(exc).__name__}: {exc}", "environment") from None
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
                out.append(Outcome(name, result=got))
            except CompanionFile:
                continue
            except Exception as exc:  # noqa: BLE001 - a rejection, or worse: quarantine it
                if isinstance(exc, ProfileRejected) and exc.deferred:
                    if exc.kind == "stopped":
                        break  # the daemon is stopping: not the file's fault
                    # no worker could run: left in imported/ for the next start
                    out.append(Outcome(name, reason=str(exc), kind=exc.kind, deferred=True))
                    log.warning("imported profile not restored", extra={"file": name, "reason": str(exc)})
                    continue
                self._reject(name, f"no longer imports at start: {exc}", folder="imported")
        return out
