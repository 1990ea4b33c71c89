"""MIG GPUs: one memory state per GPU instance, and the GPU's own state derived from them.

NVML reports no device-level utilization in MIG mode, so a MIG GPU's device-level signals are
empty (``no_load_signal``) while its instances are busy.  Each instance is decided like a GPU of
its own (``state.decide`` over its GPM / DCGM signals and its own busy clients: processes of two
instances are not co-tenants), exported with ``gpu_instance`` and ``mig_profile``; the GPU reads
the most severe of its instances' states.  Compute contexts are no activity evidence: an
instance with two or more contexts and no per-process utilization has no client count (one
busy job beside an idle context must not read ``contended``): with the memory-bound signature
it reads ``unknown`` / ``contexts_without_activity``; one context is one client at most.  An
instance without load signals of its own (pre-Hopper
MIG: no GPM, no DCGM) on which processes hold compute contexts is in use (whether they compute
or idle cannot be told) and not evaluable (``no_instance_load_signal``), so the GPU is never
``no_load_signal`` while such an instance is in use.
"""

from __future__ import annotations

from typing import Any

from .clients import trusted
from .config import IndicatorConfig
from .contention import BANDWIDTH_UTIL, compute_signal
from .device_state import _Tick
from .series import LabelledSignals
from .signals import UTILIZATION
from .state import STATES, StateVerdict, decide

# most severe first: the GPU's state is the first of these any instance is in
SEVERITY = ("contended", "shared", "throttled", "unknown", "memory_bound", "healthy", "idle")

# (gpu instance, verdict, basis, bandwidth, clients the state used)
Found = tuple[str, StateVerdict, str | None, float | None, int | None]


def derive_gpu_state(device: StateVerdict, instances: list[Found]) -> tuple[StateVerdict, str | None, float | None]:
    """The GPU's verdict: its own where it has load signals of its own, else the most severe
    instance's (with that instance's basis and bandwidth for the contention counters)."""
    if not instances:
        return device, None, None
    worst = min(instances, key=lambda f: SEVERITY.index(f[1].state))
    if device.reason != "no_load_signal" and SEVERITY.index(device.state) <= SEVERITY.index(worst[1].state):
        return device, None, None
    return worst[1], worst[2], worst[3]


def instance_outputs(labels: Any, gi: str, profile: str, verdict: StateVerdict, clients: int | None,
                     out: dict[tuple[str, tuple], float]) -> None:
    """The instance's gpu_memory_state, gpu_memory_state_info and gpu_active_clients (into the
    device's output frame)."""
    base = (("gpu_instance", gi), ("mig_profile", profile))
    for name in STATES:
        out[("gpu_memory_state", labels.many(*base, ("state", name)))] = 1.0 if name == verdict.state else 0.0
    out[("gpu_memory_state_info", labels.many(*base, ("reason", verdict.reason), ("state", verdict.state)))] = 1.0
    if clients is not None:
        out[("gpu_active_clients", labels.many(*base))] = float(clients)


def instance_verdicts(cfg: IndicatorConfig, labels: Any, labelled: LabelledSignals, held: dict[str, int],
                      evidence: str, throttled: bool, out: dict[tuple[str, tuple], float]) -> list[Found]:
    """One state per MIG GPU instance (exported with gpu_instance, mig_profile): the instances
    with load signals and those whose processes hold compute contexts."""
    found = []
    in_use = {gi for gi, n in labelled.contexts.items() if n > 0}
    for gi in sorted(labelled.instances.keys() | in_use):
        values = labelled.instances.get(gi, {})
        signal = compute_signal(values, cfg.contention.basis_order)
        basis, compute = signal if signal is not None else (None, None)
        bw = values.get(BANDWIDTH_UTIL)
        util = values.get(UTILIZATION)
        count = held.get(gi, 0)
        clients: int | None
        if count < 0:  # compute contexts of an instance without per-process utilization
            # one context: at most one tenant, a count; two or more: whether more than one of
            # them is busy cannot be told (an inference server holding a context idles like a
            # busy job's neighbour), so no count: never co-tenancy on contexts alone
            clients = trusted(evidence, -count, cfg.state) if -count <= 1 else None
        else:
            clients = trusted(evidence, count, cfg.state)
        verdict = decide(bw, util, basis, compute, throttled, clients, True, False, False, cfg.state,
                         cfg.contention.bandwidth_utilization_percent, cfg.contention.compute_percent,
                         contexts=gi in in_use)
        instance_outputs(labels, gi, labelled.profiles.get(gi, ""), verdict, clients, out)
        found.append((gi, verdict, basis, bw, clients))
    return found


def mig_state(cfg: IndicatorConfig, labels: Any, t: _Tick, device: StateVerdict) -> tuple[StateVerdict, bool]:
    """A MIG GPU's verdict, its instances' states written to ``t.out``; and whether the state
    could use a client count (for gpu_contention_evidence_info).  The GPU's own client count
    goes: processes of two instances are no co-tenants."""
    found = instance_verdicts(cfg, labels, t.labelled, t.held, t.evidence, t.throttled, t.out)
    verdict, basis, bw = derive_gpu_state(device, found)
    if t.basis is None:
        t.basis, t.bw_util = basis, bw
    t.clients = None
    return verdict, t.evidence == "complete" or any(f[4] is not None for f in found)
