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
what is missing: ``pid_namespace_private``, ``procfs_unreadable``, ``not_supported``).
"""

from __future__ import annotations

from .base import PollResult

EVIDENCE_RAW = "client.evidence"


def mark(sample: PollResult, key: str, source: str, complete: bool, reason: str = "") -> None:
    """Say that ``source`` counted (``complete``) or could not count the clients of GPU ``key``."""
    sample.add(key, EVIDENCE_RAW, 1.0 if complete else 0.0,
               (("evidence", source), ("reason", "" if complete else reason)))
