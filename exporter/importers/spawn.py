"""How the import worker is started: as whom, with what, and how much memory it may take.

- **Who.** As root, the worker runs under a uid and gid of its own (``own_user``: one chosen at
  random per daemon in ``OWN_UIDS``, a range no distribution or systemd allocates, that no
  passwd or group entry names and no process runs as) with no supplementary groups: switching
  every uid away from 0 clears its capabilities (permitted, effective, ambient), and no other
  process on the node shares its uid, so none can signal it, trace it or take its descriptors
  (``pidfd_getfd``) as the shared uid 65534 could (issue 37).  Where a uid of its own cannot
  start a worker (a user namespace that maps only 65536 uids), it runs as uid/gid 65534
  (nobody), with a warning; where neither can (no CAP_SETUID/CAP_SETGID, or an interpreter or
  package other users cannot read), as uid 0 that drops every capability itself before it reads
  anything (``worker.BOOT``), and a warning says why.  As any other user it runs as that user.
  Whatever its uid, the worker makes itself non-dumpable first thing (``worker.BOOT``:
  ``PR_SET_DUMPABLE`` 0), so a process of the same uid cannot ptrace it either.
- **What it inherits.** ``Popen`` runs in a short-lived thread that first blocks SIGTERM,
  SIGINT and SIGHUP (the worker starts with them blocked and ignores them: systemd signals the
  whole cgroup at stop, and the parent, which kills the worker itself when stopping, must see
  no "crash") and clears its own ambient capabilities (systemd's ``AmbientCapabilities=``
  would otherwise survive ``execve`` into the worker).  Capabilities and the signal mask are
  per thread: the daemon's other threads keep theirs.  The environment is empty but for
  ``LD_LIBRARY_PATH`` (an interpreter that needs it for libpython or libsqlite3).
- **With what.** The package reaches the worker as a directory fd (``/proc/self/fd/N`` on its
  ``sys.path``), never by a path: a checkout in a private folder (mode 0700: root's home,
  ``mktemp -d``, a CI workspace) is out of another uid's reach, the fd is not.  An interpreter
  cannot come that way (it finds its standard library by path), so ``interpreter`` picks one
  another uid can run: ``sys.executable``, else the file it links to, else the venv's base
  interpreter (``-I -S`` loads no site-packages: any of them runs the worker the same).  Where
  none can be reached, the worker runs as uid 0 without capabilities and ``uid0_warning`` says
  which folder is in the way and what to do.
- **Memory.** ``memory_room`` is what the cgroup's ``memory.max`` leaves beside this process
  (a pod's or unit's limit counts the worker too): the importer lowers the worker's address
  space to fit, and the worker sets its ``oom_score_adj`` to 1000, so the kernel kills it
  first, never the daemon.
"""

from __future__ import annotations

import grp
import os
import pwd
import secrets
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

from ..privsep.caps import PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, capabilities, child_env, prctl

NOBODY = 65534
# uids no distribution, systemd (DynamicUser 61184-65519, containers 524288-1879048191, foreign
# 2147352576-2147418111) nor Debian policy allocates
OWN_UIDS = range(0x7E000000, 0x7F000000)
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
_NO_LIMIT = 1 << 60  # cgroup v1 writes "unlimited" as a huge page-aligned number
MARGIN = 32 << 20  # room kept for the daemon's own growth


def as_nobody() -> dict:
    """Popen keywords that start the worker as uid/gid 65534 (only meaningful as root)."""
    return {"user": NOBODY, "group": NOBODY, "extra_groups": []}


def own_user(tries: int = 64) -> dict | None:
    """Popen keywords that start the worker under a uid/gid of its own (only meaningful as
    root): a random one of ``OWN_UIDS`` with no passwd or group entry and no process running
    as it; None when none was found."""
    for _ in range(tries):
        uid = OWN_UIDS[secrets.randbelow(len(OWN_UIDS))]
        try:
            pwd.getpwuid(uid)
            continue
        except KeyError:
            pass
        try:
            grp.getgrgid(uid)
            continue
        except KeyError:
            pass
        if not _runs_as(uid):
            return {"user": uid, "group": uid, "extra_groups": []}
    return None


def _runs_as(uid: int) -> bool:
    want = str(uid)
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/status", encoding="ascii", errors="replace") as f:
                    for line in f:
                        if line.startswith("Uid:"):
                            if want in line.split()[1:]:
                                return True
                            break
            except OSError:
                continue
    return False


def blocked(path: str) -> str:
    """What keeps a process of another uid (not the owner, in no group) from reaching ``path``,
    by the permission bits: the first folder on the way (as written, then resolved) that others
    cannot search, or the file itself when others cannot execute it; "" when nothing does."""
    real = os.path.realpath(path)
    for target in dict.fromkeys((os.path.abspath(path), real)):
        for folder in reversed(Path(target).parents):  # "/" first
            try:
                mode = os.stat(folder).st_mode
            except OSError as exc:
                return f"{folder}: {exc.strerror}"
            if not mode & stat.S_IXOTH:
                return f"{folder} (mode {stat.S_IMODE(mode):04o}) lets no other user through"
    try:
        mode = os.stat(real).st_mode
    except OSError as exc:
        return f"{real}: {exc.strerror}"
    return "" if mode & stat.S_IXOTH else f"{real} (mode {stat.S_IMODE(mode):04o}) is not executable by others"


def interpreter(python: str) -> str:
    """The interpreter the worker runs (see the module text): the first of ``python``, the file it
    links to and the venv's base interpreter that another uid can reach; else ``python``."""
    base = getattr(sys, "_base_executable", "") or python
    for candidate in dict.fromkeys((python, os.path.realpath(python), os.path.realpath(base))):
        if not blocked(candidate):
            return candidate
    return python


def uid0_warning(python: str, why: str) -> str:
    """The warning when no worker could start under another uid and it runs as uid 0 without
    capabilities: which folder is in the way, and what to do."""
    real = os.path.realpath(python)
    in_the_way = blocked(real)
    if in_the_way:
        return (f"the import worker runs as uid 0 without capabilities: no other uid can run the interpreter "
                f"{real} ({in_the_way}); install the exporter with a Python every user can reach (a venv "
                f"made from /usr/bin/python3, or the package installed outside that folder), or run the "
                f"exporter as a non-root user")
    return (f"the import worker runs as uid 0 without capabilities, not as uid {NOBODY}: {why} (grant "
            "CAP_SETUID and CAP_SETGID, install Python where every user can read it, or run the exporter as a "
            "non-root user)")


def _clear_ambient() -> None:
    """Clear this thread's ambient capabilities (before it starts the worker)."""
    if not capabilities().get("CapAmb"):
        return
    try:
        prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot clear the ambient capabilities: {os.strerror(exc.errno)}") from None


def spawn(argv: list[str], pass_fds: tuple[int, ...], creds: dict) -> subprocess.Popen:
    """The worker, started from a fresh thread (see the module text); raises OSError (or
    SubprocessError) when it cannot be started."""
    box: list = []

    def run() -> None:
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            _clear_ambient()
            box.append(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, pass_fds=pass_fds, cwd="/",
                                        env=child_env(), **creds))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            box.append(exc)

    t = threading.Thread(target=run, name="import-spawn", daemon=True)
    try:
        t.start()
    except RuntimeError as exc:  # no thread left: the environment, not the file
        raise OSError(f"cannot start a thread: {exc}") from None
    t.join()
    got = box[0] if box else OSError("the worker was not started")
    if isinstance(got, BaseException):
        raise got
    return got


def _limit(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text.isdigit():
        return None  # "max"
    value = int(text)
    return value if value < _NO_LIMIT else None


def memory_max(cgroup_root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc/self")) -> int | None:
    """The lowest memory limit on this process's cgroup path (v2 ``memory.max`` up to the
    root of the mount, or v1 ``memory.limit_in_bytes``); None without one."""
    try:
        lines = (proc / "cgroup").read_text().splitlines()
    except OSError:
        return None
    limits: list[int] = []
    for line in lines:
        hid, _, rest = line.partition(":")
        ctrls, _, path = rest.partition(":")
        if hid == "0" and not ctrls:
            base, name = cgroup_root, "memory.max"
        elif "memory" in ctrls.split(","):
            base, name = cgroup_root / "memory", "memory.limit_in_bytes"
        else:
            continue
        p = base / path.strip().lstrip("/")
        while True:
            v = _limit(p / name)
            if v is not None:
                limits.append(v)
            if p == base or base not in p.parents:
                break
            p = p.parent
    return min(limits) if limits else None


def rss_bytes(proc: Path = Path("/proc/self")) -> int:
    try:
        for line in (proc / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def memory_room() -> int | None:
    """What the cgroup's memory limit leaves beside this process (None: no limit)."""
    limit = memory_max()
    return None if limit is None else max(0, limit - rss_bytes() - MARGIN)
