"""The memory-state decision table (docs/detection.md), row by row, as a pure function."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from exporter.indicators.config import StateConfig
from exporter.indicators.state import StateVerdict, decide

CFG = StateConfig()


@dataclass(frozen=True, slots=True)
class StateInputs:
    """What the engine hands ``decide`` for one GPU, by name (this file's rows read better so)."""

    bandwidth_util: float | None = None
    utilization: float | None = None
    basis: str | None = None  # occupancy | sm_active | utilization
    compute: float | None = None  # value of the compute signal named by basis
    throttled: bool = False
    clients: int | None = None
    reference_warm: bool = False
    throughput_drop: bool = False
    drop_unconfirmed: bool = False
    profiling_unavailable: bool = False
    contexts: bool = False  # processes hold compute contexts on it (a MIG instance)
    uncounted: str = ""  # why a source could not count clients that may be there (MPS)


def classify_state(inp: StateInputs, cfg: StateConfig, bandwidth_percent: float = 85.0,
                   compute_percent: float = 50.0) -> StateVerdict:
    """``decide``, called as the engine calls it."""
    return decide(inp.bandwidth_util, inp.utilization, inp.basis, inp.compute, inp.throttled, inp.clients,
                  inp.reference_warm, inp.throughput_drop, inp.drop_unconfirmed, cfg, bandwidth_percent,
                  compute_percent, inp.profiling_unavailable, inp.contexts, inp.uncounted)


def busy(inp: StateInputs, cfg: StateConfig) -> bool | None:
    """Whether ``decide`` found a load signal above its idle bar; None when there is none."""
    reason = classify_state(inp, cfg).reason
    return None if reason == "no_load_signal" else reason != "below_idle_bars"


def occ(bw, compute, **kw) -> StateInputs:
    return StateInputs(bandwidth_util=bw, utilization=kw.pop("util", 99.0), basis="occupancy",
                       compute=compute, **kw)


def util_only(bw, **kw) -> StateInputs:
    return StateInputs(bandwidth_util=bw, utilization=kw.pop("util", 99.0), basis="utilization",
                       compute=kw.pop("util_c", 99.0), **kw)


ROWS = [
    # (case, inputs, state, reason)
    ("nothing reported", StateInputs(), "unknown", "no_load_signal"),
    # pre-Hopper MIG (no GPM, no DCGM): an instance reports no load, but processes hold contexts
    ("MIG instance in use without load signals", StateInputs(contexts=True), "unknown",
     "no_instance_load_signal"),
    ("MIG instance in use, signals idle", occ(1.0, 0.5, util=1.0, contexts=True), "idle", "below_idle_bars"),
    ("idle", occ(1.0, 0.5, util=1.0), "idle", "below_idle_bars"),
    ("busy, profiling counters all zero (another profiler holds them)",
     StateInputs(utilization=99.0, basis="utilization", compute=99.0, profiling_unavailable=True),
     "unknown", "profiling_unavailable"),
    # issue 36: a profiler session holds the counters; co-tenancy is decided from what is known
    ("profiler session, two clients, no bandwidth signal left",
     StateInputs(utilization=99.0, basis="utilization", compute=99.0, clients=2, profiling_unavailable=True),
     "shared", "clients_sharing_compute"),
    ("profiler session, two clients, NVML memory-busy 92 %",
     StateInputs(bandwidth_util=92.0, utilization=99.0, basis="utilization", compute=99.0, clients=2,
                 profiling_unavailable=True), "contended", "clients"),
    ("profiler session, one client", StateInputs(utilization=99.0, basis="utilization", compute=99.0, clients=1,
                                                 profiling_unavailable=True), "unknown", "profiling_unavailable"),
    # issue 36: contexts alone (MIG, no per-process utilization) prove no co-tenancy
    ("MIG instance, signature, two contexts of unknown activity", occ(92.0, 40.0, contexts=True), "unknown",
     "contexts_without_activity"),
    ("MIG instance, no signature, two contexts of unknown activity", occ(60.0, 60.0, contexts=True), "healthy",
     "no_memory_bound_signature"),
    # issue 36: an MPS server stands for clients NVML would not list
    ("MPS server busy, clients not countable", occ(92.0, 40.0, reference_warm=True,
                                                   uncounted="mps_clients_uncountable"),
     "unknown", "mps_clients_uncountable"),
    ("MPS clients listed, their activity unreadable", occ(92.0, 40.0, reference_warm=True,
                                                          uncounted="mps_client_activity_unknown"),
     "unknown", "mps_client_activity_unknown"),
    ("idle, profiling counters zero", StateInputs(utilization=1.0, profiling_unavailable=True), "idle",
     "below_idle_bars"),
    ("thermal throttle while busy", occ(50.0, 55.0, throttled=True), "throttled", "throttle_reason_active"),
    ("power cap while two tenants fight over bandwidth", occ(92.0, 30.0, clients=2, throttled=True),
     "contended", "clients"),
    ("power cap, one tenant, signature", occ(92.0, 30.0, clients=1, throttled=True), "throttled",
     "throttle_reason_active"),
    ("power cap, throughput drop only", occ(92.0, 20.0, throughput_drop=True, throttled=True), "throttled",
     "throttle_reason_active"),
    ("throttle reason on an idle GPU", occ(1.0, 0.5, util=1.0, throttled=True), "idle", "below_idle_bars"),
    ("busy, no bandwidth signal", StateInputs(utilization=95.0, basis="utilization", compute=95.0),
     "unknown", "no_bandwidth_signal"),
    ("compute-bound training", occ(60.0, 60.0, clients=1), "healthy", "no_memory_bound_signature"),
    ("bandwidth high, compute fed (dense GEMM)", occ(92.0, 70.0, clients=1), "healthy",
     "no_memory_bound_signature"),
    ("low-occupancy GEMM, modest bandwidth", occ(40.0, 20.0), "healthy", "no_memory_bound_signature"),
    ("single memory-bound tenant", occ(92.0, 40.0, clients=1), "memory_bound", "single_client"),
    ("memory-bound, no active client listed", occ(92.0, 40.0, clients=0), "memory_bound", "no_active_client"),
    # a reference learned without process data may have learned a contended level: no verdict
    ("memory-bound, warm reference, no process data", occ(92.0, 40.0, reference_warm=True), "unknown",
     "no_process_data"),
    ("memory-bound, reference still warming", occ(92.0, 40.0), "unknown", "reference_warming"),
    ("two tenants saturating (occupancy)", occ(95.0, 30.0, clients=2), "contended", "clients"),
    ("throughput drop, no process data", occ(95.0, 25.0, reference_warm=True, throughput_drop=True),
     "contended", "throughput_drop"),
    ("throughput drop held too long, no process data",
     occ(95.0, 25.0, reference_warm=True, throughput_drop=True, drop_unconfirmed=True),
     "unknown", "throughput_drop_unconfirmed"),
    ("long throughput drop confirmed by two clients",
     occ(95.0, 25.0, clients=2, throughput_drop=True, drop_unconfirmed=True),
     "contended", "clients_and_throughput_drop"),
    ("throughput drop and two clients", occ(95.0, 25.0, clients=3, throughput_drop=True), "contended",
     "clients_and_throughput_drop"),
    ("throughput drop but one client (job change)", occ(95.0, 25.0, clients=1, throughput_drop=True),
     "memory_bound", "single_client"),
    ("AMD/Intel: two tenants at 95 % bandwidth", util_only(95.0, clients=2), "contended", "clients"),
    ("AMD/Intel: one tenant at 95 % bandwidth", util_only(95.0, clients=1), "memory_bound", "single_client"),
    ("AMD/Intel: 95 % bandwidth, no process data", util_only(95.0), "unknown",
     "no_starvation_signal_no_process_data"),
    ("AMD/Intel: co-tenants below the bandwidth bar", util_only(60.0, clients=2), "shared",
     "clients_sharing_compute"),
    ("two tenants, no signature, a throttle reason that explains a loss", occ(43.7, 38.9, clients=2, throttled=True),
     "shared", "clients_sharing_compute"),
    ("two tenants, bandwidth-heavy, explaining throttle reason", occ(77.6, 70.6, clients=2, throttled=True),
     "contended", "clients_sharing_bandwidth"),
]


@pytest.mark.parametrize(("case", "inp", "state", "reason"), ROWS, ids=[r[0] for r in ROWS])
def test_decision_table(case, inp, state, reason):
    verdict = classify_state(inp, CFG)
    assert (verdict.state, verdict.reason) == (state, reason), case


def test_seed_thresholds_are_the_signature_and_configurable():
    seed_only = StateConfig(shared_bandwidth_percent=100.0)
    assert classify_state(occ(85.0, 40.0, clients=2), seed_only).state == "shared"  # > 85, not >=
    assert classify_state(occ(85.1, 49.9, clients=2), seed_only).state == "contended"
    assert classify_state(occ(85.1, 50.0, clients=2), seed_only).state == "shared"
    assert classify_state(occ(80.0, 40.0, clients=2), seed_only, bandwidth_percent=75.0).state == "contended"


# Medians measured on a real H200 (deploy/device-check/colocation_probe.py, driver 580.159.04):
# GPM DRAM bandwidth, GPM occupancy, active clients.
H200 = [
    ("one copy job alone", occ(87.0, 79.3, clients=1), "healthy"),
    ("two copy jobs, time-sliced", occ(77.6, 70.6, clients=2), "contended"),
    ("bf16 matmul alone", occ(17.2, 13.7, clients=1), "healthy"),
    ("matmul plus copy job", occ(43.7, 38.9, clients=2), "shared"),
]


@pytest.mark.parametrize(("case", "inp", "state"), H200, ids=[c[0] for c in H200])
def test_states_on_what_an_h200_reported(case, inp, state):
    assert classify_state(inp, CFG).state == state, case


def test_shared_bandwidth_bar_needs_clients_and_is_configurable():
    assert classify_state(occ(77.6, 70.6, clients=2), CFG).reason == "clients_sharing_bandwidth"
    assert classify_state(occ(77.6, 70.6, clients=1), CFG).state == "healthy"
    assert classify_state(occ(70.0, 70.6, clients=2), CFG).state == "shared"  # > 70, not >=
    assert classify_state(occ(77.6, 70.6, clients=2), StateConfig(shared_bandwidth_percent=80.0)).state == "shared"


def test_min_clients_and_veto_are_configurable():
    three = StateConfig(min_clients=3)
    assert classify_state(occ(95.0, 30.0, clients=2), three).state == "memory_bound"
    no_veto = StateConfig(single_client_vetoes_drop=False)
    assert classify_state(occ(95.0, 25.0, clients=1, throughput_drop=True), no_veto).state == "contended"


def test_busy_uses_whatever_signals_exist():
    assert busy(StateInputs(), CFG) is None
    assert busy(StateInputs(bandwidth_util=30.0), CFG) is True
    assert busy(StateInputs(utilization=2.0, bandwidth_util=1.0), CFG) is False
    # utilization alone low but occupancy high: busy
    assert busy(StateInputs(utilization=1.0, basis="occupancy", compute=20.0), CFG) is True


def test_co_tenancy_is_never_throttled_or_healthy():
    for bw in (10.0, 43.7, 69.0, 77.6, 95.0):
        for compute in (20.0, 60.0):
            for throttled in (False, True):
                verdict = classify_state(occ(bw, compute, clients=2, throttled=throttled), CFG)
                assert verdict.state in ("contended", "shared"), (bw, compute, throttled, verdict)


def test_power_cap_alone_explains_nothing_a_clock_cut_or_slowdown_does():
    from exporter.indicators.config import RootCauseConfig
    from exporter.indicators.rootcause import throttle_explains

    rc = RootCauseConfig()
    cap = {"sw_power_cap": True, "hw_slowdown": False}
    assert not throttle_explains(cap, None, rc)  # no clock: cannot size the loss
    assert not throttle_explains(cap, 0.89, rc)  # at the board limit, a few percent below top clock
    assert throttle_explains(cap, 0.79, rc)  # the clock cut by more than 20 %
    assert throttle_explains({"hw_slowdown": True}, None, rc)
    assert throttle_explains({"hw_thermal": True}, 0.99, rc)
    assert not throttle_explains({"sw_power_cap": False}, 0.5, rc)
    assert not throttle_explains({}, 0.5, rc)


def test_decision_table_in_the_docs_is_the_code():
    from pathlib import Path

    from exporter.indicators.state import decision_table

    doc = (Path(__file__).resolve().parent.parent / "docs" / "detection.md").read_text()
    assert decision_table() in doc, "docs/detection.md's decision table differs from state.ROWS"


def test_every_row_of_the_table_is_a_reason_decide_returns():
    """Each (state, reason) named in ROWS is produced by decide() for some input of this file."""
    import re

    from exporter.indicators.state import ROWS as TABLE
    from exporter.indicators.state import STATES

    verdicts = [classify_state(inp, CFG) for _, inp, _, _ in ROWS] + [classify_state(inp, CFG) for _, inp, _ in H200]
    reasons = {v.reason for v in verdicts}
    states = {v.state for v in verdicts}
    for number, _, state, reason in TABLE:
        for r in re.findall(r"`([a-z_]+)`", reason):
            assert r in reasons, (number, r, "not produced by any case")
        named = [w for w in re.findall(r"[a-z_]+", state) if w in STATES]
        assert named and set(named) <= states, (number, state)


def test_vendor_table_names_only_reasons_the_code_gives_and_sources_that_count():
    """docs/detection.md's per-vendor table: every reason it names is a row of the decision table,
    and every evidence source it names maps a client count (the internal gpu_client_* families)."""
    import re
    from pathlib import Path

    import yaml

    from exporter.indicators.state import ROWS as TABLE

    root = Path(__file__).resolve().parent.parent
    doc = (root / "docs" / "detection.md").read_text()
    start = doc.index("| hardware / setup |")
    table = doc[start:doc.index("\n\n", start)]
    reasons = {r for *_, reason in TABLE for r in re.findall(r"`([a-z_]+)`", reason)}
    named = set(re.findall(r"`([a-z_]+)`", table)) - {"processes", "unknown", "gpu_contention_evidence_info"}
    assert named and named <= reasons, named - reasons
    sources = {"NVML": "nvml", "DRM fdinfo": "drm_fdinfo", "amdsmi": "amdsmi"}
    for text, mapping in sources.items():
        assert text in table, text
        fields = yaml.safe_load((root / "mappings" / f"{mapping}.yaml").read_text())["fields"]
        assert any(f["metric"] == "gpu_client_evidence" for f in fields), mapping
        assert any(f["metric"] in ("gpu_client_utilization_percent", "gpu_client_contexts") for f in fields), mapping
    assert "MIG" in table
