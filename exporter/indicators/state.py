"""The memory state of one GPU: one of idle, healthy, memory_bound, contended, throttled, unknown.

A pure decision over what the GPU reports this poll (see docs/detection.md for the table):

1. ``idle``: every load signal the GPU reports (compute utilization, bandwidth utilization,
   the compute signal) is below its idle bar.
2. ``unknown``: busy, but without a bandwidth signal, or with the memory-bound signature and no
   evidence source at all (no per-process data and no warm reference of its own).  The reason
   is exported; a GPU that cannot be evaluated is never reported healthy.
3. The memory-bound signature: bandwidth utilization above the classic 85 %, and, where the GPU
   reports a compute-starvation signal (occupancy or SM active), that signal below the classic
   50 %.  Without a starvation signal (AMD, Intel, NVIDIA without GPM/DCGM) bandwidth alone is
   the signature, and only evidence decides.
4. Two or more active clients (with the signature, or with bandwidth above ``shared_bandwidth_percent`` (70 %)) ->
   ``contended``, whatever the throttle reasons: time-sliced tenants lower the aggregate bandwidth
   and keep occupancy up (measured on an H200, docs/detection.md).
5. ``throttled``: a thermal or power throttle reason is active while the GPU is busy.
6. Signature + evidence of interference -> ``contended``: two or more active clients on the GPU
   (per-process utilization), or the compute signal persistently below the GPU's own memory-bound
   reference (a throughput drop; unconfirmed by per-process data it counts only for
   ``drop_confirm_seconds``, then the state is ``unknown``: a neighbour and a new job with a
   lower compute signal look the same).  Signature + evidence sources that show no interference (one
   active client, or a warm reference that holds) -> ``memory_bound``.
7. Anything else busy -> ``healthy``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import StateConfig

STATES = ("idle", "healthy", "memory_bound", "contended", "throttled", "unknown")
STARVATION_BASES = ("occupancy", "sm_active")


@dataclass(frozen=True, slots=True)
class StateInputs:
    bandwidth_util: float | None = None
    utilization: float | None = None
    basis: str | None = None  # occupancy | sm_active | utilization
    compute: float | None = None  # value of the compute signal named by basis
    throttled: bool = False  # a thermal/power throttle reason is active
    clients: int | None = None  # active clients (None: no per-process utilization data)
    reference_warm: bool = False  # the memory-bound reference has learned enough
    throughput_drop: bool = False  # compute signal persistently below that reference
    drop_unconfirmed: bool = False  # that drop has lasted too long without per-process data


@dataclass(frozen=True, slots=True)
class StateVerdict:
    state: str
    reason: str  # why: the evidence (contended), what is missing (unknown), ...
    signature: bool  # the memory-bound signature holds


def busy(inp: StateInputs, cfg: StateConfig) -> bool | None:
    """Whether any load signal is above its idle bar; None when the GPU reports none."""
    return _busy(inp.utilization, inp.bandwidth_util, inp.basis, inp.compute, cfg)


def _busy(utilization: float | None, bandwidth_util: float | None, basis: str | None,
          compute: float | None, cfg: StateConfig) -> bool | None:
    seen = False
    for value, bar in ((utilization, cfg.idle_utilization_percent),
                       (bandwidth_util, cfg.idle_bandwidth_percent),
                       (compute if basis in STARVATION_BASES else None, cfg.idle_utilization_percent)):
        if value is None:
            continue
        seen = True
        if value >= bar:
            return True
    return False if seen else None


def signature(inp: StateInputs, bandwidth_percent: float, compute_percent: float) -> bool:
    """Bandwidth above the bar and, where a starvation signal exists, compute below its bar."""
    return _signature(inp.bandwidth_util, inp.basis, inp.compute, bandwidth_percent, compute_percent)


def _signature(bandwidth_util: float | None, basis: str | None, compute: float | None,
               bandwidth_percent: float, compute_percent: float) -> bool:
    if bandwidth_util is None or bandwidth_util <= bandwidth_percent:
        return False
    if basis in STARVATION_BASES and compute is not None:
        return compute < compute_percent
    return True


def classify_state(inp: StateInputs, cfg: StateConfig, bandwidth_percent: float = 85.0,
                   compute_percent: float = 50.0) -> StateVerdict:
    return decide(inp.bandwidth_util, inp.utilization, inp.basis, inp.compute, inp.throttled, inp.clients,
                  inp.reference_warm, inp.throughput_drop, inp.drop_unconfirmed, cfg, bandwidth_percent,
                  compute_percent)


def decide(bandwidth_util: float | None, utilization: float | None, basis: str | None,
           compute: float | None, throttled: bool, clients: int | None, reference_warm: bool,
           throughput_drop: bool, drop_unconfirmed: bool, cfg: StateConfig,
           bandwidth_percent: float = 85.0, compute_percent: float = 50.0) -> StateVerdict:
    """``classify_state`` of the fields of a ``StateInputs``, without building one (the engine
    decides every device at every fast poll)."""
    is_busy = _busy(utilization, bandwidth_util, basis, compute, cfg)
    if is_busy is None:
        return _verdict("unknown", "no_load_signal", False)
    if not is_busy:
        return _verdict("idle", "below_idle_bars", False)
    if bandwidth_util is None:
        if throttled:
            return _verdict("throttled", "throttle_reason_active", False)
        return _verdict("unknown", "no_bandwidth_signal", False)
    sig = _signature(bandwidth_util, basis, compute, bandwidth_percent, compute_percent)
    if clients is not None and clients >= cfg.min_clients:
        # co-tenancy is evidence the clocks cannot explain: it wins over a throttle reason (GPUs
        # under load sit at their power cap for hours; on an H200 a matmul next to a copy job
        # showed sw_power_cap while each tenant lost throughput to the other)
        if sig:
            return _verdict("contended", "clients" if not throughput_drop
                            else "clients_and_throughput_drop", True)
        if bandwidth_util > cfg.shared_bandwidth_percent:
            # time-sliced tenants: the aggregate signature hides them (see shared_bandwidth_percent)
            return _verdict("contended", "clients_sharing_bandwidth", False)
    if throttled:
        # a throughput drop under a throttle reason is explained by the clocks, not a neighbour
        return _verdict("throttled", "throttle_reason_active", False)
    if not sig:
        return _verdict("healthy", "no_memory_bound_signature", False)
    if throughput_drop:
        # one active client cannot be crowded out by a co-tenant: trust the process list
        if clients is not None and clients <= 1 and cfg.single_client_vetoes_drop:
            return _verdict("memory_bound", "single_client", True)
        if clients is None and drop_unconfirmed:
            # a neighbour or a new job with a lower compute signal: cannot tell any more
            return _verdict("unknown", "throughput_drop_unconfirmed", True)
        return _verdict("contended", "throughput_drop", True)
    if clients is not None:
        return _verdict("memory_bound", "single_client" if clients == 1 else "no_active_client", True)
    if reference_warm:
        return _verdict("memory_bound", "reference_holds", True)
    starving = basis in STARVATION_BASES
    return _verdict("unknown", "reference_warming" if starving else "no_starvation_signal_no_process_data", True)


_VERDICTS: dict[tuple[str, str, bool], StateVerdict] = {}


def _verdict(state: str, reason: str, sig: bool) -> StateVerdict:
    """One shared (immutable) verdict per outcome: the outcomes are a fixed set."""
    v = _VERDICTS.get((state, reason, sig))
    if v is None:
        v = _VERDICTS[(state, reason, sig)] = StateVerdict(state, reason, sig)
    return v
