"""Co-tenancy evidence a source collects: how many clients are busy on each GPU.

The contention state needs to know whether a memory-bound GPU has one tenant or several
(docs/detection.md).  Each source that can see clients (NVML per-process utilization, DRM
fdinfo, amdsmi process lists) has an option ``processes``:

* ``count`` (the default): the source reads what the count needs and emits it as the internal
  ``client.*`` readings (canonical ``gpu_client_*`` families, ``internal: true`` in the schema):
  they reach the indicator engine, which exports ``gpu_active_clients``, but ``/metrics`` never
  serves them, so no pid or process name is exported;
* ``series`` (``true`` in older configs): the per-process series ``gpu_process_*`` with ``pid``
  and ``process`` labels are exported as well (cardinality and privacy: opt-in), and are the
  engine's input;
* ``off`` (``false``): nothing is read; the GPU's state is decided without co-tenancy evidence.

Alongside the clients, a source marks each GPU it counted with ``client.evidence`` (labels
``evidence`` = the source, ``reason``): 1 when it saw every client of the GPU this poll (so no
client reading means zero clients, not missing data), 0 when it could not (the reason names
what is missing: ``pid_namespace_private``, ``procfs_unreadable``, ``scan_budget_exceeded``,
``not_supported``).
"""

from __future__ import annotations

import os
from pathlib import Path

from .. import safefile
from .base import PollResult

EVIDENCE_RAW = "client.evidence"
COMM_MAX_BYTES = 4096  # the most read of a /proc/<pid>/comm


def mark(sample: PollResult, key: str, source: str, complete: bool, reason: str = "") -> None:
    """Say that ``source`` counted (``complete``) or could not count the clients of GPU ``key``."""
    sample.add(key, EVIDENCE_RAW, 1.0 if complete else 0.0,
               (("evidence", source), ("reason", "" if complete else reason)))


def host_pid_namespace(procfs: Path) -> bool:
    """Whether ``procfs`` shows the host's processes: kthreadd is pid 2 only in the initial PID
    namespace (a container without hostPID sees its own processes only)."""
    try:
        return safefile.read_path(Path(procfs) / "2" / "comm", COMM_MAX_BYTES).strip() == b"kthreadd"
    except OSError:
        return False


def visibility(host_pids: bool, unreadable: bool, over_budget: bool = False) -> tuple[bool, str]:
    """(complete, reason) of a client count made by walking a procfs: complete only in the host
    PID namespace with nothing ``unreadable`` and nothing left unexamined by the per-poll scan
    budget (``scan_budget_exceeded``: a new process not yet examined, a re-verification overdue)."""
    if not host_pids:
        return False, "pid_namespace_private"
    if unreadable:
        return False, "procfs_unreadable"
    if over_budget:
        return False, "scan_budget_exceeded"
    return True, ""


def pid_entries(procfs: Path | str) -> list[os.DirEntry[str]]:
    """The entries of ``procfs`` named with ASCII digits only (``str.isdigit()`` also takes "²"
    or "٣", which ``int()`` refuses); raises OSError when ``procfs`` cannot be listed."""
    with os.scandir(procfs) as entries:
        return [e for e in entries if e.name.isascii() and e.name.isdigit()]


def procfs_visibility(procfs: Path, host_pids: bool) -> tuple[bool, str]:
    """(complete, reason) of a client count made by walking ``procfs`` the way amdsmi's process
    list does (``/proc/<pid>/fdinfo`` of every process it may ``access(R_OK)``; the others are
    skipped silently): complete only in the host PID namespace with every fdinfo directory
    accessible.  ``access()`` checks with the real uid and, for a non-root real uid, no
    capabilities: other users' fdinfo passes only for a real uid of 0 with CAP_SYS_PTRACE and
    CAP_DAC_READ_SEARCH (a dynamic user with those capabilities still reads procfs_unreadable)."""
    if not host_pids:
        return visibility(False, False)
    try:
        pids = [e.name for e in pid_entries(procfs)]
    except OSError:
        return visibility(True, True)
    return visibility(True, any(  # a pid still a directory: not one that just exited
        not os.access(f"{procfs}/{pid}/fdinfo", os.R_OK) and os.path.isdir(f"{procfs}/{pid}") for pid in pids))
