"""Co-tenancy evidence per device: busy clients held over, and what the count may be trusted for.

Sources mark each GPU they counted (``gpu_client_evidence``, sources/evidence.py); per-process
or count-only client series carry the values.  ``device_evidence`` says whether the count is
complete (every client seen: no client means 0), partial (some processes unreadable: two clients
prove co-tenancy, fewer prove nothing) or absent, and ``trusted`` turns a count into what the
state machine may use.  ``held_clients`` keeps a client busy for ``client_holdover_seconds``
after it was last seen busy where it bridges a gap in a co-tenancy actually seen (a process list
that misses a time-sliced tenant for one poll does not flip the state; a finished job is not a
neighbour of its successor).
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
# partial-evidence reasons that say tenants may hide behind the count (the state names them)
UNCOUNTED = frozenset({"mps_clients_uncountable", "mps_client_activity_unknown"})


def held_clients(st: _DeviceState, labelled: LabelledSignals, now: float, scfg: StateConfig,
                 interval: float = 0.0) -> dict[str, int]:
    """Busy clients per GPU instance ("" outside MIG).  A client seen busy counts; one not seen
    busy this poll is held for ``client_holdover_seconds`` (and at least two poll intervals,
    ``interval``, of the source that counted it) after it was last seen busy, but only to bridge
    a gap in a co-tenancy: it counts while a client it was last seen busy together with is busy
    now (a process list that misses a time-sliced tenant for one poll must not flip the state).
    A client that was busy alone (a finished job followed by the next one, never concurrent)
    is not held.  The clients seen busy this poll (no hold-over) go to ``st.seen_counts``:
    contended time resting on held clients only is booked once they are seen again
    (``book_contention``).  MIG instances without per-process utilization give their compute
    contexts as a negative count (contexts prove no activity: ``mig.py``)."""
    seen, partners = st.client_seen, st.client_partners
    busy = labelled.busy(scfg.client_active_percent)
    by_gi: dict[str, set[tuple[str, str]]] = {}
    for client in busy:
        seen[client] = now
        by_gi.setdefault(client[0], set()).add(client)
    for client in busy:
        partners[client] = frozenset(by_gi[client[0]] - {client})
    if seen:
        hold = max(scfg.client_holdover_seconds, 2.0 * interval)
        for client in [c for c, t in seen.items() if now - t > hold or t > now]:
            del seen[client]
            partners.pop(client, None)
        if len(seen) > _MAX_CLIENTS:  # bounded whatever the process churn
            for client in sorted(seen, key=seen.__getitem__)[:len(seen) - _MAX_CLIENTS]:
                del seen[client]
                partners.pop(client, None)
    now_busy = set(busy)
    counts: dict[str, int] = {}
    seen_counts: dict[str, int] = {}
    for client in seen:
        gi = client[0]
        if client in now_busy:
            seen_counts[gi] = seen_counts.get(gi, 0) + 1
        elif not partners.get(client, frozenset()) & now_busy:
            continue  # not bridging a gap in a co-tenancy seen: a finished job, or one alone
        counts[gi] = counts.get(gi, 0) + 1
    st.seen_counts = seen_counts
    for gi, n in labelled.contexts.items():
        if gi not in counts:
            counts[gi] = -int(n)  # contexts: no activity evidence of their own (mig.py)
    return counts


def held_only(st: _DeviceState, held: dict[str, int], min_clients: int) -> bool:
    """Whether the co-tenancy of this poll rests on held-over clients only: some GPU instance
    has ``min_clients`` counting the hold-over but fewer seen busy this poll."""
    return any(n >= min_clients and st.seen_counts.get(gi, 0) < min_clients for gi, n in held.items())


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


def book_contention(st: _DeviceState, basis: str | None, contended: bool, provisional: bool, dt: float,
                    dollars: float) -> None:
    """Advance the contention seconds (of ``basis``; None: no bandwidth basis, seconds not
    counted) and cost counters by one update: booked at once on evidence seen this poll; held
    aside while the co-tenancy rests on held-over clients (``provisional``) and booked when they
    are seen busy again (the gap was a flicker), dropped when the state leaves ``contended``
    without them (the neighbour had gone: no phantom seconds after an episode)."""
    if not contended:
        st.pending_seconds.clear()
        st.pending_dollars = 0.0
        return
    if provisional:
        if basis is not None:
            st.pending_seconds[basis] = st.pending_seconds.get(basis, 0.0) + dt
        st.pending_dollars += dollars
        return
    for b, seconds in st.pending_seconds.items():
        st.contention_seconds[b] = st.contention_seconds.get(b, 0.0) + seconds
    st.pending_seconds.clear()
    if basis is not None:
        st.contention_seconds[basis] = st.contention_seconds.get(basis, 0.0) + dt
    st.cost_dollars += st.pending_dollars + dollars
    st.pending_dollars = 0.0
