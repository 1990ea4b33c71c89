"""Each artifact parsed in a child process of its own, with kernel-enforced limits.

A profiler artifact is hostile until parsed: 64 KB of gzip can be a 63 MiB JSON list that costs
400 MB of Python objects, and a 28 MB SQLite file a million kernel rows.  The byte limit after
decompression bounds what is read, not what parsing it costs.  So the daemon (and the ``import``
command) never parses one itself:

- the parent opens the file under the ``safefile`` rule (held directory fd, ``O_NOFOLLOW``, a
  regular file with one link), and the siblings a parser may read (``siblings.open_wanted``),
  and starts ``python -I -S`` with those fds (``pass_fds``; nothing else is inherited but the
  package folder's, closed once the package is imported) as an unprivileged user where it can
  (``spawn``: as root, a uid of its own);
- the child (``worker``) first ignores the stop signals, offers itself to the OOM killer, drops
  any capability it still has and lowers its own limits: address space ``memory_bytes``
  (``RLIMIT_AS``), CPU ``cpu_seconds`` (``RLIMIT_CPU``: SIGXCPU, then SIGKILL), files it
  writes ``max_bytes``, no core file; then it parses through the fds, converts under the
  per-import caps and answers one JSON document: only what is exported (devices, readings, a
  description), never the artifact's events (it imports the standard library and this package
  only: no site-packages, no environment but ``LD_LIBRARY_PATH``);
- an nsys SQLite file (seen by its header) gets a fresh 0700 folder for its private copy, made
  in the ``scratch`` folder the caller holds (the drop directory's ``scratch/``; the ``import``
  command: a private folder in the temp dir), handed over as an fd and removed afterwards; no
  other file needs one;
- the parent reads at most ``1 MiB + 1 KiB x max_series`` of answer, kills the child at the
  wall-clock ``timeout``, as soon as ``cancel()`` is true (the daemon is stopping) or when it
  leaves early through an exception, and checks every field of the answer (``answer.decode``).

A rejection names the limit it hit (``ProfileRejected.kind``): memory, time, events, size,
devices, series, output, crash.  Three outcomes are no fault of the file and reject nothing
(``ProfileRejected.deferred``): ``stopped`` (the daemon stopped it, or it died while the daemon
was stopping), ``environment`` (no worker could be started, no room for the private copy) and
``killed`` (the worker died of a signal no limit of ours sends and the parse did not raise: a
kill from outside, or the OOM killer; once per file: killed again, the file is rejected as a
crash or memory, so a file that gets its worker killed cannot be retried for ever).
``probe()`` (at the profiles source's ``open``) starts a worker that parses nothing, to find
out whether one can run at all, and fits ``memory_bytes`` under the cgroup's memory limit.
Starting the child costs 60-80 ms per artifact (measured on a busy 2-core box); imports are
rare and run on their own thread.  The shipped systemd unit allows this: Python lowers limits
through ``prlimit64`` (in ``@default``), not ``setrlimit`` (``@resources``, denied).
``Importer(isolated=False)`` parses in the calling process (the parsers' own tests).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import resource
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

from .. import safefile
from . import siblings, spawn
from .answer import MIN_MEMORY_BYTES, Imported, ImportLimits
from .answer import decode as _decode
from .convert import converted
from .detect import SQLITE_MAGIC, check_size, import_at, in_folder, rejection, sniff
from .model import ProfileRejected
from .worker import BOOT

__all__ = ["Imported", "ImportLimits", "Importer", "_decode"]
log = logging.getLogger("unified_gpu_exporter")
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent.parent)  # the folder holding exporter/
_SQLITE_SHARE = 0.9  # of the timeout: the child's own SQLite deadline answers first when it can
_MAX_TEXT = 4096
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Importer:
    """``importer(dir_fd, name, ...)`` -> ``Imported``, or ``ProfileRejected`` (``CompanionFile``)."""

    def __init__(self, limits: ImportLimits | None = None, top_n: int = 10,
                 allowed: dict[str, set[str]] | None = None, *, summary: bool = False,
                 isolated: bool = True) -> None:
        self.limits, self.top_n, self.allowed = limits or ImportLimits(), top_n, allowed
        self.summary, self.isolated = summary, isolated
        self.python = spawn.interpreter(sys.executable)
        self.creds: dict | None = None  # Popen keywords of the worker's user; None: not decided yet
        self._killed: set[tuple] = set()  # files whose worker was killed once (dev, ino, size, mtime)

    def __call__(self, dir_fd: int, name: str, *, path: str | None = None, single_link: bool = False,
                 trace_id: str | None = None, cancel: Callable[[], bool] | None = None,
                 scratch: int | None = None) -> Imported:
        """``scratch``: a folder fd where an SQLite file's private copy may go (default: a
        private folder in the temp dir)."""
        if not self.isolated:
            return self._here(dir_fd, name, path, single_link, trace_id, cancel)
        try:
            fd, st = safefile.open_regular(name, dir_fd, single_link=single_link)
        except OSError as exc:
            raise rejection(exc) from None
        try:
            check_size(st, self.limits.max_bytes)
            sniff(fd, st.st_size)  # junk is rejected here, without a worker
            key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            return self._child(fd, dir_fd, name, path or name, single_link, trace_id, cancel, scratch, key)
        finally:
            os.close(fd)

    def file(self, path: str | os.PathLike, trace_id: str | None = None) -> Imported:
        """A path the caller named (the ``import`` command: a symlink the user typed is resolved)."""
        return in_folder(path, lambda dir_fd, name: self(dir_fd, name, path=str(path), trace_id=trace_id))

    def probe(self) -> list[str]:
        """Start a worker that parses nothing: as root, under a uid of its own (``spawn.own_user``),
        else (with a warning) as uid 65534, else as uid 0 without capabilities; fit
        ``memory_bytes`` under the cgroup's memory limit.  Returns the warnings; raises
        ProfileRejected (``environment``) when no worker runs."""
        warnings = self._fit_memory()
        if os.geteuid() != 0:
            self._probe({})
            self.creds = {}
            return warnings
        own = spawn.own_user()
        why_not_own = "no unused uid found"
        if own is not None:
            try:
                self._probe(own)
                self.creds = own
                return warnings
            except ProfileRejected as exc:
                why_not_own = str(exc)
        try:
            self._probe(spawn.as_nobody())
            self.creds = spawn.as_nobody()
            warnings.append(f"the import worker runs as the shared uid {spawn.NOBODY}, not under a uid of its own "
                            f"({why_not_own}; a user namespace that maps 65536 uids only?): other processes "
                            f"of uid {spawn.NOBODY} can signal it")
        except ProfileRejected as exc:
            self._probe({})
            self.creds = {}
            warnings.append(spawn.uid0_warning(self.python, str(exc)))
        return warnings

    def _probe(self, creds: dict) -> None:
        out, err, _, status, _ = self._run(b'{"probe": true}', (), creds, None, max(self.limits.timeout, 30.0))
        if status != 0 or out != b'{"ok":true,"probe":true}':
            why = _tail(err) or out[:200].decode("utf-8", "replace") or _how(status)
            raise ProfileRejected(f"the import worker does not start ({why})", "environment")

    def _fit_memory(self) -> list[str]:
        room = spawn.memory_room()
        lim = self.limits
        if room is None or room >= lim.memory_bytes:
            return []
        if room >= MIN_MEMORY_BYTES:
            self.limits = dataclasses.replace(lim, memory_bytes=room)
            return [f"the memory limit of this cgroup (a pod's or unit's memory.max) leaves {room >> 20} MiB "
                    f"beside the exporter: import_memory_bytes is lowered from {lim.memory_bytes >> 20} to "
                    f"{room >> 20} MiB (raise the limit to import larger artifacts)"]
        return [f"the memory limit of this cgroup (a pod's or unit's memory.max) leaves {room >> 20} MiB beside "
                f"the exporter, less than an import worker needs: raise it by import_memory_bytes "
                f"({lim.memory_bytes >> 20} MiB)"]

    # ------------------------------------------------------------------ in this process
    def _here(self, dir_fd: int, name: str, path: str | None, single_link: bool, trace_id: str | None,
              cancel: Callable[[], bool] | None) -> Imported:
        lim = self.limits
        prof = import_at(dir_fd, name, trace_id=trace_id, max_bytes=lim.max_bytes, path=path,
                         single_link=single_link, cancel=cancel, max_events=lim.max_events)
        return Imported(*converted(prof, self.top_n, self.allowed, lim.max_devices, lim.max_series, self.summary))

    # ------------------------------------------------------------------ in a child
    def _child(self, fd: int, dir_fd: int, name: str, path: str, single_link: bool, trace_id: str | None,
               cancel: Callable[[], bool] | None, scratch: int | None, key: tuple = ()) -> Imported:
        lim = self.limits
        if self.creds is None:
            for warning in self.probe():
                log.warning(warning)
        creds = self.creds or {}
        opened = siblings.open_wanted(dir_fd, name, single_link=single_link)
        work: _Scratch | None = None
        try:
            if _sqlite_header(fd):
                try:
                    work = _Scratch(scratch, creds)
                except OSError as exc:
                    raise ProfileRejected(f"no private folder for the SQLite copy: {exc}", "environment") from None
            request = json.dumps({
                "fd": fd, "siblings": opened, "name": name, "path": path, "single_link": single_link,
                "trace_id": trace_id, "max_bytes": lim.max_bytes, "max_events": lim.max_events,
                "max_devices": lim.max_devices, "max_series": lim.max_series, "top_n": self.top_n,
                "allowed": {k: sorted(v) for k, v in self.allowed.items()} if self.allowed is not None else None,
                "summary": self.summary, "tmp_fd": work.fd if work is not None else None,
                "timeout": lim.timeout * _SQLITE_SHARE, "heap_limit": lim.memory_bytes // 2}).encode()
            fds = (fd, *(v for v in opened.values() if isinstance(v, int)), *((work.fd,) if work else ()))
            out, err, stopped, status, usage = self._run(request, fds, creds, cancel, lim.timeout)
        finally:
            siblings.close(opened)
            if work is not None:
                work.remove()
        if stopped == "stopped" or ((status != 0 or not out) and (
                -status in spawn.STOP_SIGNALS or (cancel is not None and cancel()))):
            # killed at shutdown, or died while the daemon was stopping: never the file's fault
            raise ProfileRejected("stopped at shutdown (import not finished)", "stopped")
        if stopped == "time":
            raise ProfileRejected(f"not parsed within the time limit import_timeout ({lim.timeout:g} s)", "time")
        if stopped == "output":
            raise ProfileRejected(f"the import worker's answer is above {lim.answer_bytes} bytes", "output")
        if status < 0 or not out:
            died = _died(status, err, usage.ru_utime + usage.ru_stime, lim)
            if _unexplained(status, err, usage.ru_utime + usage.ru_stime, lim) and key not in self._killed:
                # killed by a signal no limit of ours sends (another process, the OOM killer):
                # deferred once; the same file killed again is rejected as before
                if len(self._killed) >= _MAX_KILLED:
                    self._killed.clear()
                self._killed.add(key)
                raise ProfileRejected(f"the import worker was killed ({_how(status)}), not by a limit: "
                                      f"tried again once ({died})", "killed")
            self._killed.discard(key)
            raise died
        self._killed.discard(key)
        return _decode(out, lim, self.allowed)

    def _run(self, request: bytes, fds: tuple[int, ...], creds: dict, cancel: Callable[[], bool] | None,
             timeout: float) -> tuple[bytes, bytes, str, int, resource.struct_rusage]:
        lim = self.limits
        try:  # the package by fd: its folder may be out of the worker's reach by path (spawn)
            pkg = os.open(_PACKAGE_ROOT, _DIR_FLAGS)
        except OSError as exc:
            raise ProfileRejected(f"the import worker could not start: {exc}", "environment") from None
        argv = [self.python, "-I", "-S", "-c", BOOT, str(lim.memory_bytes), str(lim.cpu_seconds),
                str(lim.max_bytes + (1 << 20)), f"/proc/self/fd/{pkg}"]
        try:
            proc = spawn.spawn(argv, (*fds, pkg), creds)
        except (OSError, subprocess.SubprocessError) as exc:
            raise ProfileRejected(f"the import worker could not start: {exc}", "environment") from None
        finally:
            os.close(pkg)
        try:
            return _talk(proc, request, time.monotonic() + timeout, lim.answer_bytes, cancel)
        except OSError as exc:  # a pipe: the environment, not the file
            raise ProfileRejected(f"talking to the import worker failed: {exc}", "environment") from None


class _Scratch:
    """A fresh 0700 folder for one SQLite copy, owned by the worker's user, in ``base_fd`` (held
    by the caller) or else in a private folder made in the temp dir; ``fd`` goes to the worker.
    SQLite opens the copy by path and resolves every symlink on it (``/proc/self/fd/N`` too), so
    a worker running as another user needs a folder it can reach by path: ``base_fd`` is used
    for it only when every folder above it lets others through (``o+x``)."""

    def __init__(self, base_fd: int | None, creds: dict) -> None:
        if base_fd is not None and creds and not _reachable_by_others(base_fd):
            base_fd = None
        if base_fd is None:
            made = safefile.private_dir(None, "ugx-import-")
            self._base, self._own, self.name = safefile.open_dir(made.parent), True, made.name
        else:
            self._base, self._own, self.name = base_fd, False, f"import-{secrets.token_hex(8)}"
            os.mkdir(self.name, 0o700, dir_fd=base_fd)
        try:
            self.fd = os.open(self.name, _DIR_FLAGS, dir_fd=self._base)
            if creds:
                os.fchown(self.fd, creds["user"], creds["group"])
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        if getattr(self, "fd", None) is not None:
            os.close(self.fd)
            self.fd = None
        shutil.rmtree(self.name, ignore_errors=True, dir_fd=self._base)
        if self._own:
            os.close(self._base)
            self._own = False


def _reachable_by_others(dir_fd: int) -> bool:
    try:
        real = Path(os.readlink(f"/proc/self/fd/{dir_fd}"))
        return all(os.stat(p).st_mode & 0o001 for p in (real, *real.parents))
    except OSError:
        return False


def _sqlite_header(fd: int) -> bool:
    """Whether the file starts as SQLite (inside its first gzip member when gzipped): read at
    most 4 KiB and inflate at most 16 bytes, never more, in the parent."""
    try:
        head = os.pread(fd, 4096, 0)
        if head.startswith(safefile.GZIP_MAGIC):
            head = zlib.decompressobj(31).decompress(head, len(SQLITE_MAGIC))
    except (OSError, zlib.error):
        return False
    return head.startswith(SQLITE_MAGIC)


def _talk(proc: subprocess.Popen, request: bytes, deadline: float, cap: int,
          cancel: Callable[[], bool] | None) -> tuple[bytes, bytes, str, int, resource.struct_rusage]:
    """Send the request, collect the answer (at most ``cap`` bytes) and stderr's tail; kill the
    child at ``deadline``, on ``cancel()``, above ``cap`` or when leaving through an exception.
    Returns (stdout, stderr tail, why it was killed or "", exit status (-signal), the child's
    resource usage)."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    out, err, why, sent, done = bytearray(), bytearray(), "", 0, False
    sel = selectors.DefaultSelector()
    try:
        for f in (proc.stdin, proc.stdout, proc.stderr):
            os.set_blocking(f.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE)
        sel.register(proc.stdout, selectors.EVENT_READ)
        sel.register(proc.stderr, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if cancel is not None and cancel():
                why = "stopped"
            elif left <= 0:
                why = "time"
            if why:
                break
            for key, _ in sel.select(min(0.1, left)):
                f = key.fileobj
                if f is proc.stdin:
                    try:
                        sent += os.write(proc.stdin.fileno(), request[sent:sent + 65536])
                    except BrokenPipeError:
                        sent = len(request)
                    if sent >= len(request):
                        sel.unregister(f)
                        proc.stdin.close()
                    continue
                data = os.read(f.fileno(), 65536)  # type: ignore[union-attr]
                if not data:
                    sel.unregister(f)
                elif f is proc.stdout:
                    out += data
                    if len(out) > cap:
                        why = "output"
                        break
                else:
                    err = (err + data)[-_MAX_TEXT:]
            if why:
                break
        done = True
    finally:
        sel.close()
        if why or not done:  # a limit, a stop, or an exception: never wait on a live child
            proc.kill()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            if not f.closed:
                f.close()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    return bytes(out), bytes(err), why, proc.returncode, usage


_MAX_KILLED = 1024
# signals the parsing itself raises (a crash) or our limits send (SIGXCPU, SIGKILL a second
# later: counted by the CPU time used)
_FILE_SIGNALS = {signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGSYS,
                 signal.SIGXCPU, signal.SIGXFSZ}


def _unexplained(status: int, err: bytes, cpu: float, lim: ImportLimits) -> bool:
    """A death by a signal that neither the file's parse (a crash, a MemoryError) nor one of our
    limits explains: someone (or the kernel's OOM killer) killed the worker."""
    if status >= 0 or -status in _FILE_SIGNALS or "MemoryError" in _tail(err):
        return False
    return not (status == -signal.SIGKILL and cpu >= lim.cpu_seconds)


def _tail(err: bytes) -> str:
    return (err.decode("utf-8", "replace").strip().splitlines()[-1:] or [""])[0][:200]


def _died(status: int, err: bytes, cpu: float, lim: ImportLimits) -> ProfileRejected:
    tail = _tail(err)
    if status == -signal.SIGXCPU or (status == -signal.SIGKILL and cpu >= lim.cpu_seconds):
        return ProfileRejected(f"not parsed within the CPU limit import_cpu_seconds ({lim.cpu_seconds} s)", "time")
    if "MemoryError" in tail or status in (-signal.SIGSEGV, -signal.SIGABRT, -signal.SIGKILL, -signal.SIGBUS):
        return ProfileRejected(f"the import worker died ({_how(status)}) under the memory limit "
                               f"import_memory_bytes ({lim.memory_bytes}): {tail}", "memory")
    return ProfileRejected(f"the import worker failed ({_how(status)}): {tail}", "crash")


def _how(status: int) -> str:
    if status < 0:
        try:
            return signal.Signals(-status).name
        except ValueError:
            return f"signal {-status}"
    return f"exit status {status}"
