"""Runs the trigger's capture command so that nothing it starts outlives its timeout.

A process group is not enough: a child that calls ``setsid`` (a daemonizing profiler, or a
command that means harm) leaves the group, keeps the output pipe open, and the capture thread
waited on it for ever (issue 37).  So the command runs under a small supervisor (``SUPERVISOR``,
``python -I -S -c``): it makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``), so every
descendant that is orphaned, whatever session or group it moved to, becomes its child; when the
command ends or its time is up it kills every child it has, reaps, and repeats until it has none,
then reports on its status pipe (``exit N`` / ``timeout``).  The daemon keeps only the last
``TAIL_BYTES`` of the output, and stops waiting for it a moment after the supervisor ended.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from ..privsep.caps import SOURCE

TAIL_BYTES = 4096
GRACE_S = 10.0  # after the timeout, how long the supervisor may take to kill and reap

# argv: [-c, status fd, timeout seconds, command...]; it starts with ``privsep.caps.SOURCE`` (prctl)
SUPERVISOR = SOURCE + r"""
import os, signal, sys, time
status_fd, timeout, argv = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
try:
    prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of descendants come here
except OSError:
    os.write(status_fd, b"error cannot become a child subreaper")
    sys.exit(0)
try:
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the daemon gone, this one goes too
except OSError:
    pass
me = os.getpid()
def children():
    kids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    if int(f.read().rpartition(b")")[2].split()[1]) == me:
                        kids.append(int(name))
            except (OSError, ValueError, IndexError):
                pass
    return kids
def kill_all():
    while True:
        for pid in children():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return
        time.sleep(0.01)
try:
    pid = os.fork()
except OSError as exc:
    os.write(status_fd, f"error {exc}".encode())
    sys.exit(0)
if pid == 0:
    os.close(status_fd)
    try:
        os.setpgid(0, 0)
        os.execvp(argv[0], argv)
    except OSError as exc:
        os.write(2, f"cannot start {argv[0]!r}: {exc}\n".encode())
    os._exit(127)
end = time.monotonic() + timeout
status = None
while status is None:
    got, st = os.waitpid(pid, os.WNOHANG)
    if got:
        status = f"exit {os.waitstatus_to_exitcode(st)}"
    elif time.monotonic() >= end:
        status = "timeout"
    else:
        time.sleep(0.05)
kill_all()  # the command's leftovers, in whatever session they are: on success as on timeout
os.write(status_fd, status.encode())
"""


@dataclass
class Ran:
    status: str  # "exit N" | "timeout" | "error ..."
    tail: bytes  # the last TAIL_BYTES of stdout and stderr together

    @property
    def code(self) -> int | None:
        return int(self.status.split()[1]) if self.status.startswith("exit ") else None


def run(argv: list[str], cwd: Path, timeout: float) -> Ran:
    """Run ``argv`` in ``cwd`` under the supervisor; raises OSError when it cannot start."""
    r, w = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", SUPERVISOR, str(w), repr(float(timeout)), *argv],
                                cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, pass_fds=(w,), start_new_session=True)
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
    tail: collections.deque[bytes] = collections.deque()
    size = [0]

    def drain() -> None:
        assert proc.stdout is not None
        while chunk := proc.stdout.read1(65536):
            tail.append(chunk)
            size[0] += len(chunk)
            while size[0] - len(tail[0]) >= TAIL_BYTES:
                size[0] -= len(tail.popleft())
    reader = threading.Thread(target=drain, name="capture-output", daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout + GRACE_S)
    except subprocess.TimeoutExpired:  # the supervisor itself stuck: its session goes
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
        proc.wait()
    with os.fdopen(r, "rb") as f:
        status = f.read(512).decode(errors="replace") or f"error the supervisor ended ({proc.returncode})"
    reader.join(2.0)  # whatever still held the pipe (nothing should) cannot hold the capture
    return Ran(status, b"".join(tail)[-TAIL_BYTES:])
