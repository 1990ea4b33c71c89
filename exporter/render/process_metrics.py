"""The standard ``process_*`` metrics every Prometheus exporter serves, read from ``/proc/self``.

Names and meaning as the Prometheus client libraries define them (CPU seconds, resident and
virtual memory bytes, start time, open and maximum file descriptors), so the usual "exporter
overhead" dashboards and alerts work unchanged.  Written here rather than imported from
prometheus_client: its process collector would pull the whole client library into a start-up
that does not otherwise need it.  Off Linux (no ``/proc``) only the CPU seconds are given.
"""

from __future__ import annotations

import os
import resource

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

HELP = {
    "process_cpu_seconds_total": ("counter", "Total user and system CPU time spent in seconds."),
    "process_resident_memory_bytes": ("gauge", "Resident memory size in bytes."),
    "process_virtual_memory_bytes": ("gauge", "Virtual memory size in bytes."),
    "process_start_time_seconds": ("gauge", "Start time of the process since unix epoch in seconds."),
    "process_open_fds": ("gauge", "Number of open file descriptors."),
    "process_max_fds": ("gauge", "Maximum number of open file descriptors."),
}

_start_time: float | None = None


def _boot_time() -> float:
    with open("/proc/stat", "rb") as fh:
        for line in fh:
            if line.startswith(b"btime "):
                return float(line.split()[1])
    raise OSError("no btime in /proc/stat")


def sample() -> dict[str, float]:
    """Current values by metric name (``process_cpu_seconds_total`` always; the rest on Linux)."""
    global _start_time
    t = os.times()
    out = {"process_cpu_seconds_total": t.user + t.system}
    try:
        with open("/proc/self/stat", "rb") as fh:
            # the fields after the command name, which is in parentheses and may hold spaces
            fields = fh.read().rpartition(b")")[2].split()
        out["process_virtual_memory_bytes"] = float(fields[20])
        out["process_resident_memory_bytes"] = float(fields[21]) * _PAGE
        if _start_time is None:
            _start_time = _boot_time() + int(fields[19]) / _TICKS
        out["process_start_time_seconds"] = _start_time
        out["process_open_fds"] = float(len(os.listdir("/proc/self/fd")))
        out["process_max_fds"] = float(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    except (OSError, IndexError, ValueError):
        pass
    return out
