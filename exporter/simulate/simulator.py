"""The built-in simulated node (``--simulate``).

A scenario (YAML) describes devices and timed phases in canonical terms.  The simulator turns
those targets back into each vendor's raw field names and units by inverting the device's own
mapping file, so simulated data travels through exactly the same mapping as real data: a
simulated H100 emits NVML-named milliwatts and millijoules, a simulated MI300X amdgpu sysfs
microwatts, a simulated Intel GPU an idle-residency counter in milliseconds.

Faults look as a real library shows them: a phase's ``events`` step counters once when it
starts, a ``lost`` GPU stays listed with ``device_up`` false and no readings (its events show when
it is back), a ``poll_error`` fails every poll (the source is down), and a device's
``unsupported`` series are never read.
"""

from __future__ import annotations

import hashlib
import random
import re
import socket
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from ..indicators.series import CLIENT_CONTEXTS
from ..map.schema import parse_operand
from ..model import Device, PollResult
from ..sources.base import Abilities, PollFailed, SourceBase, SourceUnavailable
from ..sources.context import DEFAULT_CONTEXT, SourceContext
from ..sources.options import SimulatorOptions
from .scenario import Cycle, Phase, SimDevice, Value, load_scenario

_PROC_UTIL = "gpu_process_utilization_percent"
_CLIENT_UTIL = "gpu_client_utilization_percent"
_EVIDENCE_KEY = ("gpu_client_evidence", (("evidence", "simulator"), ("reason", "")))
_REF_RE = re.compile(r"^=\s*([^*]+?)\s*(?:\*\s*([-+0-9.eE]+))?\s*$")


@dataclass(slots=True)
class _Emit:
    """How one canonical target becomes one raw reading of a device's mapping."""

    raw: str
    raw_labels: tuple[tuple[str, str], ...]
    kind: str  # gauge | counter | rate
    scale: float
    offset: float


@dataclass
class _SimState:
    dev: Device
    spec: SimDevice
    counters: dict[tuple, float] = field(default_factory=dict)
    # (device, mapping) pairs in order of preference: the live one, then extra_mappings
    outputs: list[tuple[Device, str]] = field(default_factory=list)
    evidence: bool = False  # a source counts this GPU's clients (decided once, from the scenario)
    # counter steps of phase events not reported yet (the GPU was lost), by target
    pending: dict[tuple, float] = field(default_factory=dict)
    stepped: set[str] = field(default_factory=set)  # counters an event stepped: reported from then on
    unsupported: list[tuple] = field(default_factory=list)  # (name, matchers) never reported


def host_name() -> str:
    """This machine's name: simulated GPU identities derive from it, so two demo nodes differ."""
    return socket.gethostname()


class SimulatorSource(SourceBase):
    """Options: ``scenario``; ``phase`` holds that phase until the process stops (none: the
    phases run in turn); ``host`` (default: the host name) seeds the simulated UUIDs and serials;
    ``speed`` runs the phases that many times faster (a time-compressed demo)."""

    name: ClassVar[str] = "simulator"
    abilities = Abilities(fast_poll=True)

    def __init__(self, context: SourceContext = DEFAULT_CONTEXT):
        options = context.typed(SimulatorOptions)
        self.scenario = load_scenario(options.scenario)
        self.mappings = context.mappings
        self.held: Phase | None = self.scenario.phase(options.phase) if options.phase else None
        self.host = options.host or host_name()
        self.speed = options.speed
        # as the real sources (sources/evidence.py): count (clients counted, per-process series
        # not exported), series (exported too), off (no evidence)
        self.processes = options.processes
        scale = options.devices_per_vendor_scale
        self.clock = time.monotonic
        self._rng = random.Random(self.scenario.seed)
        self._start: float | None = None
        self._last: float | None = None
        self._polls = 0  # full polls so far (Cycle values step with them)
        self._phase_seen: str | None = None  # the phase of the last full poll (events step on a change)
        self._plans: dict[str, dict[str, _Emit]] = {}
        self._states: list[_SimState] = []
        for spec in self.scenario.devices:
            for _ in range(spec.count * scale):
                dev = self._make_device(spec)
                st = _SimState(dev, spec)
                st.outputs = [(dev, spec.mapping)] + [
                    (replace(dev, key=f"{dev.key}#{m}", mapping=m), m) for m in spec.extra_mappings]
                st.evidence = self._has_evidence(st)
                st.unsupported = [parse_operand(k) for k in spec.unsupported]
                self._states.append(st)

    def _make_device(self, spec: SimDevice) -> Device:
        n = sum(1 for s in self._states if s.dev.vendor == spec.vendor)
        digest = hashlib.sha256(f"{self.host}/{self.scenario.name}/{spec.vendor}/{n}".encode()).hexdigest()
        uuid = {"nvidia": f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}",
                "amd": f"0x{digest[:16]}", "intel": f"{digest[:32]}"}[spec.vendor]
        bus = {"nvidia": 0x18, "amd": 0x8a, "intel": 0xc3}[spec.vendor] + n
        return Device(key=f"sim-{spec.vendor}-{n}", vendor=spec.vendor, index=str(n),
                      mapping=spec.mapping, uuid=uuid, model=spec.model,
                      pci_bus_id=f"0000:{bus:02x}:00.0", driver=spec.driver or "simulated",
                      serial=f"SIM{digest[:10].upper()}", simulated=True)

    # ------------------------------------------------------------------ Source protocol
    def open(self) -> None:
        if self.mappings is None:
            raise SourceUnavailable("simulator needs the mapping set")
        missing = sorted({m for s in self._states for _, m in s.outputs if self.mappings.get(m) is None})
        if missing:
            raise SourceUnavailable(f"scenario {self.scenario.name} uses unknown mappings: {missing}")
        self._start = self.clock()

    def close(self) -> None:
        pass

    def poll(self) -> PollResult:
        return self._sample(fast=False)

    def poll_fast(self) -> PollResult:
        """Only the gauges that feed the contention indicators (``fast: true`` metrics), at the current
        phase; counters and rates advance with full polls only."""
        return self._sample(fast=True)

    def _sample(self, fast: bool) -> PollResult:
        now = self.clock()
        if self._start is None:
            self._start = now
        phase = self._phase(now)
        if phase.poll_error:
            raise PollFailed(Counter({"read_error": 1}), f"simulated library error: {phase.poll_error}")
        if fast:
            dt = 0.0
        else:
            dt = 0.0 if self._last is None else max(0.0, now - self._last)
            self._last = now
            self._polls += 1
            if phase.name != self._phase_seen:
                self._phase_seen = phase.name
                self._step_events(phase)
        sample = PollResult(monotonic=now)
        fast_metrics = self.mappings.schema.fast_metrics if fast else frozenset()
        lost = set(phase.lost)
        for st in self._states:
            if f"{st.dev.vendor}:{st.dev.index}" in lost:
                for dev, _ in st.outputs:
                    sample.devices.append(dev)
                    sample.device_up[dev.key] = False
                continue
            targets = self._targets(st, phase)
            for dev, mapping in st.outputs:
                sample.devices.append(dev)
                plan = self._plan(mapping)
                emitted: set[tuple] = set()
                for kind in ("gauge",) if fast else ("counter", "rate", "gauge"):
                    for key, value in list(targets.items()):
                        if fast and key[0] not in fast_metrics:
                            continue
                        emit = plan.get(key)
                        if emit is None or emit.kind != kind:
                            continue
                        rkey = (dev.key, emit.raw, emit.raw_labels)
                        if rkey in emitted:
                            continue
                        emitted.add(rkey)
                        del targets[key]  # carried by this mapping: not by a later one
                        step = st.pending.pop(key, 0.0) if kind == "counter" else 0.0
                        raw = self._raw(st, emit, rkey, value, dt, step)
                        sample.add(dev.key, emit.raw, raw, emit.raw_labels)
        return sample

    def _step_events(self, phase: Phase) -> None:
        """The phase's counter steps, reported at the next poll that reads each GPU."""
        for st in self._states:
            for key, step in phase.events.get(f"{st.dev.vendor}:{st.dev.index}", {}).items():
                target = parse_operand(key)
                st.pending[target] = st.pending.get(target, 0.0) + step
                st.stepped.add(key)

    def current_phase(self) -> str:
        return self._phase(self.clock()).name

    def _phase(self, now: float) -> Phase:
        if self.held is not None:
            return self.held
        return self.scenario.phase_at((now - (self._start or now)) * self.speed)[0]

    # ------------------------------------------------------------------ internals
    def _raw(self, st: _SimState, emit: _Emit, rkey: tuple, value: float, dt: float,
             step: float = 0.0) -> float | None:
        if emit.kind == "gauge":
            return (value - emit.offset) / emit.scale
        per_second = value / emit.scale if emit.kind == "counter" else (value - emit.offset) / emit.scale
        total = st.counters.get(rkey, 0.0) + max(per_second, 0.0) * dt + step / emit.scale
        st.counters[rkey] = total
        return total

    def _targets(self, st: _SimState, phase: Phase) -> dict[tuple, float]:
        specs: dict[str, Value] = {}
        for key in st.stepped:  # a counter an event stepped: reported, still at rate 0
            specs[key] = 0.0
        specs.update(st.spec.values)
        specs.update(phase.values)
        specs.update(phase.devices.get(f"{st.dev.vendor}:{st.dev.index}", {}))
        resolved: dict[str, float] = {}
        refs: dict[str, tuple[str, float]] = {}
        for key, spec in specs.items():
            if isinstance(spec, str):
                m = _REF_RE.match(spec)
                if not m:
                    continue
                refs[key] = (m.group(1).strip(), float(m.group(2) or 1.0))
            elif isinstance(spec, Cycle):
                resolved[key] = spec.cycle[self._polls % len(spec.cycle)]
            elif isinstance(spec, list):
                lo, hi = (spec + spec)[:2]
                resolved[key] = self._rng.uniform(lo, hi)
            else:
                resolved[key] = float(spec)
        for key, (ref, factor) in refs.items():
            if ref in resolved:
                resolved[key] = resolved[ref] * factor
        out: dict[tuple, float] = {}
        mode = self.processes
        for key, v in resolved.items():
            name, matchers = parse_operand(key)
            if name in (CLIENT_CONTEXTS, _EVIDENCE_KEY[0]) and mode == "off":
                continue  # no client source: no contexts and no evidence mark (a partial one included)
            if any(name == n and set(m) <= set(matchers) for n, m in st.unsupported):
                continue
            if name == _PROC_UTIL and mode != "series":
                if mode == "off":
                    continue
                labels = dict(matchers)
                name, matchers = _CLIENT_UTIL, tuple(sorted(
                    {"client": labels.get("pid", ""), **{k: labels[k] for k in ("engine", "gpu_instance")
                                                          if k in labels}}.items()))
            out[(name, matchers)] = v
        if mode != "off" and st.evidence:
            out[_EVIDENCE_KEY] = 1.0
        return out

    def _has_evidence(self, st: _SimState) -> bool:
        if st.spec.evidence is not None:
            return st.spec.evidence
        key = f"{st.dev.vendor}:{st.dev.index}"
        specs = [st.spec.values] + [p.values for p in self.scenario.phases] + \
            [p.devices.get(key, {}) for p in self.scenario.phases]
        return any(k.startswith((_PROC_UTIL, CLIENT_CONTEXTS)) for spec in specs for k in spec)

    def _plan(self, mapping_name: str) -> dict[tuple, _Emit]:
        plan = self._plans.get(mapping_name)
        if plan is not None:
            return plan
        plan = {}
        cm = self.mappings.get(mapping_name)
        rules = sorted((r for rs in cm.rules.values() for r in rs), key=lambda r: r.order)
        for rule in rules:
            # an integral cannot be inverted into a raw value, nor a ratio of two raw fields into one
            if rule.scale == 0 or rule.integrate or rule.divide_by is not None:
                continue
            label_names = tuple(sorted(c for _, c in rule.label_map))
            key_labels = dict(rule.fixed)
            # a rule with label_map needs those labels in the target; record the shape
            kind = "counter" if rule.is_counter else ("rate" if rule.rate else "gauge")
            plan_key = (rule.metric, tuple(sorted(key_labels.items())), label_names)
            if plan_key in plan:
                continue  # the first (preferred) rule wins, as in the mapping
            plan[plan_key] = _Emit(rule.raw, tuple((r, c) for r, c in rule.label_map), kind,
                                   rule.scale, rule.offset)
        resolved = _PlanView(plan)
        self._plans[mapping_name] = resolved  # type: ignore[assignment]
        return resolved  # type: ignore[return-value]


class _PlanView(dict):
    """Looks up a target (metric, matchers) in a plan keyed by (metric, fixed, label_map names)."""

    def __init__(self, plan: dict[tuple, _Emit]):
        super().__init__()
        self._plan = plan
        self._memo: dict[tuple, _Emit | None] = {}

    def get(self, key: tuple, default: Any = None) -> _Emit | None:  # type: ignore[override]
        if key not in self._memo:
            self._memo[key] = self._find(key)
        found = self._memo[key]
        return default if found is None else found

    def _find(self, key: tuple) -> _Emit | None:
        metric, matchers = key
        target = dict(matchers)
        for (m, fixed, mapped), emit in self._plan.items():
            if m != metric:
                continue
            fixed_d = dict(fixed)
            if any(target.get(k) != v for k, v in fixed_d.items()):
                continue
            rest = set(target) - set(fixed_d)
            if not rest <= set(mapped):
                continue  # label_map labels are optional: a target may leave them out
            if mapped:
                raw_labels = tuple((raw, target[canon]) for raw, canon in emit.raw_labels
                                   if canon in target)
                return _Emit(emit.raw, raw_labels, emit.kind, emit.scale, emit.offset)
            return emit
        return None
