"""The counting process (never imported by the serving process itself).

``counter.Counter`` starts ``python -I -S -B -c BOOT`` from the serving process's main thread,
before that process drops its capabilities.  ``BOOT`` runs first, before anything is read:

- ``PR_SET_PDEATHSIG`` SIGKILL (it dies with the serving process) and ignores SIGTERM, SIGINT,
  SIGHUP (systemd signals the whole unit at stop: the serving process stops it);
- ``PR_SET_DUMPABLE`` 0: no process without CAP_SYS_PTRACE may trace it, read its memory or
  its ``/proc`` entries, or take its descriptors (the serving process included);
- ``PR_SET_NO_NEW_PRIVS``; every capability but CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH dropped
  from the bounding set (where it may: CAP_SETPCAP), from the permitted and effective sets
  (``capset``), ambient and inheritable emptied, and checked in ``/proc/self/status``; no core
  file.

Then ``supervise`` waits on the control socket.  Each message is one byte and one descriptor:
a fresh socket of a new session.  It kills the previous scanner, if any, and forks a new one
(``serve``) on that socket; the serving process asks for a session at its first poll and after
every bad answer, so a scanner that answered badly (late, oversized, malformed) or died is
replaced, with the capabilities only this process still holds.  ``serve`` answers requests
(``answer.py``): a ``fdinfo_records.LocalScanner`` scan, as numbers.  When the serving process
closes the control socket (or dies), both exit.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import sys

from .caps import PR_SET_PDEATHSIG, SOURCE, prctl

_scan: dict = {}  # what a scanner needs, imported by the supervisor before it says it is ready


def preload() -> None:
    """Import everything a scanner runs, in the supervisor, before it reports ready.  A scanner
    is forked after the serving process has handled untrusted input: were it to import from disk
    then, a compromised serving process able to write the package folder (or its
    ``__pycache__``) could plant code that runs with CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH.
    Forks inherit these modules and import nothing (the interpreter runs with ``-B``, too: it
    writes no ``.pyc`` anyone could later swap)."""
    from ..sources.fdinfo_records import LocalScanner
    from ..sources.fdinfo_scan import ScanLimits
    from . import answer

    _scan.update(LocalScanner=LocalScanner, ScanLimits=ScanLimits, answer=answer)

# run by ``python -I -S -B -c``: argv = [-c, serving pid, control fd, procfs, sysfs, package root];
# it starts with ``caps.SOURCE`` (prctl, capset, restrict: the package is not importable yet)
BOOT = SOURCE + """\
import os, resource, signal, sys
def die(why):
    sys.stderr.write(f"the counting process cannot start: {why}\\n")
    sys.exit(70)
try:
    prctl(PR_SET_PDEATHSIG, 9)  # SIGKILL: dies with the serving process
except OSError:
    die("PR_SET_PDEATHSIG")
if os.getppid() != int(sys.argv[1]):
    sys.exit(0)  # the serving process is gone already
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
try:
    prctl(PR_SET_DUMPABLE, 0)
except OSError as exc:
    die(f"PR_SET_DUMPABLE (errno {exc.errno})")
try:  # no_new_privs; CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH only, bounding set included
    restrict((1 << 19) | (1 << 2))
except OSError as exc:
    die(str(exc))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
sys.path.append(sys.argv[5])  # after the standard library: nothing shadows it here
from exporter.privsep.child import supervise
sys.exit(supervise(int(sys.argv[2]), sys.argv[3], sys.argv[4]))
"""


def supervise(ctl_fd: int, procfs: str, sysfs: str) -> int:
    ctl = socket.socket(fileno=ctl_fd)
    preload()
    ctl.sendall(b"R")  # started, capabilities checked, every module a scanner runs imported
    worker = 0
    me = os.getpid()  # the scanner's parent: compared with getppid(), not with 1 (a subreaper)
    while True:
        _reap()
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, 16, 1)
        except InterruptedError:
            continue
        except OSError:
            msg, fds = b"", []
        worker = _stop(worker)
        if not msg:  # the serving process closed its end, or is gone
            for fd in fds:
                os.close(fd)
            return 0
        if msg != b"S" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            continue
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                # first: dies with the supervisor (a race with its death is closed by the check)
                prctl(PR_SET_PDEATHSIG, 9)  # SIGKILL (it cannot fail: a failure would end the scanner)
                if os.getppid() != me:  # the supervisor is gone already (its reaper may not be pid 1)
                    os._exit(0)
                ctl.close()
                code = serve(fds[0], procfs, sysfs)
            finally:
                os._exit(code)
        os.close(fds[0])
        worker = pid


_unreaped: set[int] = set()


def _stop(pid: int) -> int:
    """Kill the scanner and reap it if it is gone; never wait for it: a scanner in D state
    (a read stuck in the kernel) dies only when that read returns, and the supervisor must go
    on starting fresh scanners meanwhile (``_reap`` collects it later)."""
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _unreaped.add(pid)
        _reap()
    return 0


def _reap() -> None:
    for pid in list(_unreaped):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            _unreaped.discard(pid)


def _read(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _number(value: object, low: float, high: float) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise ValueError("a finite number expected")
    return min(max(float(value), low), high)


def _printable(name: str) -> str:
    """A process name as the serving process accepts it (any process may set its own)."""
    return "".join(c if c.isprintable() else "\ufffd" for c in name[:64]) or "unknown"


def serve(fd: int, procfs: str, sysfs: str) -> int:
    """Answer requests on ``fd`` with what ``preload`` imported (a scanner imports nothing)."""
    if not _scan:
        preload()  # a test's stand-in supervisor; the real one preloaded before it said ready
    LocalScanner, ScanLimits, answer = _scan["LocalScanner"], _scan["ScanLimits"], _scan["answer"]
    MAX_RECORDS, MAX_REQUEST_BYTES, encode_record, frame, length = (
        answer.MAX_RECORDS, answer.MAX_REQUEST_BYTES, answer.encode_record, answer.frame, answer.length)
    ERROR_KINDS = answer.ERROR_KINDS  # (``answer`` names each reply below)
    sock = socket.socket(fileno=fd)
    scanner = None
    key: tuple = ()
    while True:
        head = _read(sock, 4)
        if head is None:
            return 0
        body = _read(sock, length(head, MAX_REQUEST_BYTES))
        if body is None:
            return 0
        req = json.loads(body)
        rid = req["id"]
        try:
            lim = req["limits"]
            limits = ScanLimits(max_fds=int(_number(lim[0], 1, 1e7)), max_seconds=_number(lim[1], 0.001, 10.0),
                                check_period=_number(lim[2], 0.0, 86400.0),
                                verify_period=_number(lim[3], 0.0, 86400.0))
            names = req["names"] is True
            if scanner is None or key != (limits, names):
                scanner, key = LocalScanner(procfs, sysfs, limits, max_records=MAX_RECORDS), (limits, names)
            errors: dict = {}
            found = scanner.scan(errors, _number(req["now"], 0.0, 1e12))
            answer = {"id": rid, "host_pids": scanner.host_pids, "unreadable": scanner.unreadable,
                      "partial": scanner.partial, "budget_hit": scanner.budget_hit,
                      "errors": {k: v for k, v in errors.items() if k in ERROR_KINDS},
                      "records": [encode_record(pid, fdn, rec) for pid, fdn, rec in found],
                      "names": {pid: _printable(scanner.comm(pid)) for pid in {p for p, _, _ in found}} if names else {}}
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            answer = {"id": rid, "error": f"{type(exc).__name__}: {exc}"[:200]}
        sock.sendall(frame(answer))


if __name__ == "__main__":  # pragma: no cover - started through BOOT only
    sys.exit(2)
