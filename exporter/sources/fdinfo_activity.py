"""A second voucher for ``fdinfo_scan``'s re-verification: a process that did nothing since its
last real one.

A process that has not run cannot have opened or received an fd.  ``<procfs>/<pid>/stat`` of a
thread group (fs/proc/array.c, ``do_task_stat`` with ``whole``) sums over its threads what running
changes: ``minflt``/``majflt`` (page faults), ``utime``/``stime`` (the group's precise runtime,
``thread_group_cputime_adjusted``, in clock ticks), ``num_threads``, ``vsize`` and ``rss``, none of
them masked without ptrace access; ``starttime`` tells a pid reused by another process.  The
scanner takes this fingerprint before every real examination of a table (the first one, and
every real re-verification) and, when a re-verification falls due, reads it again: unchanged, the
re-verification is vouched for (skipped: not even a check, since it cannot hold a new fd) and
``_Pid.vouched`` counts it, so that, whichever voucher stood in, every ``LIST_VERIFY_EVERY``-th
re-verification is still a real one.  Changed, missing (exited; a fixture tree without ``stat``),
unreadable or malformed: a real re-verification (the last two counted in ``errors``,
``stat_unreadable`` / ``stat_malformed``).

What "unchanged" cannot see (docs/detection.md gives the worst-case times): an fd received or
opened by a process that then ran less than one clock tick in all, without a page fault or a
change of its mappings (a GPU client that *uses* the device, with ioctls, BO mmaps and faults,
changes them), waits for the real re-verification.

The file is the process's to shape in part: ``comm`` (``PR_SET_NAME``: spaces, ``)`` and newlines
included) comes before the fields, so they are read after the *last* ``)``; the read is bounded
while reading (``safefile.read_small``, ``STAT_MAX_BYTES``).  Reading it costs about three
``readlink``s (bench/bench_fdinfo.py's docstring has the numbers): tables of fewer than
``MIN_FDS`` fds are verified for real without it.
"""

from __future__ import annotations

from .. import safefile
from .fdinfo_debugfs import LIST_VERIFY_EVERY

STAT_MAX_BYTES = 4096  # a stat line is about 300 bytes (52 numbers and a comm of at most 64)
MIN_FDS = 4  # smaller tables: their readlinks cost less than the stat read that would spare them
# fields after the comm's ")" (proc(5): field N is at N - 3): starttime, num_threads, minflt,
# majflt, utime, stime, vsize, rss
_FIELDS = (19, 17, 7, 9, 11, 12, 20, 21)
_NEEDED = max(_FIELDS) + 1


def parse(data: bytes, pid: str) -> bytes | None:
    """The fingerprint of one ``stat`` text (the fields above, joined), or None when it is not
    one the kernel writes for ``pid``."""
    end = data.rfind(b")")
    if end < 0 or not data.startswith(pid.encode() + b" ("):
        return None
    fields = data[end + 1:].split(None, _NEEDED)
    if len(fields) < _NEEDED:
        return None
    picked = [fields[i] for i in _FIELDS]
    if not all(f.isdigit() and len(f) <= 20 for f in picked):  # ASCII digits only (never "1_0", "+1")
        return None
    return b" ".join(picked)


def fingerprint(procfs: str, pid: str, errors: dict) -> bytes | None:
    """``parse`` of ``<procfs>/<pid>/stat``; None when it is missing (exited, a fixture without
    one), refused (hidepid=1), otherwise unreadable or malformed (the last two counted in ``errors``)."""
    try:
        data = safefile.read_small(f"{procfs}/{pid}/stat", STAT_MAX_BYTES)
    except (FileNotFoundError, PermissionError):  # exited; another user's under hidepid=1 (its fd
        return None  # table is unreadable too: counted there, as procfs_unreadable)
    except OSError:  # a symlink, a FIFO, above the limit (safefile.Refused), another error
        errors["stat_unreadable"] = errors.get("stat_unreadable", 0) + 1
        return None
    got = parse(data, pid)
    if got is None:
        errors["stat_malformed"] = errors.get("stat_malformed", 0) + 1
    return got


def cpu_time(procfs: str, pid: str, errors: dict) -> tuple[bytes, int] | None:
    """(``starttime``, ``utime + stime`` in clock ticks) of ``pid`` from its ``stat``
    (``fingerprint``: None when missing, unreadable or malformed)."""
    got = fingerprint(procfs, pid, errors)
    if got is None:
        return None
    fields = got.split()  # in the order of _FIELDS
    return fields[0], int(fields[4]) + int(fields[5])


def idle(procfs: str, pid: str, st, errors: dict, may_vouch: bool) -> bool:
    """Before a fresh examination of every fd of ``pid`` (the first one, or a re-verification):
    whether ``may_vouch`` (a re-verification due, not one asked for by amdkfd or the client list)
    and the process is as at its last real examination and fewer than ``LIST_VERIFY_EVERY - 1``
    re-verifications in a row were vouched for; otherwise the examination is a real one and
    ``st.taken`` the fingerprint taken now, before it (None for a small table), which becomes
    ``st.stat`` once the examination is done whole (``FdScanner._finish``)."""
    if st.done and len(st.known) < MIN_FDS:
        st.taken = None
        return False
    now = fingerprint(procfs, pid, errors)
    if may_vouch and now is not None and now == st.stat and st.vouched < LIST_VERIFY_EVERY - 1:
        return True
    st.taken = now
    return False
