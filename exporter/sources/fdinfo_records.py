"""What the DRM fdinfo source asks of a scanner, and the scanner that answers in this process.

``DrmFdinfoSource`` asks ``scanner.scan(errors, now)`` for the parsed fdinfo of every DRM client
found (``(pid, fd, FdinfoRecord)``) and then reads ``host_pids``, ``unreadable``, ``partial`` and
``budget_hit`` (what ``evidence.visibility`` needs) and, with ``processes: series``, ``comm(pid)``.
Two scanners answer it:

- ``LocalScanner``: ``fdinfo_scan.FdScanner`` and ``fdinfo_parser.parse_fdinfo`` in this process.
  Tests, unprivileged runs (nothing to separate: the process holds no capability) and the
  counting process itself use it;
- the privilege-separated one (``exporter/privsep/``): the same ``LocalScanner`` runs in a
  separate, non-dumpable process that alone holds CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH, and
  only the parsed numbers come back (docs/privileges.md, "Which process holds what").

``use_factory`` installs the factory that creates the scanner of every source made afterwards
(the daemon installs the separated one at start, before it drops its own capabilities).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from .. import safefile
from .evidence import COMM_MAX_BYTES, host_pid_namespace
from .fdinfo_parser import FdinfoRecord, parse_fdinfo
from .fdinfo_scan import FdScanner, ScanLimits

Found = list[tuple[str, str, FdinfoRecord]]


class Scanner(Protocol):
    separated: bool  # the scan runs in another process (the privilege-separated counter)
    failed: bool  # the last scan got no usable answer (its count reads read_error)
    host_pids: bool
    unreadable: int
    partial: bool
    budget_hit: bool

    def scan(self, errors: dict, now: float) -> Found: ...

    def comm(self, pid: str) -> str: ...

    def close(self) -> None: ...


class LocalScanner:
    """``FdScanner`` + ``parse_fdinfo`` in this process; ``names``: read ``comm`` of the pids found."""

    separated = False
    failed = False

    def __init__(self, procfs: Path, sysfs: Path | None, limits: ScanLimits | None = None, *,
                 names: bool = False, max_records: int | None = None) -> None:
        self.procfs = Path(procfs)
        self.fds = FdScanner(self.procfs, sysfs, limits, max_records)
        self.names = names
        self.max_records = max_records
        self._host_pids: bool | None = None
        self.budget_hit = False
        self._cut = False

    @property
    def host_pids(self) -> bool:
        """Whether the procfs shows the host's PID namespace (read once: a process keeps its
        PID namespace)."""
        if self._host_pids is None:
            self._host_pids = host_pid_namespace(self.procfs)
        return self._host_pids

    @property
    def unreadable(self) -> int:
        return self.fds.unreadable

    @property
    def partial(self) -> bool:
        return self.fds.partial or self._cut

    def scan(self, errors: dict, now: float) -> Found:
        out: Found = []
        cut = False
        for pid, fd, text in self.fds.scan(errors, now):
            rec = parse_fdinfo(text)
            if rec is None:
                continue
            if self.max_records is not None and len(out) >= self.max_records:
                cut = True  # the rest of this poll is not answered: a partial count
                continue
            out.append((pid, fd, rec))
        self._cut = cut
        self.budget_hit = self.fds.budget_hit or cut
        return out

    def comm(self, pid: str) -> str:
        try:
            text = safefile.read_path(self.procfs / pid / "comm", COMM_MAX_BYTES).decode("utf-8", "strict").strip()
        except (OSError, UnicodeDecodeError):
            return "unknown"
        return text or "unknown"

    def close(self) -> None:
        pass


Factory = Callable[..., Scanner]
_factory: Factory | None = None


def use_factory(factory: Factory | None) -> None:
    """Create the scanners of sources made from now on with ``factory(procfs, sysfs, limits,
    names=...)`` (None: ``LocalScanner``)."""
    global _factory
    _factory = factory


def make_scanner(procfs: Path, sysfs: Path, limits: ScanLimits, *, names: bool) -> Scanner:
    return (_factory or LocalScanner)(procfs, sysfs, limits, names=names)
