"""Co-tenancy that tells the truth on real workloads (issue 36): CUDA MPS clients, profiler
sessions, through the NVML source over the faithful fake (tests/fakes/pynvml_fake.py) and the
real daemon.  The sequential-jobs, hold-over and idle-MIG-context cases run through the daemon
in the detection suite (mappings/scenarios/detection.yaml, tests/test_detection_scenarios.py)
and through the engine in tests/test_indicators_engine.py; their promtool cases are in
deploy/prometheus/tests/cotenancy-truth.test.yml.

What NVML documents (nvml.h, nvidia-ml-py 13.615.71's pynvml.py) and what it does not:
nvmlDeviceGetMPSComputeRunningProcesses lists "processes with a Multi-Process Service (MPS)
compute context" (Volta and newer; per MIG device with its own handle, the parent's aggregate only
to a privileged caller).  Which pid nvmlDeviceGetProcessUtilization's samples name under MPS is
not in the header: the fake follows the issue's measurement (the server's pid carries the
clients' work; clients have no samples), which deploy/device-check's MPS case checks on a GPU.
"""

from __future__ import annotations

from exporter.sources.context import SourceContext
from exporter.sources.nvml import NvmlSource
from tests.fakes import pynvml_fake as pf
from tests.test_evidence_default import _serve, _value

UNCOUNTABLE = (("evidence", "nvml"), ("reason", "mps_clients_uncountable"))


def _poll(gpu: dict, tmp_path, **options):
    fake = pf.make_module([gpu])
    src = NvmlSource(SourceContext(procfs=tmp_path, options={"xid": False, **options}), module=fake)
    src.open()
    try:
        return {(r.field, r.labels): r.value for r in src.poll().readings}, fake
    finally:
        src.close()


def test_mps_clients_are_counted_in_place_of_their_server(tmp_path):
    r, fake = _poll(pf.h100_mps(0), tmp_path)
    clients = {dict(lab)["client"]: v for (f, lab), v in r.items() if f == "client.sm_util"}
    assert clients == {"7101": 97.0, "7102": 97.0}  # the server's utilization, once per client
    assert r[("client.evidence", (("evidence", "nvml"), ("reason", "")))] == 1.0
    assert fake.fake_calls["nvmlDeviceGetMPSComputeRunningProcesses"] == 1


def test_mps_series_mode_exports_the_clients_and_no_utilization_for_the_server(tmp_path):
    r, _ = _poll(pf.h100_mps(0), tmp_path, processes="series")
    sm = {dict(lab)["pid"]: v for (f, lab), v in r.items() if f == "process.sm_util"}
    mem = {dict(lab)["pid"]: v for (f, lab), v in r.items() if f == "process.memory_used"}
    assert sm == {"7101": 97.0, "7102": 97.0}
    assert set(mem) == {"7101", "7102", str(pf.MPS_SERVER_PID)}


def test_mps_clients_that_cannot_be_listed_leave_the_count_partial(tmp_path):
    r, _ = _poll(pf.h100_mps_uncountable(0), tmp_path)
    assert r[("client.evidence", UNCOUNTABLE)] == 0.0
    assert r[("client.sm_util", (("client", str(pf.MPS_SERVER_PID)),))] == 97.0


def test_no_mps_no_name_is_read(tmp_path):
    r, fake = _poll(pf.h100(0), tmp_path)
    assert fake.fake_calls.get("nvmlSystemGetProcessName", 0) == 0
    assert r[("client.evidence", (("evidence", "nvml"), ("reason", "")))] == 1.0


# ------------------------------------------------------------------ the real daemon
def _state(s, **labels):
    return [dict(lab) for (n, lab), v in s.items() if n == "gpu_memory_state_info" and v == 1.0
            and dict(lab).items() >= labels.items() and "gpu_instance" not in dict(lab)]


def test_two_saturating_mps_clients_read_contended(tmp_path):
    """Before: the MPS server was the one busy pid: memory_bound / single_client, no seconds."""
    def until(s):
        return bool(_state(s, state="contended")) and sum(_value(s, "gpu_memory_contention_seconds_total")) > 0

    s = _serve(tmp_path, "h100_mps", until)
    assert _value(s, "gpu_active_clients") == [2.0]
    assert _state(s)[0]["reason"] == "clients"


def test_one_mps_client_reads_memory_bound(tmp_path):
    s = _serve(tmp_path, "h100_mps_one", lambda s: bool(_state(s, state="memory_bound")))
    assert _value(s, "gpu_active_clients") == [1.0]
    assert _state(s)[0]["reason"] == "single_client"


def test_uncountable_mps_clients_read_unknown_never_memory_bound(tmp_path):
    """The MPS list refused: the busy server may stand for any number of tenants."""
    s = _serve(tmp_path, "h100_mps_uncountable",
               lambda s: bool(_state(s, state="unknown", reason="mps_clients_uncountable")))
    assert not _value(s, "gpu_active_clients")
    assert _value(s, "gpu_contention_evidence_info", evidence="none", reason="mps_clients_uncountable") == [1.0]


def test_a_profiler_session_keeps_the_co_tenancy_it_knows(tmp_path):
    """Another profiler holds the GPM counters (every metric 0 at 99 % utilization) on a GPU with
    two busy processes (93 %, 5 %): before, unknown / profiling_unavailable for the session and
    the seconds counter stopped.  Now shared (NVML's memory-busy 11 % says no bandwidth fight)."""
    def until(s):  # once the session is seen (the first polls have no GPM sample pair yet)
        return _value(s, "gpu_profiling_available") == [0.0] and bool(_state(s))

    s = _serve(tmp_path, "h100_gpm_held", until)
    assert _state(s)[0]["state"] == "shared", _state(s)
    assert _value(s, "gpu_active_clients") == [2.0]
    assert _state(s)[0]["reason"] == "clients_sharing_compute"
    assert _value(s, "gpu_profiling_available") == [0.0]
