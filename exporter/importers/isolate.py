"""Each artifact parsed in a child process of its own, with kernel-enforced limits.

A profiler artifact is hostile until parsed: 64 KB of gzip can be a 63 MiB JSON list that costs
400 MB of Python objects, and a 28 MB SQLite file a million kernel rows.  The byte limit after
decompression bounds what is read, not what parsing it costs.  So the daemon (and the ``import``
command) never parses one itself:

- the parent opens the file under the ``safefile`` rule (held directory fd, ``O_NOFOLLOW``, a
  regular file with one link) and starts ``python -I -S`` with that fd and the directory's fd
  (``pass_fds``; nothing else is inherited);
- the child (``worker``) first lowers its own limits: address space ``memory_bytes``
  (``RLIMIT_AS``), CPU ``cpu_seconds`` (``RLIMIT_CPU``: SIGXCPU, then SIGKILL), files it
  writes (the private SQLite copy) ``max_bytes``, no core file; then it parses through the fd,
  converts under the per-import caps and answers one JSON document: only what is exported
  (devices, readings, a description), never the artifact's events (it imports the standard
  library and this package only: no site-packages, no environment);
- the parent reads at most ``1 MiB + 1 KiB x max_series`` of answer, kills the child at the
  wall-clock ``timeout`` or as soon as ``cancel()`` is true (the daemon is stopping), removes the
  child's temp folder, and checks every field of the answer before it builds anything from it.

A rejection names the limit it hit (``ProfileRejected.kind``): memory, time, events, size,
devices, series, output, crash, stopped.  Starting the child costs 60-80 ms per artifact
(measured on a busy 2-core box); imports are rare and run on their own thread.  The shipped
systemd unit allows this: Python lowers limits through ``prlimit64`` (in ``@default``), not
``setrlimit`` (``@resources``, denied); a child that cannot set them refuses to parse.  ``Importer(isolated=False)``
parses in the calling process (the parsers' own tests).
"""

from __future__ import annotations

import json
import os
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import safefile
from ..model import Device, PollResult, Reading
from .convert import checked_sample, summary
from .detect import MAX_BYTES, MAX_EVENTS, import_at, in_folder
from .model import CompanionFile, Profile, ProfileRejected, clean_profile
from .worker import BOOT

_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent.parent)  # the folder holding exporter/
_SQLITE_SHARE = 0.9  # of the timeout: the child's own SQLite deadline answers first when it can
_MAX_TEXT = 4096


@dataclass(frozen=True)
class ImportLimits:
    """What one artifact may cost (``collectors.profiles.options``)."""

    max_bytes: int = MAX_BYTES              # max_file_bytes: read, after decompression
    max_events: int = MAX_EVENTS            # max_events_per_import
    max_devices: int = 16                   # max_devices_per_import
    max_series: int = 20000                 # max_series_per_import
    memory_bytes: int = 768 << 20           # import_memory_bytes: the child's address space
    cpu_seconds: int = 60                   # import_cpu_seconds
    timeout: float = 120.0                  # import_timeout: wall clock

    @property
    def answer_bytes(self) -> int:
        return (1 << 20) + 1024 * self.max_series


@dataclass
class Imported:
    """One parsed artifact: its description (a ``Profile`` without kernels and ranges when it was
    parsed in a child), its devices and readings, and the ``import`` command's summary."""

    profile: Profile
    devices: list[Device]
    sample: PollResult
    summary: dict | None = None
    child_rss_bytes: int = 0  # the child's peak resident memory (0: parsed in this process)


class Importer:
    """``importer(dir_fd, name, ...)`` -> ``Imported``, or ``ProfileRejected`` (``CompanionFile``)."""

    def __init__(self, limits: ImportLimits = ImportLimits(), top_n: int = 10,
                 allowed: dict[str, set[str]] | None = None, *, summary: bool = False,
                 isolated: bool = True) -> None:
        self.limits, self.top_n, self.allowed = limits, top_n, allowed
        self.summary, self.isolated = summary, isolated

    def __call__(self, dir_fd: int, name: str, *, path: str | None = None, single_link: bool = False,
                 trace_id: str | None = None, cancel: Callable[[], bool] | None = None) -> Imported:
        if not self.isolated:
            return self._here(dir_fd, name, path, single_link, trace_id, cancel)
        try:
            fd, st = safefile.open_regular(name, dir_fd, single_link=single_link)
        except safefile.Refused as exc:
            raise ProfileRejected(f"not read: {exc}") from None
        except OSError as exc:
            raise ProfileRejected(f"unreadable: {type(exc).__name__}: {exc}") from None
        try:
            if st.st_size == 0:
                raise ProfileRejected("empty file")
            if st.st_size > self.limits.max_bytes:
                raise ProfileRejected(f"file is {st.st_size} bytes, above the import limit max_file_bytes "
                                      f"({self.limits.max_bytes})", "size")
            return self._child(fd, dir_fd, name, path or name, single_link, trace_id, cancel)
        finally:
            os.close(fd)

    def file(self, path: str | os.PathLike, trace_id: str | None = None) -> Imported:
        """A path the caller named (the ``import`` command: a symlink the user typed is resolved)."""
        return in_folder(path, lambda dir_fd, name: self(dir_fd, name, path=str(path), trace_id=trace_id))

    # ------------------------------------------------------------------ in this process
    def _here(self, dir_fd: int, name: str, path: str | None, single_link: bool, trace_id: str | None,
              cancel: Callable[[], bool] | None) -> Imported:
        lim = self.limits
        prof = clean_profile(import_at(dir_fd, name, trace_id=trace_id, max_bytes=lim.max_bytes, path=path,
                                       single_link=single_link, cancel=cancel, max_events=lim.max_events))
        devices, sample = checked_sample(prof, self.top_n, self.allowed, lim.max_devices, lim.max_series)
        return Imported(prof, devices, sample, summary(prof, self.top_n) if self.summary else None)

    # ------------------------------------------------------------------ in a child
    def _child(self, fd: int, dir_fd: int, name: str, path: str, single_link: bool, trace_id: str | None,
               cancel: Callable[[], bool] | None) -> Imported:
        lim = self.limits
        tmp = tempfile.mkdtemp(prefix="ugx-import-")  # 0700: the child's private SQLite copy
        request = json.dumps({
            "fd": fd, "dir_fd": dir_fd, "name": name, "path": path, "single_link": single_link,
            "trace_id": trace_id, "max_bytes": lim.max_bytes, "max_events": lim.max_events,
            "max_devices": lim.max_devices, "max_series": lim.max_series, "top_n": self.top_n,
            "allowed": {k: sorted(v) for k, v in self.allowed.items()} if self.allowed is not None else None,
            "summary": self.summary, "tmp_dir": tmp, "timeout": lim.timeout * _SQLITE_SHARE,
            "heap_limit": lim.memory_bytes // 2}).encode()
        argv = [sys.executable, "-I", "-S", "-c", BOOT, str(lim.memory_bytes), str(lim.cpu_seconds),
                str(lim.max_bytes + (1 << 20)), _PACKAGE_ROOT]
        try:
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, pass_fds=(fd, dir_fd), cwd="/", env={})
            except OSError as exc:
                raise ProfileRejected(f"the import worker could not start: {exc}", "crash") from None
            out, err, stopped, status, usage = _talk(proc, request, time.monotonic() + lim.timeout,
                                                   lim.answer_bytes, cancel)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if stopped == "stopped":
            raise ProfileRejected("stopped at shutdown (import not finished)", "stopped")
        if stopped == "time":
            raise ProfileRejected(f"not parsed within the time limit import_timeout ({lim.timeout:g} s)", "time")
        if stopped == "output":
            raise ProfileRejected(f"the import worker's answer is above {lim.answer_bytes} bytes", "output")
        if status < 0 or not out:
            raise _died(status, err, usage.ru_utime + usage.ru_stime, lim)
        imported = _decode(out, lim)
        imported.child_rss_bytes = usage.ru_maxrss * 1024
        return imported


def _talk(proc: subprocess.Popen, request: bytes, deadline: float, cap: int,
          cancel: Callable[[], bool] | None) -> tuple[bytes, bytes, str, int, resource.struct_rusage]:
    """Send the request, collect the answer (at most ``cap`` bytes) and stderr's tail; kill the
    child at ``deadline``, on ``cancel()`` or above ``cap``.  Returns (stdout, stderr tail, why it
    was killed or "", exit status (-signal), the child's resource usage)."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    out, err, why, sent = bytearray(), bytearray(), "", 0
    sel = selectors.DefaultSelector()
    for f in (proc.stdin, proc.stdout, proc.stderr):
        os.set_blocking(f.fileno(), False)
    sel.register(proc.stdin, selectors.EVENT_WRITE)
    sel.register(proc.stdout, selectors.EVENT_READ)
    sel.register(proc.stderr, selectors.EVENT_READ)
    try:
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
    finally:
        sel.close()
        if why:
            proc.kill()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            if not f.closed:
                f.close()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    return bytes(out), bytes(err), why, proc.returncode, usage


def _died(status: int, err: bytes, cpu: float, lim: ImportLimits) -> ProfileRejected:
    tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
    if status == -signal.SIGXCPU or (status == -signal.SIGKILL and cpu >= lim.cpu_seconds):
        return ProfileRejected(f"not parsed within the CPU limit import_cpu_seconds ({lim.cpu_seconds} s)", "time")
    if "MemoryError" in tail[0] or status in (-signal.SIGSEGV, -signal.SIGABRT, -signal.SIGKILL, -signal.SIGBUS):
        return ProfileRejected(f"the import worker died ({_how(status)}) under the memory limit "
                               f"import_memory_bytes ({lim.memory_bytes}): {tail[0][:200]}", "memory")
    return ProfileRejected(f"the import worker failed ({_how(status)}): {tail[0][:200]}", "crash")


def _how(status: int) -> str:
    if status < 0:
        try:
            return signal.Signals(-status).name
        except ValueError:
            return f"signal {-status}"
    return f"exit status {status}"


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} in the import worker's answer")


def _decode(data: bytes, lim: ImportLimits) -> Imported:
    """The child's answer, every field checked (it describes a hostile file)."""
    try:
        doc = json.loads(data, parse_constant=_no_constant)
        return _build(doc, lim)
    except ProfileRejected:
        raise
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise ProfileRejected(f"the import worker's answer is not valid ({type(exc).__name__}: "
                              f"{str(exc)[:200]})", "crash") from None


def _s(value: object, limit: int = _MAX_TEXT) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise TypeError("a string expected")
    return value


def _build(doc: dict, lim: ImportLimits) -> Imported:
    if not doc["ok"]:
        kind = _s(doc.get("kind", ""), 32)
        reason = _s(doc["reason"])
        raise CompanionFile(reason) if doc.get("companion") is True else ProfileRejected(reason, kind)
    p = doc["profile"]
    wall = p["wall_zero_ns"]
    if wall is not None and type(wall) is not int:
        raise TypeError("wall_zero_ns")
    prof = Profile(tool=_s(p["tool"], 32), variant=_s(p["variant"], 200), path=_s(p["path"]),
                   trace_id=_s(p["trace_id"], 64), trace_id_from=_s(p["trace_id_from"], 32), wall_zero_ns=wall,
                   warnings=[_s(w) for w in p["warnings"][:50]])
    fields = ("key", "vendor", "index", "mapping", "uuid", "model", "pci_bus_id")
    devices = [Device(**{f: _s(d[f], 512) for f in fields}) for d in doc["devices"]]
    if len(devices) > lim.max_devices or len(doc["readings"]) > lim.max_series:
        raise ProfileRejected("the import worker's answer is above the per-import caps", "crash")
    labels = [tuple((_s(k, 128), _s(v, 1024)) for k, v in ls) for ls in doc["labels"]]
    sample = PollResult(devices=devices)
    for dev, field, value, li in doc["readings"]:
        if type(value) not in (int, float) or type(dev) is not int or type(li) is not int or dev < 0 or li < 0:
            raise TypeError("a reading")
        sample.readings.append(Reading(devices[dev].key, _s(field, 256), float(value), labels[li]))
    sample.errors = Counter({_s(k, 64): int(v) for k, v in doc["errors"].items()})
    summ = doc["summary"]
    if summ is not None and not isinstance(summ, dict):
        raise TypeError("summary")
    return Imported(prof, devices, sample, summ)
