"""MIG GPUs: one memory state per GPU instance, and the GPU's own state derived from them.

NVML reports no device-level utilization in MIG mode, so a MIG GPU's device-level signals are
empty (``no_load_signal``) while its instances are busy.  Each instance is decided like a GPU of
its own (``state.decide`` over its GPM / DCGM signals and its own busy clients: processes of two
instances are not co-tenants), exported with ``gpu_instance`` and ``mig_profile``; the GPU reads
the most severe of its instances' states.
"""

from __future__ import annotations

from typing import Any

from .state import STATES, StateVerdict

# most severe first: the GPU's state is the first of these any instance is in
SEVERITY = ("contended", "shared", "throttled", "unknown", "memory_bound", "healthy", "idle")

Found = tuple[str, StateVerdict, str | None, float | None]  # (gpu instance, verdict, basis, bandwidth)


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
                     out: list[tuple[str, dict[str, str], float]]) -> None:
    """The instance's gpu_memory_state, gpu_memory_state_info and gpu_active_clients."""
    base = (("gpu_instance", gi), ("mig_profile", profile))
    for name in STATES:
        out.append(("gpu_memory_state", labels.many(*base, ("state", name)), 1.0 if name == verdict.state else 0.0))
    out.append(("gpu_memory_state_info", labels.many(*base, ("reason", verdict.reason), ("state", verdict.state)),
                1.0))
    if clients is not None:
        out.append(("gpu_active_clients", labels.many(*base), float(clients)))
