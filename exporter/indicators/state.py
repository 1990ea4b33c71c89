"""The memory state of one GPU (or MIG instance): one of ``STATES``.

A pure decision over what the GPU reports this poll.  ``decide`` evaluates ``ROWS`` top to
bottom, the first matching row wins; docs/detection.md prints ``ROWS`` as its decision table
(``decision_table``) and explains each row.  In short:

1. ``unknown`` without any load signal (``no_load_signal``; a MIG instance whose processes hold
   compute contexts but which reports no load signal of its own, as on pre-Hopper MIG without
   GPM / DCGM, is in use, busy or not, and not evaluable: ``no_instance_load_signal``); ``idle``
   below the idle bars.
2. Co-tenancy first (also while another profiler holds the profiling counters: the client count
   needs none of them; without co-tenancy such a GPU reads ``unknown`` /
   ``profiling_unavailable``), whatever the throttle reasons: two or more active clients are ``contended``
   with the memory-bound signature (bandwidth above 85 % and, where the GPU reports a
   compute-starvation signal, that signal below 50 %) or with bandwidth above
   ``shared_bandwidth_percent`` (time-sliced tenants lower the aggregate bandwidth and keep
   occupancy up, measured on an H200), otherwise ``shared``.  Co-tenancy is never ``healthy`` or
   ``throttled``.
3. ``throttled`` only with a throttle reason that explains a loss: a thermal / hardware
   slowdown, or a power reason with the compute clock cut by ``power_clock_drop_fraction``
   (``rootcause.throttle_explains``); a power cap at the board limit alone explains nothing.
4. No signature: ``healthy``.
5. The signature with a throughput drop against the GPU's own memory-bound reference:
   ``contended`` (``memory_bound`` when process data shows one client; without process data the
   drop counts for ``drop_confirm_seconds``, then ``unknown``: a neighbour and a job's own
   level change look the same).  The signature without a drop: ``memory_bound`` with process
   data, else ``unknown`` with a reason that says what is missing (never a confident answer
   without evidence).
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import StateConfig

STATES = ("idle", "healthy", "memory_bound", "contended", "shared", "throttled", "unknown")
STARVATION_BASES = ("occupancy", "sm_active")


@dataclass(frozen=True, slots=True)
class StateVerdict:
    state: str
    reason: str  # why: the evidence (contended), what is missing (unknown), ...
    signature: bool  # the memory-bound signature holds


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


def signature(bandwidth_util: float | None, basis: str | None, compute: float | None,
               bandwidth_percent: float, compute_percent: float) -> bool:
    if bandwidth_util is None or bandwidth_util <= bandwidth_percent:
        return False
    if basis in STARVATION_BASES and compute is not None:
        return compute < compute_percent
    return True


def decide(bandwidth_util: float | None, utilization: float | None, basis: str | None,
           compute: float | None, throttled: bool, clients: int | None, reference_warm: bool,
           throughput_drop: bool, drop_unconfirmed: bool, cfg: StateConfig,
           bandwidth_percent: float = 85.0, compute_percent: float = 50.0,
           profiling_unavailable: bool = False, contexts: bool = False, uncounted: str = "") -> StateVerdict:
    """The memory state of one GPU from what it reports this poll (positional: the engine
    decides every device at every indicator step).  The rows are ``ROWS``, in order.

    ``basis``/``compute``: the compute signal (``contention.compute_signal``); ``reference_warm``:
    the memory-bound reference has learned enough; ``throughput_drop``: the compute signal
    persistently below that reference; ``drop_unconfirmed``: that drop has lasted too long
    without per-process data.

    ``profiling_unavailable``: the profiling counters read zero or blank while the GPU is busy
    (gpu_profiling_available 0: another profiler holds them); no verdict rests on them.

    ``throttled``: a throttle reason that explains a loss (``rootcause.throttle_explains``: a
    hardware / thermal slowdown, or a power cap with the clock cut), not a power cap alone.
    ``clients``: busy clients (held over ``client_holdover_seconds``), None without evidence.

    ``contexts``: processes hold compute contexts on it (a MIG instance's process list) and no
    per-process activity says how many of them are busy (``clients`` None then).

    ``uncounted``: why a source that sees this GPU could not count its clients where that is
    known to hide tenants (``mps_clients_uncountable``: the MPS server is the busy process and
    NVML does not list its clients; ``mps_client_activity_unknown``: it lists clients whose
    activity cannot be read); the signature without a count reads ``unknown`` with it."""
    is_busy = _busy(utilization, bandwidth_util, basis, compute, cfg)
    if is_busy is None:
        return _verdict("unknown", "no_instance_load_signal" if contexts else "no_load_signal", False)
    if not is_busy:
        return _verdict("idle", "below_idle_bars", False)
    # profiling counters held by another tool: co-tenancy is still decided from what is known
    # (the client count, the bandwidth signal that remains, NVML's memory-busy percent)
    sig = signature(bandwidth_util, basis, compute, bandwidth_percent, compute_percent)
    if clients is not None and clients >= cfg.min_clients:
        # co-tenancy is evidence the clocks cannot explain: it wins over every throttle reason
        # (on an H200 a matmul next to a copy job showed sw_power_cap while the copy tenant
        # lost 62 % of its throughput), and it is never `healthy`
        if sig:
            return _verdict("contended", "clients" if not throughput_drop
                            else "clients_and_throughput_drop", True)
        if bandwidth_util is not None and bandwidth_util > cfg.shared_bandwidth_percent:
            # time-sliced tenants: the aggregate signature hides them (see shared_bandwidth_percent)
            return _verdict("contended", "clients_sharing_bandwidth", False)
        return _verdict("shared", "clients_sharing_compute", False)
    if profiling_unavailable:
        return _verdict("unknown", "profiling_unavailable", False)
    if bandwidth_util is None:
        if throttled:
            return _verdict("throttled", "throttle_reason_active", False)
        return _verdict("unknown", "no_bandwidth_signal", False)
    if throttled:
        # a loss the clocks explain (thermal, hardware slowdown, a power cap that cut the clock)
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
    if contexts:
        # a MIG instance whose processes hold compute contexts, no per-process activity: an idle
        # context (an inference server waiting) and a second busy job look the same
        return _verdict("unknown", "contexts_without_activity", True)
    if uncounted:
        return _verdict("unknown", uncounted, True)
    # the signature without process data: one job by design and two tenants look the same (a
    # reference learned without evidence may have learned the contended level): say so
    if basis not in STARVATION_BASES:
        return _verdict("unknown", "no_starvation_signal_no_process_data", True)
    return _verdict("unknown", "no_process_data" if reference_warm else "reference_warming", True)


# The decision table (docs/detection.md is checked against it): number, condition, state, reason.
ROWS: tuple[tuple[str, str, str, str], ...] = (
    ("1", "no load signal at all (no utilization, bandwidth or compute signal)", "unknown",
     "`no_load_signal`"),
    ("1a", "a MIG instance (and its GPU) with no load signal of its own while processes hold compute "
     "contexts on it (pre-Hopper MIG: no GPM, no DCGM): in use (an idle process holding a context "
     "counts too), not evaluable", "unknown",
     "`no_instance_load_signal`"),
    ("2", "all load signals below the idle bars", "idle", "`below_idle_bars`"),
    ("3", "busy, the signature and >= 2 active clients (`min_clients`, held over "
     "`client_holdover_seconds`), whatever the throttle reasons", "contended",
     "`clients` / `clients_and_throughput_drop`"),
    ("4", "busy, no signature, >= 2 active clients and bandwidth above `shared_bandwidth_percent`",
     "contended", "`clients_sharing_bandwidth`"),
    ("5", "busy, >= 2 active clients otherwise (time-sliced tenants), whatever the throttle reasons",
     "shared", "`clients_sharing_compute`"),
    ("5a", "busy while the profiling counters read zero or blank (`gpu_profiling_available` 0: another "
     "profiler holds them, or the profiling module is not loaded) and no co-tenancy decided by rows "
     "3-5 from what is still known (clients, the remaining bandwidth signal)", "unknown",
     "`profiling_unavailable`"),
    ("6", "busy, no bandwidth utilization reported", "throttled with an explaining throttle reason, "
     "else unknown", "`throttle_reason_active` / `no_bandwidth_signal`"),
    ("7", "busy and a throttle reason that explains a loss: thermal / hardware slowdown, or a power "
     "reason with the compute clock >= `power_clock_drop_fraction` below its maximum",
     "throttled", "`throttle_reason_active`"),
    ("8", "no signature", "healthy", "`no_memory_bound_signature`"),
    ("9", "signature and a throughput drop, process data showing <= 1 active client", "memory_bound",
     "`single_client` (a job change, not a neighbour)"),
    ("10", "signature and a throughput drop without process data, held `drop_confirm_seconds`",
     "unknown", "`throughput_drop_unconfirmed`"),
    ("11", "signature and a throughput drop otherwise", "contended", "`throughput_drop`"),
    ("12", "signature, process data with 0 or 1 active client", "memory_bound",
     "`single_client` / `no_active_client`"),
    ("12a", "signature on a MIG instance whose processes hold >= 2 compute contexts, no per-process "
     "activity (contexts alone prove no co-tenancy: an idle context looks like a busy job)", "unknown",
     "`contexts_without_activity`"),
    ("12b", "signature, an MPS server the only busy process and its clients not countable (NVML's MPS "
     "process list refused or not supported: one server stands for any number of clients), or two or "
     "more MPS clients listed and fewer than two of them known to be active (a client first seen or "
     "its CPU time unreadable, or a busy server none of whose clients ran: a listed client may be idle)", "unknown",
     "`mps_clients_uncountable` / `mps_client_activity_unknown`"),
    ("13", "signature, no process data, no starvation signal", "unknown",
     "`no_starvation_signal_no_process_data`"),
    ("14", "signature, no process data, reference warm (it may have learned a contended level)",
     "unknown", "`no_process_data`"),
    ("15", "signature, no process data, reference still warming", "unknown", "`reference_warming`"),
)


def decision_table() -> str:
    """``ROWS`` as the markdown table of docs/detection.md."""
    lines = ["| # | condition | state | reason |", "|---|---|---|---|"]
    lines += [f"| {n} | {cond} | {state} | {reason} |" for n, cond, state, reason in ROWS]
    return "\n".join(lines)


_VERDICTS: dict[tuple[str, str, bool], StateVerdict] = {}


def _verdict(state: str, reason: str, sig: bool) -> StateVerdict:
    """One shared (immutable) verdict per outcome: the outcomes are a fixed set."""
    v = _VERDICTS.get((state, reason, sig))
    if v is None:
        v = _VERDICTS[(state, reason, sig)] = StateVerdict(state, reason, sig)
    return v
