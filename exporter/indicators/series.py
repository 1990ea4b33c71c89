"""Reading the canonical series keys the engine receives.

A key is the series name (a series without labels beyond the GPU's identity) or, for a labelled
series, ``(name, ((label, value), ...))``: the daemon's indicator feed hands structured keys, so
a label value is never quoted and parsed back.  A hand-written ``name{label="v",...}`` string is
also accepted (tests, tools) and parsed with Prometheus escaping.

Per device, the engine only needs a few labelled families: throttle reasons, interconnect byte
counters and interconnect utilization.  ``SeriesIndex`` classifies each key once and remembers
the answer (keys repeat every poll), so a poll costs one dictionary lookup per key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from ..model import Labels

InputKey = str | tuple[str, Labels]  # "name" or (name, extra labels)

_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')

THROTTLE = "gpu_throttle_active"
IC_BYTES = "gpu_interconnect_bytes_total"
IC_UTIL = "gpu_interconnect_utilization_percent"
PROC_UTIL = "gpu_process_utilization_percent"


def parse_key(key: str) -> tuple[str, dict[str, str]]:
    """Split ``name{a="x",b="y"}`` into ``("name", {"a": "x", "b": "y"})``."""
    brace = key.find("{")
    if brace < 0:
        return key, {}
    name = key[:brace]
    body = key[brace + 1:key.rfind("}")] if key.endswith("}") else key[brace + 1:]
    labels = {m.group(1): m.group(2).replace('\\"', '"').replace("\\\\", "\\")
              for m in _LABEL.finditer(body)}
    return name, labels


@dataclass(slots=True)
class LabelledSignals:
    """What one device's labelled series say this poll."""

    throttle: dict[str, bool] = field(default_factory=dict)  # reason -> active on any gt
    interconnect_bytes: float | None = None  # sum over links and directions
    interconnect_series: int = 0  # how many counters were summed
    link_util: float | None = None  # highest link utilization
    # per-process utilization: pid -> highest value over its engines (None: no per-process data)
    processes: dict[str, float] | None = None
    names: dict[str, str] = field(default_factory=dict)  # pid -> process name

    def top_process(self, active_percent: float) -> str | None:
        """Name of the busiest active process (not the pooled pid="other"), if any."""
        if not self.processes:
            return None
        best = max(((v, pid) for pid, v in self.processes.items() if pid != "other" and v >= active_percent),
                   default=None)
        return self.names.get(best[1]) or None if best is not None else None

    def active_clients(self, active_percent: float) -> int | None:
        """Processes at or above ``active_percent``; None without per-process utilization."""
        if self.processes is None:
            return None
        return sum(1 for v in self.processes.values() if v >= active_percent)


class SeriesIndex:
    """Classifies series keys (cached) and gathers the labelled signals of one device."""

    def __init__(self, max_keys: int = 16384) -> None:
        self._kind: dict[InputKey, tuple[str, str] | None] = {}
        self._names: dict[str, str] = {}  # pid -> process name of the keys seen
        self._max = max_keys
        self.epoch = 0  # bumped when the classification cache starts over

    def _classify(self, key: InputKey) -> tuple[str, str] | None:
        if isinstance(key, str) and "{" not in key:
            kind = None  # no labels: not one of the labelled families
        else:
            name, labels = (key[0], dict(key[1])) if isinstance(key, tuple) else parse_key(key)
            if name == THROTTLE and "reason" in labels:
                kind = (THROTTLE, labels["reason"])
            elif name in (IC_BYTES, IC_UTIL):
                kind = (name, "")
            elif name == PROC_UTIL and "pid" in labels:
                kind = (PROC_UTIL, labels["pid"])
                self._names[labels["pid"]] = labels.get("process", "")
            else:
                kind = None
        if len(self._kind) >= self._max:  # keys churn (e.g. per-process labels): start over
            self._kind.clear()
            self._names.clear()
            self.epoch += 1
        self._kind[key] = kind
        return kind

    def labelled(self, series: Mapping[InputKey, float]) -> LabelledKeys:
        """The keys of ``series`` in one of the labelled families, by family, in series order."""
        epoch = self.epoch
        out = self._labelled(series)
        if self.epoch != epoch:  # started over meanwhile: the process names of the first keys went
            out = self._labelled(series)
        return out

    def _labelled(self, series: Mapping[InputKey, float]) -> LabelledKeys:
        kinds = self._kind
        out = LabelledKeys([], [], [], [])
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
            else:
                out.link_util.append(key)
        return out

    def gather(self, series: Mapping[InputKey, float], labelled: LabelledKeys | None = None) -> LabelledSignals:
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

    throttle: list[tuple[InputKey, str]]  # (key, reason)
    processes: list[tuple[InputKey, str]]  # (key, pid)
    interconnect_bytes: list[InputKey]
    link_util: list[InputKey]
