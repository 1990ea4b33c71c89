"""Finding DRM clients under a procfs root, incrementally and within a per-poll budget.

What a poll does, cheapest first (docs/detection.md has the worst-case times this gives):

1. list the pid directories (one ``getdents`` of the procfs root);
2. read the fdinfo of every fd already known to be a DRM client (the values the count needs);
   an fd that closed is dropped, one whose fdinfo no longer has ``drm-driver`` (closed and its
   number reused by a file, socket, ...) is forgotten and looked at again;
3. examine fd tables, in this order: processes never examined (new pids: at once), processes
   amdkfd lists under ``<sysfs>/class/kfd/kfd/proc/<pid>`` without a known DRM fd (a ROCm
   compute process opens its render node right after ``/dev/kfd``: checked every poll), then
   the *checks* that are due (every ``check_period``: list the fd numbers, ``readlink`` only
   the numbers not seen before; where the directory's size counts its fds, an unchanged size is
   one ``lstat``, no open) and the *verifications* that are due (every ``verify_period``, spread over it
   by pid: ``readlink`` every fd again, which catches an fd number reused for a DRM device
   between two checks; a table of unchanged size is not listed, its numbers known are read unless
   one is gone); due work comes from a heap, so a poll costs nothing per idle process. Where
   DRM core's debugfs client list holds (``fdinfo_debugfs``), a process it names with a new
   drm_file is examined at once and a due verification is a check; one of a process that did
   nothing since its last real one (``fdinfo_activity``) is skipped; one real one in ten;
4. stop reading known clients' fdinfo at ``max_records`` or after ``known_seconds`` (a user
   who dup()s one render fd half a million times must not make every poll slow, or, with the
   counting process, late: the count is then partial, ``budget_hit``);
5. stop examining when the poll has spent its budget (``max_fds`` readlinks, ``max_seconds``);
   what is left waits for the next poll, new pids first: an examination cut short keeps the fd
   numbers it has left, a large table's listing goes on where it stopped.

``readlink`` of ``<pid>/fd/<n>`` (no open) decides whether an fd is a DRM device: a target under
``/dev/dri/``, or (another ``/dev`` node) one whose fdinfo names a ``drm-driver`` (never a stat of
the target: ``fdinfo_tables.is_drm`` says why).  Only
DRM fds have their fdinfo read, each through its directory fd under the ``exporter.safefile``
rule (a host ``/proc`` mounted into a container, or a fixture, is a tree another user may shape).
A pid reused by a new process keeps its record until a check or verification sees the new table
(within their periods, as any change of a table).  Memory: 4 bytes per fd number, a record per pid.
"""

from __future__ import annotations

import heapq
import os
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .. import safefile
from .fdinfo_activity import idle
from .fdinfo_debugfs import ClientList
from .fdinfo_tables import FDINFO_MAX_BYTES, Budget, drm_among, links, list_table, pid_names, same_size

KFD_PROC = "class/kfd/kfd/proc"  # amdkfd: one directory per process holding a KFD context
_SPREAD = 0.6180339887  # golden ratio: pids spread evenly over a period


@dataclass(frozen=True, slots=True)
class ScanLimits:
    """The per-poll budget and the re-examination periods (``FdinfoOptions``)."""

    max_fds: int = 20000  # fds examined per poll (a readlink each; an fdinfo read for some /dev targets)
    max_seconds: float = 0.05  # wall time of one poll's fd-table work
    check_period: float = 15.0  # every fd table listed again (new fd numbers)
    verify_period: float = 50.0  # every fd readlinked again (reused fd numbers)


def known_seconds(limits: ScanLimits) -> float:
    """How long one poll may read the fdinfo of known clients: well inside the counting
    process's answer deadline (``privsep.counter.answer_seconds``: at least 4 times this), so a
    scanner with too many clients answers partially instead of being killed as late."""
    return max(0.5, 5 * limits.max_seconds)


@dataclass(slots=True)
class _Pid:
    """What is known of one process's fd table."""

    known: array = field(default_factory=lambda: array("i"))  # fd numbers examined, sorted
    drm: set[str] = field(default_factory=set)  # fds that are DRM devices
    done: bool = False  # the whole table examined once
    next_check: float = 0.0
    next_verify: float = 0.0
    size: int = 0  # st_size of the fd directory when last listed, where it counts the entries (else 0)
    pending: array | None = None  # fd numbers an examination cut short by the budget has left
    pending_verify: bool = False  # ... and whether it was a verification
    listing: tuple | None = None  # (scandir iterator, numbers so far) of a large table being listed
    links: bool = True  # the tree has fd/ links (else every fdinfo file is read: fixtures)
    vouched: int = 0  # re-verifications vouched for (client list, fdinfo_activity) since the last real one
    stat: bytes | None = None  # fdinfo_activity's fingerprint, taken before the last real examination
    taken: bytes | None = None  # ... and before the one under way (``stat`` once it is done whole)


class FdScanner:
    """Finds DRM fds under a procfs root and returns their fdinfo text, cheaply and bounded."""

    def __init__(self, procfs: Path, sysfs: Path | None = None, limits: ScanLimits | None = None,
                 max_records: int | None = None) -> None:
        self.procfs = str(procfs)
        self.max_records = max_records  # fdinfo texts one poll returns at most (then budget_hit)
        self._left = 0
        self._read_deadline = 0.0
        self.cut = False  # the last poll left known clients unread (record cap or known_seconds)
        self.kfd = f"{sysfs}/{KFD_PROC}" if sysfs is not None else None
        self.clients = ClientList(self.procfs, str(sysfs)) if sysfs is not None else None  # debugfs
        self.limits = limits or ScanLimits()
        self._pids: dict[str, _Pid] = {}
        self._kfd: dict[str, float] = {}
        self._due: list[tuple[float, str]] = []  # heap of (when, pid): the next check or verification
        self._undone: set[str] = set()  # pids whose table was never examined whole
        self._listed_due: set[str] = set()  # pids the client list has examined this poll
        self._clients: set[str] = set()  # pids with a known DRM fd (or that had one: dropped when read)
        self._unreadable: set[str] = set()  # pids whose fd table could not be read (EACCES)
        self.unreadable = 0  # fd tables that could not be read (EACCES), as last examined
        self.partial = False  # the last poll left a new process unexamined or a verification overdue
        self.budget_hit = False  # the last poll stopped at its budget
        self.readlinks = 0  # readlink/stat calls of the last poll (tests count them)
        self.deferred = 0  # fd-table examinations the last poll left for later

    # ------------------------------------------------------------------ the poll
    def scan(self, errors: dict, now: float | None = None) -> Iterator[tuple[str, str, str]]:
        """Yield ``(pid, fd, fdinfo text)`` for every DRM fd found; ``now``: the monotonic time
        the schedule uses (the source's clock)."""
        now = time.monotonic() if now is None else now
        budget = Budget(self.limits)
        self._left = self.max_records if self.max_records is not None else 1 << 62
        self._read_deadline = time.perf_counter() + known_seconds(self.limits)
        self.cut = False
        self.readlinks = 0
        try:  # one listdir: a pid reused by a new process is the same entry until a check or
            # verification of its table (within their periods) sees the new table
            entries = set(filter(str.isdigit, os.listdir(self.procfs)))
        except OSError:
            entries = set()
        if not all(map(str.isascii, entries)):  # other Unicode digits: never a procfs's
            entries = {n for n in entries if n.isascii()}
        for pid in self._pids.keys() - entries:
            gone = self._pids.pop(pid)  # exited
            self._undone.discard(pid)
            self._unreadable.discard(pid)
            if gone.listing is not None:
                gone.listing[0].close()
        kfd = self._kfd_pids(now)
        if self.clients is not None:  # DRM core's client list, where it holds (fdinfo_debugfs)
            self.clients.poll(errors)
        # 2. the known clients, every poll
        for pid in sorted(self._clients, key=int):
            st = self._pids.get(pid)
            if st is None or not st.drm:
                self._clients.discard(pid)
                continue
            yield from self._read_known(pid, st, errors, budget)
        # 3. fd tables, most urgent first
        work = self._work(entries, kfd, now, budget)
        self.deferred = 0
        for i, (urgency, pnum) in enumerate(work):
            if budget.hit:
                self.deferred = len(work) - i
                break
            pid = str(pnum)
            st = self._pids.get(pid)
            if st is None:
                st = self._pids[pid] = _Pid()
                self._undone.add(pid)
            verify = st.done and (urgency == 1 or st.next_verify <= now)
            vouch = verify and urgency != 1 and self.clients is not None and self.clients.vouches(st.vouched)
            ran = True  # fdinfo_activity: it may have run since its last real examination
            if not vouch and (verify or not st.done) and st.pending is None and st.listing is None:
                ran = not (vouch := idle(self.procfs, pid, st, errors, verify and urgency != 1))
            found = (self._examine(pid, st, verify and not vouch, budget, now) if ran  # one that did not
                     else self._finish(st, now, False, pid) or [])  # cannot hold a new fd: not even a check
            if pid in self._listed_due:  # asked for by the client list: backs off while it finds nothing
                self.clients.examined(pid, bool(found), now, self.limits.check_period)  # type: ignore[union-attr]
            if st.pending is None and st.listing is None and st.done and verify and vouch:
                st.vouched += 1  # the client list or fdinfo_activity stood in (a real one: 0, _finish)
                st.next_verify = now + self.limits.verify_period
                heapq.heappush(self._due, (min(st.next_check, st.next_verify), pid))
            if found:
                yield from self._read_known(pid, st, errors, budget, only=found)
        overdue = now - self.limits.verify_period
        late = False
        for _, pnum in work:  # what is still due (deferred, cut short) is due at the next poll
            st = self._pids.get(str(pnum))
            if st is not None and st.done and (min(st.next_check, st.next_verify) <= now
                                               or st.pending is not None or st.listing is not None):
                heapq.heappush(self._due, (now, str(pnum)))
                late = late or st.next_verify < overdue
        self.budget_hit = budget.hit
        self.unreadable = len(self._unreadable)
        # a verification overdue is due, so in ``work`` (every due entry leaves the heap for it)
        self.partial = self.cut or late or bool(self._undone)

    def _work(self, entries: set[str], kfd: dict[str, float], now: float, budget: Budget) -> list[tuple[int, int]]:
        """(urgency, pid) of the fd tables to examine this poll, most urgent first: new pids (and
        ones never examined whole), KFD processes without a known DRM fd (every fd, every poll,
        for ``check_period`` after amdkfd listed them), then the checks and verifications due
        (from a heap: a poll with nothing due costs nothing per process; a check a table's size
        answers is done here, within a quarter of the poll's time and its budget, then after new pids)."""
        work = [(0, int(p)) for p in (entries - self._pids.keys()) | self._undone]
        hot = set()  # examined whole this poll: not again as a check
        for p, since in kfd.items():
            st = self._pids.get(p)
            if now - since <= self.limits.check_period and st is not None and st.done and not st.drm:
                hot.add(p)
                work.append((1, int(p)))
        self._listed_due = (self.clients.due(self._pids, now) if self.clients else set()) - hot
        for p in self._listed_due:
            hot.add(p)  # the client list names it with a new drm_file (fdinfo_debugfs.ClientList.due)
            work.append((1, int(p)))
        due: set[str] = set()
        cheap = 0.0 if budget.hit else min(time.perf_counter() + self.limits.max_seconds / 4, budget.deadline)
        while self._due and self._due[0][0] <= now:
            _, p = heapq.heappop(self._due)
            st = self._pids.get(p)
            if st is None or not st.done or p in due or p in hot:
                continue
            if st.next_verify <= now or (st.pending is not None and st.pending_verify):
                due.add(p)
                work.append((2, int(p)))
            elif st.next_check <= now or st.pending is not None or st.listing is not None:
                due.add(p)
                if st.size and st.pending is None and st.listing is None and time.perf_counter() < cheap \
                        and same_size(f"{self.procfs}/{p}/fd", st.size):
                    self._finish(st, now, False, p)  # a check, as many fds as at the last listing
                else:
                    work.append((3, int(p)))
        work.sort()
        return work

    def _kfd_pids(self, now: float) -> dict[str, float]:
        """pid -> when amdkfd first listed it (``<sysfs>/class/kfd/kfd/proc/<pid>``, named by the
        process's pid in the initial PID namespace; docs/detection.md)."""
        if self.kfd is None:
            return {}
        self._kfd = {n: self._kfd.get(n, now) for n in pid_names(self.kfd)}
        return self._kfd

    # ------------------------------------------------------------------ one fd table
    def _examine(self, pid: str, st: _Pid, verify: bool, budget: Budget, now: float) -> list[str]:
        """Examine ``pid``'s fd table (new numbers, or all of them when ``verify``) within the
        budget; return the DRM fds found that were not known."""
        try:
            dir_fd = os.open(f"{self.procfs}/{pid}/fd", os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            st.links = False
            return self._examine_fdinfo(pid, st, now)
        except PermissionError:
            self._unreadable.add(pid)  # other users' processes without CAP_SYS_PTRACE: no evidence
            self._finish(st, now, verify, pid)
            return []
        except OSError:
            return []
        self._unreadable.discard(pid)
        found: list[str] = []
        try:
            if st.pending is not None:  # resume what the budget cut short: no listing, no set
                todo, verify = st.pending, st.pending_verify
                done, _ = self._look(pid, st, dir_fd, todo, budget, found)
                return self._end(pid, st, todo, done, verify, None, now, found)
            size = os.fstat(dir_fd).st_size
            if size and size == st.size and st.done and st.listing is None:
                if not verify:
                    self._finish(st, now, False, pid)  # as many fds as at the last listing: the
                    return found  # re-verification catches a close and open between two checks
                # a verification, as many fds as at the last listing: the same numbers unless one
                # closed (and another opened): readlink the known ones, list only if one is gone
                done, missing = self._look(pid, st, dir_fd, st.known, budget, found)
                if not missing:
                    return self._end(pid, st, st.known, done, True, None, now, found)
            nums, listed_all = list_table(dir_fd, st, budget)
            if not listed_all:
                return found  # a large table: its listing goes on next poll
            # a size that counts the entries: procfs since Linux 6.2 (one per fd), tmpfs
            # (BOGO_DIRENT_SIZE, 20 a name and 40 for "." and "..": the benches' fixture procfs)
            st.size = size if size and size in (len(nums), 20 * (len(nums) + 2)) else 0
            if not verify and st.done and array("i", nums) == st.known:
                self._finish(st, now, False, pid)  # the common check: the same fd numbers
                return found
            if verify:
                todo = nums
            else:
                known = set(st.known)
                todo = [n for n in nums if n not in known]
            done, _ = self._look(pid, st, dir_fd, todo, budget, found)
            return self._end(pid, st, todo, done, verify, nums, now, found)
        finally:
            os.close(dir_fd)

    def _look(self, pid: str, st: _Pid, dir_fd: int, todo, budget: Budget, found: list[str]) -> tuple[int, bool]:
        """``readlink`` the fd numbers ``todo`` within the budget, keep ``st.drm`` up to date
        and add the DRM fds not known before to ``found``; how many were looked at, and whether
        one was missing (closed meanwhile)."""
        allowed = budget.take(len(todo))
        done = 0
        missing = False
        while done < allowed:
            if done and budget.late():
                break
            chunk = todo[done:min(done + 256, allowed)]
            names, targets, gone = links(dir_fd, [b"%d" % n for n in chunk])
            done += len(chunk)
            if gone:  # a known number closed: the next check lists the table (its size may not change)
                missing, st.size = True, 0
            hits = drm_among(self.procfs, pid, names, targets)
            if st.drm:  # numbers looked at that are no longer DRM devices
                st.drm -= {n.decode() for n in names} - hits
            new = sorted(hits - st.drm, key=int)
            if new:
                st.drm.update(new)
                found += new
                self._clients.add(pid)
        self.readlinks += done
        return done, missing

    def _end(self, pid: str, st: _Pid, todo, done: int, verify: bool, nums: list[int] | None, now: float,
             found: list[str]) -> list[str]:
        """After ``_look``: what the budget left for the next poll, or the examination done."""
        if nums is not None:  # the numbers of this listing (examined or to be) are known
            st.known = array("i", nums)
        if done < len(todo):  # cut short: the rest next poll
            st.pending, st.pending_verify = array("i", todo[done:]), verify
            return found
        st.pending = None
        if nums is not None and st.drm:  # numbers no longer listed are closed fds
            st.drm &= set(map(str, nums))
        self._finish(st, now, verify, pid)
        return found

    def _finish(self, st: _Pid, now: float, verify: bool, pid: str) -> None:
        lim = self.limits
        if verify or not st.done:  # a real examination done whole: the fingerprint taken before it holds
            st.stat, st.vouched = st.taken, 0
        if not st.done:  # first complete examination: spread the next ones over their periods
            spread = (int(pid) * _SPREAD) % 1.0
            st.done = True
            self._undone.discard(pid)
            st.next_check = now + lim.check_period * max(spread, 0.05)
            st.next_verify = now + lim.verify_period * max(spread, 0.05)
        else:
            st.next_check = now + lim.check_period
            if verify:
                st.next_verify = now + lim.verify_period
        heapq.heappush(self._due, (min(st.next_check, st.next_verify), pid))

    def _examine_fdinfo(self, pid: str, st: _Pid, now: float) -> list[str]:
        """A tree without fd/ links (a fixture): every fdinfo file is a candidate, read each poll."""
        try:
            names = os.listdir(f"{self.procfs}/{pid}/fdinfo")
        except OSError:  # neither fd/ nor fdinfo/: exited meanwhile, or a fixture's bare pid
            names = []
        new = [n for n in names if n not in st.drm and n.isascii() and n.isdigit()]
        st.drm.update(new)
        if new:
            self._clients.add(pid)
        st.done, st.next_check, st.next_verify = True, now, now + self.limits.verify_period  # every poll
        self._undone.discard(pid)
        heapq.heappush(self._due, (now, pid))
        return new

    # ------------------------------------------------------------------ fdinfo
    def _read_known(self, pid: str, st: _Pid, errors: dict, budget: Budget, only: list[str] | None = None
                    ) -> Iterator[tuple[str, str, str]]:
        """The fdinfo of ``pid``'s DRM fds, until the poll's record cap or ``known_seconds``
        (then ``budget.hit``: the count is partial, never slower)."""
        if self._left <= 0 or time.perf_counter() > self._read_deadline:
            budget.hit = self.cut = True
            return
        fds = sorted(only if only is not None else st.drm, key=int)
        try:
            info_fd = safefile.open_dir(f"{self.procfs}/{pid}/fdinfo")
        except OSError:
            return  # the process exited meanwhile
        try:
            for i, fd in enumerate(fds):
                if self._left <= 0 or (i & 15 == 15 and time.perf_counter() > self._read_deadline):
                    budget.hit = self.cut = True
                    return
                try:
                    data = safefile.read_at(info_fd, fd, FDINFO_MAX_BYTES)
                except FileNotFoundError:
                    self._forget(st, fd)  # closed meanwhile
                    continue
                except OSError:  # also safefile.Refused: a FIFO, a symlink, above the limit
                    if st.links:
                        errors["read_error"] = errors.get("read_error", 0) + 1
                    continue
                text = data.decode("utf-8", "replace")
                if "drm-driver" not in text:
                    self._forget(st, fd)  # its number now names another file: look again
                    continue
                self._left -= 1
                yield pid, fd, text
        finally:
            os.close(info_fd)

    @staticmethod
    def _forget(st: _Pid, fd: str) -> None:
        st.drm.discard(fd)
        if st.links:
            n = int(fd)
            st.known = array("i", (k for k in st.known if k != n))
            st.size = 0  # the numbers known are no longer the table's: the next check lists it
