"""DRM core's debugfs client list: which processes hold a ``drm_file`` of each counted card.

``<debugfs>/dri/<minor>/clients`` (drivers/gpu/drm/drm_debugfs.c, ``drm_clients_info``) prints one
line per open ``drm_file`` of the device, both minors (card and render node) alike: the command,
the tgid (``pid_vnr``: in the *reader's* PID namespace), the minor, master and auth flags, the
uid, the magic and, in newer kernels, the client name (no spaces: ``DRM_SET_CLIENT_NAME`` keeps
only ``isgraph`` characters) and the client id.  A process that opens a DRM device adds a line
naming it; one that is handed an fd and calls an ioctl on it becomes the line's tgid
(``drm_file_update_pid``).  The scanner (``fdinfo_scan``) uses the list instead of re-reading
every fd of every process: a pid with a new ``drm_file`` is examined at once
(docs/detection.md, "The debugfs client list"; the kernel facts and their sources are there).

Which columns a kernel prints is read from the header line (the kernel writes it, nobody else):
``command tgid dev master a uid magic [name [id]]``.  The command (``comm``, which a process sets
to anything, newlines included) comes first, so a line is read from its end: the last fields
are the kernel's, whatever the command holds.  Kernels whose header says ``pid`` instead of
``tgid`` listed the opening *thread* (``task_pid``), which is not a ``/proc`` entry of its own:
such a list is not used.

The list is used only where it holds for every counted card; else ``read`` answers None and the
scanner does today's blind re-verification for that poll.  Bounded while reading: at most
``MAX_BYTES`` per file (``safefile``: above it the file is not used) and ``MAX_LINES`` lines; a
malformed line is skipped and counted.  The debugfs root is ``<sysfs>/kernel/debug`` (the
fixture trees of tests and benches are sysfs trees).
"""

from __future__ import annotations

import os
import re

from .. import safefile
from .sysfs_util import device_driver

HANDOVER_KERNEL = (6, 7)  # drm_file_update_pid (commit 1c7a387ffef8): an fd handed over moves its line
LIST_VERIFY_EVERY = 10  # with the list: every 10th re-verification of a table is still a real one
COUNTED_DRIVERS = frozenset({"amdgpu", "i915", "xe"})  # their fdinfo carries engine usage
MAX_BYTES = 1 << 21  # ~14,000 lines of ~150 bytes: beyond, the list is not used this poll
MAX_LINES = 65536  # beyond, the list is not used this poll
_CARD = re.compile(r"card[0-9]{1,4}\Z")
_DIGITS = re.compile(r"[0-9]{1,10}\Z")
_INT = re.compile(r"-?[0-9]{1,10}\Z")
_YN = frozenset({"y", "n"})
# the header's columns after "command" (drm_clients_info): without and with the client name / id
_LAYOUTS = {("tgid", "dev", "master", "a", "uid", "magic"),
            ("tgid", "dev", "master", "a", "uid", "magic", "name"),
            ("tgid", "dev", "master", "a", "uid", "magic", "name", "id")}


def parse(text: str) -> tuple[dict[str, int], int] | None:
    """``({tgid: drm_files}, malformed lines)`` of one ``clients`` file; None when its header is
    not a layout this reader knows (an older kernel's ``pid`` column, a changed format) or it
    has more than ``MAX_LINES`` lines."""
    lines = text.split("\n", MAX_LINES + 1)
    if len(lines) > MAX_LINES + 1:
        return None
    head = tuple(lines[0].split())
    if len(head) < 2 or head[0] != "command" or head[1:] not in _LAYOUTS:
        return None
    k = len(head) - 1
    counts: dict[str, int] = {}
    malformed = 0
    for line in lines[1:MAX_LINES + 1]:
        if not line:
            continue
        f = line.rsplit(None, k)[-k:]  # the kernel's fields end the line; the command is ignored
        if (len(f) != k or not _DIGITS.match(f[0]) or not _DIGITS.match(f[1]) or f[2] not in _YN
                or f[3] not in _YN or not _INT.match(f[4]) or not _DIGITS.match(f[5])
                or (k == 8 and not _DIGITS.fullmatch(f[7]))):
            malformed += 1  # also what a command holding a newline leaves before its line
            continue
        pid = f[0].lstrip("0") or "0"
        counts[pid] = counts.get(pid, 0) + 1
    return counts, malformed


def kernel_release(release: str | None = None) -> tuple[int, int]:
    """(major, minor) of the running kernel (``uname -r``); (0, 0) when it cannot be read."""
    m = re.match(r"([0-9]+)\.([0-9]+)", release if release is not None else os.uname().release)
    return (int(m[1]), int(m[2])) if m else (0, 0)


class ClientList:
    """The counted cards' client lists under ``<sysfs>/kernel/debug/dri``, read once a poll."""

    def __init__(self, procfs: str, sysfs: str) -> None:
        self.procfs = procfs
        self.sysfs = sysfs
        self.root = f"{sysfs}/kernel/debug/dri"
        self._names: frozenset[str] | None = None
        self._minors: list[str] = []
        self.reason = ""  # why the last read answered None ("" when it answered)
        self.absent = False  # ... because there is no debugfs ``dri`` directory at all
        # whether a drm_file handed to another process (SCM_RIGHTS, fork) shows under the process
        # that uses it: Linux 6.7+; before, the list is a hint only (pids examined at once) and the
        # blind re-verification keeps its period (a distribution kernel numbered lower with the
        # change backported is under-used, never over-trusted)
        self.handover = kernel_release() >= HANDOVER_KERNEL
        self.listed: dict[str, int] | None = None  # this poll's list (tgid -> drm_files), None: not used
        self.prev: dict[str, int] | None = None  # the last poll's
        self._seen: dict[str, tuple[float, float]] = {}  # tgid -> (next examination, back-off gap)
        self._pruned = 0.0
        self._skip, self._cool = 0, 0  # polls the list is not read after a too large one, and their next number

    @property
    def used(self) -> bool:
        """Whether this poll uses the list (instead of the blind re-verification)."""
        return self.listed is not None

    def poll(self, errors: dict) -> dict[str, int] | None:
        """Read this poll's list (``read``); a list that is there but not usable is counted in
        ``errors["clients_list_unavailable"]``."""
        self.prev, self.listed = self.listed, self.read(errors)
        if self.listed is None and self._minors and not self.absent:
            errors["clients_list_unavailable"] = errors.get("clients_list_unavailable", 0) + 1
        return self.listed

    def vouches(self, vouched: int) -> bool:
        """Whether a due re-verification of a table may be a check this poll: the list holds, on a
        kernel where a handed-over drm_file moves to its user, and it stood in fewer than
        ``LIST_VERIFY_EVERY - 1`` times in a row (an fd received or inherited and never used
        shows nowhere in the list: the real one finds it)."""
        return self.listed is not None and self.handover and vouched < LIST_VERIFY_EVERY - 1

    def due(self, pids: dict, now: float) -> set[str]:
        """The pids of ``pids`` (the scanner's records, examined whole: ``done``) to examine now,
        every fd: one listed with more drm_files than in the last poll's list (absent there
        counts 0: a drm_file opened by it, or handed to it and used), or than DRM fds known in it
        (``drm``), unless it is backing off (``examined``)."""
        if not self.listed:
            return set()
        prev, seen = self.prev, self._seen
        out = set()
        for p, n in self.listed.items():
            st = pids.get(p)
            if st is None or not st.done:
                continue  # not a process here (yet): new pids are examined at once anyway
            if (n > len(st.drm) or (prev is not None and n > prev.get(p, 0))) and now >= seen.get(p, (0.0, 0.0))[0]:
                out.add(p)
        return out

    def examined(self, pid: str, found: bool, now: float, max_gap: float) -> None:
        """After an examination ``due`` asked for: one that found a new DRM fd ends the pid's
        back-off; one that found none (a drm_file its child holds, a kernel client naming a pid
        since reused, a line that comes and goes, one a forged ``comm`` adds) puts the next one
        1, 2, 4, ... s later, at most ``max_gap``: a listed pid never costs a whole table every
        poll.  Entries end ``max_gap`` after their last back-off (a line that left the list and
        comes back within it keeps backing off)."""
        seen = self._seen
        if found:
            seen.pop(pid, None)
        else:
            gap = min(max(2 * seen.get(pid, (0.0, 0.0))[1], 1.0), max_gap)
            seen[pid] = (now + gap, gap)
        if len(seen) > 64 and now >= self._pruned:  # bounded by the lines of the last max_gap
            self._pruned = now + max_gap
            self._seen = {p: v for p, v in seen.items() if v[0] + max_gap > now}

    def minors(self) -> list[str]:
        """The minor numbers of the cards bound to a counted driver, or to a driver that cannot
        be read (re-read when the entries of ``class/drm`` change: one listdir a poll)."""
        drm = f"{self.sysfs}/class/drm"
        try:
            names = frozenset(os.listdir(drm))
        except OSError:
            names = frozenset()
        if names != self._names:
            self._names = names
            out = []
            for name in sorted(n for n in names if _CARD.match(n)):
                driver = device_driver(f"{drm}/{name}/device")
                if driver in COUNTED_DRIVERS or not driver:  # unknown: it may be counted
                    out.append(name[4:])
            self._minors = out
        return self._minors

    def same_pid_namespace(self) -> bool:
        """Whether the tgids the kernel prints for this process (its own PID namespace) name the
        procfs's entries: ``<procfs>/self`` is this process there (a fixture tree has no ``self``)."""
        try:
            return int(os.readlink(f"{self.procfs}/self")) == os.getpid()
        except FileNotFoundError:
            return not os.path.lexists(f"{self.procfs}/self")
        except (OSError, ValueError):
            return False

    def read(self, errors: dict) -> dict[str, int] | None:
        """tgid -> ``drm_file`` count over every counted card, or None (``reason`` says why)
        when the list does not hold for one of them this poll.  Malformed lines are counted in
        ``errors["clients_list_malformed"]``; a list that is there but cannot be used (no
        permission, a card without its file, an unknown layout, above the bounds, another PID
        namespace) in ``errors["clients_list_unavailable"]``, once a poll.  No ``dri`` directory
        at all (``absent``: debugfs not mounted or not visible, a deployment's steady state) is
        not counted: docs/detection.md says where the list is there."""
        minors = self.minors()
        self.absent = False
        if not minors:
            self.reason = "no counted card"
            return None
        if not os.path.lexists(self.root):  # debugfs not mounted, or not in this mount namespace
            self.reason, self.absent = f"{self.root} not found", True
            return None
        if not self.same_pid_namespace():
            self.reason = "another PID namespace than the procfs"
            return None
        if self._skip:  # the kernel builds the whole file before the first byte: not every poll
            self._skip -= 1
            self.reason = f"a {self.root}/<minor>/clients above {MAX_BYTES} bytes: read again in {self._skip + 1} polls"
            return None
        total: dict[str, int] = {}
        for minor in minors:
            try:
                dir_fd = safefile.open_dir(f"{self.root}/{minor}")
                try:
                    data = safefile.read_at(dir_fd, "clients", MAX_BYTES)
                finally:
                    os.close(dir_fd)
            except OSError as exc:  # not mounted, no permission, lockdown, too large, ...
                if isinstance(exc, safefile.TooLarge):  # 1, 2, 4, ... 64 polls before the next read
                    self._cool = min(max(2 * self._cool, 1), 64)
                    self._skip = self._cool
                self.reason = f"{self.root}/{minor}/clients: {exc.strerror or exc}"
                return None
            got = parse(data.decode("utf-8", "replace"))
            if got is None:
                self.reason = f"{self.root}/{minor}/clients: a header of no known layout, or too many lines"
                return None
            counts, malformed = got
            if malformed:
                errors["clients_list_malformed"] = errors.get("clients_list_malformed", 0) + malformed
            for pid, n in counts.items():
                total[pid] = total.get(pid, 0) + n
        self.reason, self._cool = "", 0
        return total

