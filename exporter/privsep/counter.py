"""The serving process's side of privilege separation: start the counting process, then hold nothing.

``separate(procfs, sysfs, count=...)`` runs once, in the main thread, after the CLI has read
its configuration (with no effective capability: ``lower_effective``) and before the daemon
starts any thread (capabilities are per thread: a thread started earlier would keep its own).
Where this process holds CAP_SYS_PTRACE or CAP_DAC_READ_SEARCH (the systemd unit's ambient
capabilities, the ``client-count`` component's uid 0 with the two, root) and ``count`` says a
serving daemon counts DRM fdinfo clients, it

1. starts the counting process (``child.BOOT``: ``python -I -S -B``, as the import worker is
   started, but from the main thread, so that its ``PR_SET_PDEATHSIG`` follows this process and
   not a short-lived thread), which keeps only those two capabilities and is non-dumpable;
2. makes every DRM fdinfo source scan through it (``fdinfo_records.use_factory``): a request
   per poll, an answer of numbers checked field by field (``answer.decode``) within a deadline
   (``answer_seconds``); a late, oversized or malformed answer, or a scanner that died, is
   counted (``source_errors_total{source="fdinfo", kind="counter_<late|oversized|malformed|exited>"}``),
   that poll's count reads ``read_error``, and the next poll gets a fresh scanner; when the
   supervisor itself is gone (``counter_supervisor_exited``), ``privilege_separated`` reads 0,
   an ERROR is logged and the daemon exits 1 (``Counter.on_dead``) to be restarted;
3. sets ``PR_SET_NO_NEW_PRIVS`` (an ``execve`` as uid 0 would otherwise give back the
   bounding set), drops the bounding set where it may (CAP_SETPCAP), empties its permitted,
   effective, inheritable and ambient sets, and checks every thread in ``/proc/self/task``;
   it fails closed (the daemon does not start) when any capability is left.

Where nothing counts (``count`` False: the fdinfo count off, a one-shot mode), no process starts
and step 3 runs alone; a reload that turns the count on later finds the capabilities gone
(``warn_if_count_unprivileged``).  A process without either capability has nothing to separate: the scan runs in it
(``fdinfo_records.LocalScanner``), step 3 runs where it holds any other capability or is uid 0, as ``unified_gpu_exporter_privilege_separated`` 0 says.  When
the counting process cannot start, the capabilities are dropped all the same and the count
reads what an unprivileged process can see (a warning says why).
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable
from pathlib import Path

from ..sources import fdinfo_records
from ..sources.fdinfo_parser import FdinfoRecord
from ..sources.fdinfo_scan import ScanLimits
from .answer import MAX_ANSWER_BYTES, BadAnswer, decode, frame, length
from .caps import capabilities, child_env, restrict
from .child import BOOT

log = logging.getLogger("unified_gpu_exporter")
COUNT_CAPS = (1 << 19) | (1 << 2)  # CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH
CAP_PERFMON = 1 << 38  # Level Zero engine groups (i915/xe PMU): kept where that collector runs
START_SECONDS = 30.0  # the counting process says it is ready within this
ANSWER_FLOOR_SECONDS = 2.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent.parent)


def answer_seconds(limits: ScanLimits) -> float:
    """How long an answer may take: the scan's own budget is ``max_seconds`` of fd-table work
    (plus the reads of known clients); 20 times that, at least 2 s."""
    return max(ANSWER_FLOOR_SECONDS, 20 * limits.max_seconds)


class Counter:
    """The counting process (its supervisor) and the session with its current scanner."""

    def __init__(self, procfs: Path, sysfs: Path, python: str = sys.executable) -> None:
        self.procfs, self.sysfs = Path(procfs), Path(sysfs)
        self.bad: Tally[str] = Tally()  # bad answers by kind (tests read it)
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._id = 0
        self.dead = False  # the supervisor is gone: nothing can start a scanner again
        self.on_dead: Callable[[], None] | None = None  # the CLI's: the daemon exits non-zero
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen(
                [python, "-I", "-S", "-B", "-c", BOOT, str(os.getpid()), str(theirs.fileno()), str(self.procfs),
                 str(self.sysfs), _PACKAGE_ROOT], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),), cwd="/", env=child_env())
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._ctl = ours
        ours.settimeout(START_SECONDS)
        try:
            ready = ours.recv(1)
        except OSError:
            ready = b""
        if ready != b"R":
            self.close()
            raise OSError(f"the counting process did not start (exit status {self.proc.poll()})")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def scanner(self, procfs: Path, sysfs: Path, limits: ScanLimits | None = None, *,
                names: bool = False) -> fdinfo_records.Scanner:
        """The factory ``fdinfo_records.use_factory`` is given: a remote scanner for the paths the
        counter was started with (a source with other paths scans in this process)."""
        limits = limits or ScanLimits()
        if (Path(procfs), Path(sysfs)) != (self.procfs, self.sysfs):
            return fdinfo_records.LocalScanner(procfs, sysfs, limits, names=names)
        return RemoteScanner(self, limits, names)

    def ask(self, request: dict, timeout: float):
        """One request, its checked answer (``answer.Answer``); BadAnswer (counted, and the
        scanner replaced at the next request) when there is none to use."""
        with self._lock:
            if self.dead:
                raise BadAnswer("supervisor_exited", "the counting process's supervisor is gone")
            deadline = time.monotonic() + timeout
            try:
                if self._sock is None:
                    self._session(timeout)
                assert self._sock is not None
                self._id += 1
                self._sock.settimeout(timeout)
                self._sock.sendall(frame({**request, "id": self._id}))
                n = length(self._recv(4, deadline), MAX_ANSWER_BYTES)
                return decode(self._recv(n, deadline), self._id)
            except BadAnswer as exc:
                self._drop(self._supervisor_gone() or exc.kind)
                raise BadAnswer(self._supervisor_gone() or exc.kind, str(exc)) from None
            except TimeoutError:
                self._drop(self._supervisor_gone() or "late")
                raise BadAnswer(self._supervisor_gone() or "late", f"no answer within {timeout:g} s") from None
            except OSError as exc:
                self._drop(self._supervisor_gone() or "exited")
                raise BadAnswer(self._supervisor_gone() or "exited", f"the counting process is gone ({exc})") from None

    def _supervisor_gone(self) -> str:
        """"supervisor_exited" when the supervisor has exited (reaped here: no zombie), once
        logged as an ERROR and handed to ``on_dead``; "" while it runs.  Only the supervisor
        can start a scanner (this process holds no capability left to), so its death ends the
        count for good: the CLI makes the daemon exit 1 and its supervisor (systemd
        ``Restart=on-failure``, Kubernetes) restarts it with the capabilities it was given."""
        if self.proc.poll() is None:
            return ""
        if not self.dead:
            self.dead = True
            log.error("the counting process's supervisor exited: no DRM fdinfo count is possible any more; "
                      "the daemon exits (status 1) so that its service manager restarts it",
                      extra={"pid": self.proc.pid, "status": self.proc.returncode})
            if self.on_dead is not None:
                self.on_dead()
        return "supervisor_exited"

    def _session(self, timeout: float) -> None:
        """A fresh scanner: its socket handed to the supervisor, within ``timeout`` (a
        supervisor that does not read its control socket cannot hold the poll, or the lock,
        longer than the request's own deadline)."""
        self._ctl.settimeout(min(timeout, START_SECONDS))
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            socket.send_fds(self._ctl, [b"S"], [theirs.fileno()])
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        self._sock = ours

    def _recv(self, n: int, deadline: float) -> bytes:
        assert self._sock is not None
        buf = bytearray()
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self._sock.settimeout(left)
            chunk = self._sock.recv(min(n - len(buf), 1 << 20))
            if not chunk:
                raise BadAnswer("exited", "the scanner closed its end before answering whole")
            buf += chunk
        return bytes(buf)

    def _drop(self, kind: str) -> None:
        self.bad[kind] += 1
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            self._ctl.close()  # the supervisor sees EOF: it kills its scanner and exits
        try:
            self.proc.wait(2.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class RemoteScanner:
    """``fdinfo_records.Scanner`` whose scan runs in the counting process."""

    def __init__(self, counter: Counter, limits: ScanLimits, names: bool) -> None:
        self.counter, self.limits, self.names = counter, limits, names
        self.host_pids, self.unreadable, self.partial, self.budget_hit = False, 0, False, False
        self.failed = False  # the last poll got no usable answer: its count reads read_error
        self._names: dict[str, str] = {}

    @property
    def separated(self) -> bool:
        """1 on ``privilege_separated`` while the supervisor lives; 0 once it is gone."""
        return not self.counter.dead

    def scan(self, errors: dict, now: float) -> list[tuple[str, str, FdinfoRecord]]:
        lim = self.limits
        request = {"now": now, "names": self.names,
                   "limits": [lim.max_fds, lim.max_seconds, lim.check_period, lim.verify_period]}
        try:
            got = self.counter.ask(request, answer_seconds(lim))
        except BadAnswer as exc:
            errors[f"counter_{exc.kind}"] = errors.get(f"counter_{exc.kind}", 0) + 1
            if exc.kind != "supervisor_exited":  # that one: one ERROR (``Counter._supervisor_gone``)
                log.warning("the counting process gave no usable answer: a fresh scanner answers the next poll",
                            extra={"kind": exc.kind, "reason": str(exc)[:300]})
            self.failed, self.partial, self._names = True, True, {}
            return []
        self.failed = False
        self.host_pids, self.unreadable, self.partial, self.budget_hit = (
            got.host_pids, got.unreadable, got.partial, got.budget_hit)
        for kind, n in got.errors.items():
            errors[kind] = errors.get(kind, 0) + n
        self._names = got.names
        return got.records

    def comm(self, pid: str) -> str:
        return self._names.get(pid, "unknown")

    def close(self) -> None:
        pass


def drop_all(keep: int = 0) -> None:
    """No new privileges, no bounding set where it may, and every capability set empty but the
    part of ``keep`` held (permitted and effective), in every thread (there must be one only);
    OSError when anything else is left."""
    if threading.active_count() != 1 or len(os.listdir("/proc/self/task")) != 1:
        raise OSError("capabilities must be dropped before any thread starts (capabilities are per thread)")
    restrict(keep)  # caps.SOURCE: the code the counting process and the import worker boot with
    left = {k: v & ~keep if k in ("CapPrm", "CapEff") else v for k, v in held().items()}
    left = {k: v for k, v in left.items() if v}
    if left:
        raise OSError(f"capabilities left after dropping them: {left}")


def held(pid: str = "self") -> dict[str, int]:
    """CapPrm | CapEff | CapAmb | CapInh of every thread of ``pid``, or-ed per set.  A thread
    that ended between the listing and its read held nothing any more: skipped only when its
    task directory is gone (any other failure to read stays an OSError: fail closed)."""
    out = {"CapPrm": 0, "CapEff": 0, "CapAmb": 0, "CapInh": 0}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            caps = capabilities(f"{pid}/task/{task}")
        except (FileNotFoundError, ProcessLookupError):  # ENOENT at the open, ESRCH at the read
            if os.path.exists(f"/proc/{pid}/task/{task}"):
                raise
            continue
        for k, v in caps.items():
            if k in out:
                out[k] |= v
    return out


_dropped_unused = False  # the count capabilities were dropped with no counting process (count off)


def separate(procfs: Path, sysfs: Path, *, count: bool = True, keep: int = 0) -> Counter | None:
    """See the module text; returns the counter (None: nothing to separate, it did not start,
    or ``count`` is False: no DRM fdinfo count is configured, so nothing needs the capabilities,
    and they are dropped without starting the counting process).  ``keep``: capabilities the
    serving process keeps where it holds them (``CAP_PERFMON`` for Level Zero), every other
    one goes in every case."""
    global _dropped_unused
    caps = held()
    if not (caps["CapPrm"] | caps["CapEff"] | caps["CapAmb"]) & COUNT_CAPS:
        # nothing to separate: the fdinfo scan runs here, without privileges; any other
        # capability (docker run --user 0: CHOWN, DAC_OVERRIDE, SETUID, ...) goes all the same,
        # and uid 0 gets no_new_privs (an execve would give it the bounding set back)
        if any(caps.values()) or os.geteuid() == 0:
            drop_all(keep)  # also raises a kept one into the effective set again (lower_effective)
        return None
    if not count:
        drop_all(keep)
        _dropped_unused = True
        log.info("no DRM fdinfo client count is configured: no counting process starts, and this process "
                 "drops every capability")
        return None
    counter = None
    try:
        counter = Counter(procfs, sysfs)
        fdinfo_records.use_factory(counter.scanner)
        log.info("the DRM fdinfo client count runs in a separate process holding CAP_SYS_PTRACE and "
                 "CAP_DAC_READ_SEARCH; this process drops every capability", extra={"pid": counter.pid})
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("the counting process could not start: every capability is dropped all the same, "
                    "and the DRM fdinfo count sees what an unprivileged process can",
                    extra={"reason": str(exc)[:300]})
    drop_all(keep)
    return counter


def warn_if_count_unprivileged() -> None:
    """A reload turned the DRM fdinfo count on in a daemon that started with it off: the
    capabilities were dropped for good at start (no process can get them back), so the count
    runs here, unprivileged; a restart counts with them."""
    if _dropped_unused:
        log.warning("the reloaded configuration turns the DRM fdinfo client count on, but it was off at start: "
                    "the capabilities it needs (CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH) were dropped then and "
                    "cannot come back, so it counts only what an unprivileged process can see "
                    "(privilege_separated 0, procfs_unreadable); restart the exporter to count with them")
