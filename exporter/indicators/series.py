"""Reading the labelled series of one GPU's frame.

The engine receives a frame per GPU: ``{(name, extra labels): value}`` (``model.SeriesId``).
Per device it needs only a few labelled families: throttle reasons, interconnect counters and
utilization, per-process and count-only clients, clocks, MIG instances.  ``SeriesIndex``
classifies each series id once and remembers the answer (ids repeat every poll), so a poll costs
one dictionary lookup per series.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..model import SeriesId

THROTTLE = "gpu_throttle_active"
IC_BYTES = "gpu_interconnect_bytes_total"
IC_UTIL = "gpu_interconnect_utilization_percent"
PROC_UTIL = "gpu_process_utilization_percent"
# count-only co-tenancy evidence (sources/evidence.py): internal families, never served
CLIENT_UTIL = "gpu_client_utilization_percent"
CLIENT_CONTEXTS = "gpu_client_contexts"
CLIENT_EVIDENCE = "gpu_client_evidence"
CLOCK = "gpu_clock_mhz"
CLOCK_MAX = "gpu_clock_max_mhz"
CLOCK_DOMAINS = ("sm", "graphics", "gfx")  # the compute clock, in order of preference
# per MIG GPU instance (label gpu_instance): the load signals of one instance's state
INSTANCE_SERIES = frozenset({"gpu_memory_bandwidth_utilization_percent", "gpu_compute_utilization_percent",
                             "gpu_compute_occupancy_percent", "gpu_sm_active_percent"})


@dataclass(slots=True)
class LabelledSignals:
    """What one device's labelled series say this poll."""

    throttle: dict[str, bool] = field(default_factory=dict)  # reason -> active on any gt
    interconnect_bytes: float | None = None  # sum over links and directions
    interconnect_series: int = 0  # how many counters were summed
    link_util: float | None = None  # highest link utilization
    # per-process (or count-only client) utilization: (gpu instance or "", pid) -> highest value
    # over its engines (None: no per-process data at all)
    processes: dict[tuple[str, str], float] | None = None
    names: dict[tuple[str, str], str] = field(default_factory=dict)  # -> process name (series only)
    # MIG: processes holding a compute context per GPU instance (no per-process utilization)
    contexts: dict[str, float] = field(default_factory=dict)
    # evidence source -> (1 counted every client / 0 could not, reason)
    evidence: dict[str, tuple[float, str]] = field(default_factory=dict)
    clock: dict[str, float] = field(default_factory=dict)  # domain -> MHz
    clock_max: dict[str, float] = field(default_factory=dict)
    # MIG: gpu instance -> {series name: value}, and its profile
    instances: dict[str, dict[str, float]] = field(default_factory=dict)
    profiles: dict[str, str] = field(default_factory=dict)

    def top_process(self, active_percent: float) -> str | None:
        """Name of the busiest active process (not the pooled pid="other"), if any."""
        if not self.processes:
            return None
        best = max(((v, k) for k, v in self.processes.items() if k[1] != "other" and v >= active_percent),
                   default=None)
        return self.names.get(best[1]) or None if best is not None else None

    def busy(self, active_percent: float) -> list[tuple[str, str]]:
        """The (gpu instance, pid) of every client at or above ``active_percent``."""
        if not self.processes:
            return []
        return [k for k, v in self.processes.items() if v >= active_percent]

    def clock_ratio(self) -> float | None:
        """Current / maximum compute clock (the first domain reporting both), else None."""
        for domain in CLOCK_DOMAINS:
            cur, top = self.clock.get(domain), self.clock_max.get(domain)
            if cur is not None and top:
                return cur / top
        return None


class SeriesIndex:
    """Classifies series keys (cached) and gathers the labelled signals of one device."""

    def __init__(self, max_keys: int = 16384) -> None:
        self._kind: dict[SeriesId, tuple[str, Any] | None] = {}
        self._names: dict[tuple[str, str], str] = {}  # (instance, pid) -> process name of the keys seen
        self._max = max_keys
        self.epoch = 0  # bumped when the classification cache starts over

    def _classify(self, key: SeriesId) -> tuple[str, Any] | None:
        if not key[1]:
            kind = None  # no labels: not one of the labelled families
        else:
            name, labels = key[0], dict(key[1])
            if name == THROTTLE and "reason" in labels:
                kind = (THROTTLE, labels["reason"])
            elif name in (IC_BYTES, IC_UTIL):
                kind = (name, "")
            elif (name == PROC_UTIL and "pid" in labels) or (name == CLIENT_UTIL and "client" in labels):
                client = (labels.get("gpu_instance", ""), labels.get("pid") or labels.get("client", ""))
                kind = (PROC_UTIL, client)
                self._names[client] = labels.get("process", "")
            elif name == CLIENT_CONTEXTS:
                kind = (CLIENT_CONTEXTS, (labels.get("gpu_instance", ""), labels.get("mig_profile", "")))
            elif name == CLIENT_EVIDENCE and "evidence" in labels:
                kind = (CLIENT_EVIDENCE, (labels["evidence"], labels.get("reason", "")))
            elif name in (CLOCK, CLOCK_MAX) and labels.get("domain") in CLOCK_DOMAINS:
                kind = (name, labels["domain"])
            elif name in INSTANCE_SERIES and "gpu_instance" in labels:
                kind = ("instance", (labels["gpu_instance"], name, labels.get("mig_profile", "")))
            else:
                kind = None
        if len(self._kind) >= self._max:  # keys churn (e.g. per-process labels): start over
            self._kind.clear()
            self._names.clear()
            self.epoch += 1
        self._kind[key] = kind
        return kind

    def labelled(self, series: Mapping[SeriesId, float]) -> LabelledKeys:
        """The keys of ``series`` in one of the labelled families, by family, in series order."""
        epoch = self.epoch
        out = self._labelled(series)
        if self.epoch != epoch:  # started over meanwhile: the process names of the first keys went
            out = self._labelled(series)
        return out

    def _labelled(self, series: Mapping[SeriesId, float]) -> LabelledKeys:
        kinds = self._kind
        out = LabelledKeys([], [], [], [], [])
        for key in series:
            kind = kinds.get(key, False)
            if kind is False:
                kind = self._classify(key)
            if kind is None:
                continue
            family, reason = kind
            if family == THROTTLE:
                out.throttle.append((key, reason))
            elif family == PROC_UTIL:
                out.processes.append((key, reason))
            elif family == IC_BYTES:
                out.interconnect_bytes.append(key)
            elif family == IC_UTIL:
                out.link_util.append(key)
            else:
                out.other.append((key, family, reason))
        return out

    def gather(self, series: Mapping[SeriesId, float], labelled: LabelledKeys | None = None) -> LabelledSignals:
        """The labelled signals of one device; ``labelled``: ``self.labelled(series)`` when the
        caller kept it from an earlier poll with the same keys (and the same ``epoch``)."""
        if labelled is None:
            labelled = self.labelled(series)
        out = LabelledSignals()
        if labelled.throttle:
            throttle = out.throttle
            for key, reason in labelled.throttle:
                throttle[reason] = throttle.get(reason, False) or series[key] >= 0.5
        if labelled.processes:
            procs = out.processes = {}
            names = out.names
            for key, pid in labelled.processes:
                value = series[key]
                if value > procs.get(pid, -1.0):
                    procs[pid] = value
                    names[pid] = self._names.get(pid, "")
        for key, family, what in labelled.other:
            value = series[key]
            if family == CLIENT_CONTEXTS:
                gi, profile = what
                out.contexts[gi] = out.contexts.get(gi, 0.0) + value
                if profile:
                    out.profiles.setdefault(gi, profile)
            elif family == CLIENT_EVIDENCE:
                source, reason = what
                have = out.evidence.get(source)
                if have is None or value > have[0]:
                    out.evidence[source] = (value, reason)
            elif family == CLOCK:
                out.clock[what] = value
            elif family == CLOCK_MAX:
                out.clock_max[what] = value
            else:  # instance
                gi, name, profile = what
                out.instances.setdefault(gi, {})[name] = value
                if profile:
                    out.profiles[gi] = profile
        if labelled.interconnect_bytes:
            ic_sum = 0.0
            for key in labelled.interconnect_bytes:
                ic_sum += series[key]
            out.interconnect_bytes = ic_sum
            out.interconnect_series = len(labelled.interconnect_bytes)
        if labelled.link_util:
            out.link_util = max([series[key] for key in labelled.link_util])
        return out


class LabelledKeys(NamedTuple):
    """A device's keys of each labelled family, in series order."""

    throttle: list[tuple[SeriesId, str]]  # (key, reason)
    processes: list[tuple[SeriesId, tuple[str, str]]]  # (key, (gpu instance, pid))
    interconnect_bytes: list[SeriesId]
    link_util: list[SeriesId]
    other: list[tuple[SeriesId, str, Any]]  # (key, family, what): contexts, evidence, clocks, instances
