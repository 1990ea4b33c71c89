"""Co-tenancy evidence per device: busy clients held over, and what the count may be trusted for.

Sources mark each GPU they counted (``gpu_client_evidence``, sources/evidence.py); per-process
or count-only client series carry the values.  ``device_evidence`` says whether the count is
complete (every client seen: no client means 0), partial (some processes unreadable: two clients
prove co-tenancy, fewer prove nothing) or absent, and ``trusted`` turns a count into what the
state machine may use.  ``held_clients`` keeps a client busy for ``client_holdover_seconds``
after it was last seen busy, so a process list that misses a time-sliced tenant for one poll
does not flip the state.
"""

from __future__ import annotations

import logging
from typing import Any

from ..model import DeviceId
from .config import StateConfig
from .device_state import _DeviceState
from .series import LabelledSignals

log = logging.getLogger("exporter.indicators.engine")
_MAX_CLIENTS = 256  # clients held over per device


def held_clients(st: _DeviceState, labelled: LabelledSignals, now: float, scfg: StateConfig,
                 interval: float = 0.0) -> dict[str, int]:
    """Busy clients per GPU instance ("" outside MIG), each counted for
    ``client_holdover_seconds``, and at least two poll intervals (``interval``) of the source that
    counted them, after it was last seen busy (a process list that misses a tenant for one poll
    must not flip the state, whatever that source's interval); MIG instances without
    per-process utilization count their compute contexts instead."""
    seen = st.client_seen
    for client in labelled.busy(scfg.client_active_percent):
        seen[client] = now
    if seen:
        hold = max(scfg.client_holdover_seconds, 2.0 * interval)
        for client in [c for c, t in seen.items() if now - t > hold or t > now]:
            del seen[client]
        if len(seen) > _MAX_CLIENTS:  # bounded whatever the process churn
            for client in sorted(seen, key=seen.__getitem__)[:len(seen) - _MAX_CLIENTS]:
                del seen[client]
    counts: dict[str, int] = {}
    for gi, _ in seen:
        counts[gi] = counts.get(gi, 0) + 1
    for gi, n in labelled.contexts.items():
        if gi not in counts:
            counts[gi] = -int(n)  # contexts: counted only while the instance is busy
    return counts


def evidence_key(labels: Any, counted: bool, reason: str, source: str) -> tuple[str, tuple]:
    """``gpu_contention_evidence_info``: whether the state could use a client count."""
    return ("gpu_contention_evidence_info", labels.many(
        ("evidence", "clients" if counted else "none"), ("reason", reason), ("source", source)))


def trusted(evidence: str, count: int, scfg: StateConfig) -> int | None:
    """The client count the state may use: all of it with complete evidence, a partial
    count only as proof of co-tenancy (some clients may be unseen), nothing without."""
    if evidence == "complete":
        return max(count, 0)
    if evidence == "partial" and count >= scfg.min_clients:
        return count
    return None


def say_evidence(said: set[tuple[str, str, str]], device_id: DeviceId, evidence: str, source: str,
                 reason: str) -> None:
    """One log line for the first GPU with each kind of co-tenancy evidence (at start, and when
    a new kind appears: a source that loses its access, say); ``said``: the kinds logged so far."""
    if (evidence, source, reason) in said:  # a small vocabulary: a few kinds per node
        return
    said.add((evidence, source, reason))
    gpu = f"{device_id[0]} gpu {device_id[1]} ({device_id[2] or 'no uuid'}) and GPUs like it"
    if evidence == "complete":
        log.info("co-tenancy evidence of %s: busy clients counted by %s", gpu, source)
    elif evidence == "partial":
        log.warning("co-tenancy evidence of %s: partial count by %s (%s): only two or more clients "
                    "are conclusive (docs/privileges.md)", gpu, source, reason)
    else:
        log.warning("co-tenancy evidence of %s: none (%s); a memory-bound GPU reads unknown: enable a "
                    "client count (collectors.<nvml|fdinfo|amdsmi>.options.processes, docs/privileges.md)",
                    gpu, reason)


def device_evidence(labelled: LabelledSignals) -> tuple[str, str, str]:
    """(complete | partial | none, source, reason) of the device's co-tenancy evidence."""
    ev = labelled.evidence
    if ev:
        complete = sorted(src for src, (value, _) in ev.items() if value >= 0.5)
        if complete:
            return "complete", complete[0], ""
        source = sorted(ev)[0]
        return "partial", source, ev[source][1] or "incomplete"
    if labelled.processes is not None:  # per-process series without a source's mark (older feeds)
        return "complete", "process_series", ""
    return "none", "", "no_client_source"
