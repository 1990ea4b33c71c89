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
not in the header; an H200 (driver 580.159.04, deploy/device-check/nvml_mps_check.py) named the
server alone there, the server and the clients in the compute list, and every client in the MPS
list, a paused one too: a client's activity is read from its CPU time (``<procfs>/<pid>/stat``).
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager

import pytest

from exporter.sources.context import SourceContext
from exporter.sources.nvml import NvmlSource
from tests.fakes import pynvml_fake as pf
from tests.fdinfo_trees import stat_text, write_stat
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


def _procfs(tmp_path, host: bool = True):
    """A procfs with the two MPS clients of ``pf.h100_mps`` (7101, 7102); pid 2 is kthreadd in
    the host's pid namespace (NVML's pids are the host's)."""
    proc = tmp_path / "proc"
    for pid in (2, 7101, 7102):
        (proc / str(pid)).mkdir(parents=True)
    if host:
        (proc / "2" / "comm").write_text("kthreadd\n")
    for pid in (7101, 7102):
        write_stat(proc, pid, utime=40)
    return proc


@contextmanager
def _source(gpu: dict, procfs, clock=None, **options):
    fake = pf.make_module([gpu])
    src = NvmlSource(SourceContext(procfs=procfs, options={"xid": False, **options}), module=fake, clock=clock)
    src.open()
    try:
        yield src, fake
    finally:
        src.close()


def _read(src, fake) -> dict:
    fake.fake_advance(1.0)  # a new utilization sample of the server
    return {(r.field, r.labels): r.value for r in src.poll().readings}


def _clients(r: dict, field: str = "client.sm_util", label: str = "client") -> dict[str, float]:
    return {dict(lab)[label]: v for (f, lab), v in r.items() if f == field}


COMPLETE = ("client.evidence", (("evidence", "nvml"), ("reason", "")))
NO_ACTIVITY = ("client.evidence", (("evidence", "nvml"), ("reason", "mps_client_activity_unknown")))


def test_active_mps_clients_are_counted_in_place_of_their_server(tmp_path):
    proc, now = _procfs(tmp_path), [0.0]
    with _source(pf.h100_mps(0), proc, clock=lambda: now[0]) as (src, fake):
        first = _read(src, fake)  # no CPU time of theirs to compare with yet
        assert _clients(first) == {} and first[NO_ACTIVITY] == 0.0
        now[0] = 1.0
        for pid in (7101, 7102):
            write_stat(proc, pid, utime=45)
        r = _read(src, fake)
    assert _clients(r) == {"7101": 97.0, "7102": 97.0}  # the server's utilization, once per client
    assert r[COMPLETE] == 1.0
    assert fake.fake_calls["nvmlDeviceGetMPSComputeRunningProcesses"] == 2


def test_an_idle_mps_client_is_no_tenant(tmp_path):
    """An H200 listed a paused MPS client (a process holding its context, no CPU time) beside a
    busy one: before, two clients and contended; now the idle one is not counted."""
    proc, now = _procfs(tmp_path), [0.0]
    with _source(pf.h100_mps(0), proc, clock=lambda: now[0]) as (src, fake):
        _read(src, fake)
        now[0] = 1.0
        write_stat(proc, 7101, utime=41, stime=10)  # one tick of each
        one = _read(src, fake)
        now[0] = 2.0
        none = _read(src, fake)  # neither ran, the server is busy: for whom cannot be told
    assert _clients(one) == {"7101": 97.0} and one[COMPLETE] == 1.0
    assert _clients(none) == {} and none[NO_ACTIVITY] == 0.0


def test_an_mps_client_below_the_cpu_share_is_idle(tmp_path):
    """The H200's paused client gained a clock tick every 10-30 s (its CUDA runtime threads):
    counted on any tick it read contended 11 scrapes of 49.  A client is active from
    ``mps_client_cpu_percent`` (2 %) of a core since the previous poll."""
    proc, now = _procfs(tmp_path), [0.0]
    with _source(pf.h100_mps(0), proc, clock=lambda: now[0]) as (src, fake):
        _read(src, fake)
        now[0] = 10.0  # 10 s: 2 % of a core is 20 ticks
        write_stat(proc, 7101, utime=45)  # 0.5 %: idle
        write_stat(proc, 7102, utime=60)  # 2 %: active
        r = _read(src, fake)
        now[0] = 10.5
        write_stat(proc, 7101, utime=46)  # one tick in half a second: 2 %, the minimum of one tick
        r2 = _read(src, fake)
    assert _clients(r) == {"7102": 97.0} and r[COMPLETE] == 1.0
    assert _clients(r2) == {"7101": 97.0}


def test_the_cpu_baseline_follows_polls_without_utilization_samples(tmp_path):
    """Polls with no new utilization sample (an idle GPU) still take the clients' CPU times: a
    client's burst while the GPU idled is no activity 30 s later (a baseline kept from before
    the idle spell averaged it in and counted a paused client)."""
    proc, now = _procfs(tmp_path), [0.0]
    with _source(pf.h100_mps(0), proc, clock=lambda: now[0]) as (src, fake):
        server = fake.fake_state["gpus"][0]["processes"][0]
        for second in range(32):
            now[0] = float(second)
            if 2 <= second < 31:
                server.pop("sm", None)  # no utilization samples while the GPU idles
            else:
                server["sm"] = 97
            write_stat(proc, 7101, utime=40 + 100 * second)  # busy throughout
            write_stat(proc, 7102, utime=40 + (300 if second >= 5 else 0))  # one burst at 5 s
            r = _read(src, fake)
    assert _clients(r) == {"7101": 97.0} and r[COMPLETE] == 1.0


@pytest.mark.parametrize("disruption", ["no_server_sample", "mps_list_refused", "utilization_failed"])
def test_the_cpu_baseline_is_kept_through_polls_that_do_not_judge_the_clients(tmp_path, disruption):
    """Polls that never reach the judgement (the server missing from the samples, the MPS list
    refused, the utilization call failed) still take the clients' CPU times."""
    proc, now = _procfs(tmp_path), [0.0]
    with _source(pf.h100_mps(0), proc, clock=lambda: now[0]) as (src, fake):
        spec = fake.fake_state["gpus"][0]
        server, real_util = spec["processes"][0], fake.nvmlDeviceGetProcessUtilization

        def failed(*args):
            raise fake.NVMLError(pf.ERRORS["NVML_ERROR_TIMEOUT"])

        for second in range(32):
            now[0] = float(second)
            on = 2 <= second < 31
            if disruption == "no_server_sample":
                if on:
                    server.pop("sm", None)
                    spec["processes"].append({"pid": 7200, "name": "other", "mem": 1 << 30, "sm": 50})
                else:
                    server["sm"] = 97
                    spec["processes"][:] = [q for q in spec["processes"] if q["pid"] != 7200]
            elif disruption == "mps_list_refused":
                spec["mps_error"] = pf.ERRORS["NVML_ERROR_TIMEOUT"] if on else None  # a passing error
            else:
                fake.nvmlDeviceGetProcessUtilization = failed if on else real_util
            write_stat(proc, 7101, utime=40 + 100 * second)
            write_stat(proc, 7102, utime=40 + (300 if second >= 5 else 0))
            r = _read(src, fake)
        key = next(iter(src.procs._cpu))
        spec["processes"].pop()  # 7102 leaves: its time is not kept
        now[0] = 32.0
        _read(src, fake)
    assert _clients(r) == {"7101": 97.0} and r[COMPLETE] == 1.0
    assert set(src.procs._cpu[key]) == {7101}


def test_an_mps_list_that_names_the_server_counts_it_once_and_never_as_its_own_client(tmp_path):
    proc, now = _procfs(tmp_path), [0.0]
    (proc / str(pf.MPS_SERVER_PID)).mkdir()
    write_stat(proc, pf.MPS_SERVER_PID, utime=40)
    with _source(pf.h100_mps(0), proc, clock=lambda: now[0]) as (src, fake):
        processes = fake.fake_state["gpus"][0]["processes"]
        processes.append({"pid": pf.MPS_SERVER_PID, "name": "nvidia-cuda-mps-server", "mps": True})
        _read(src, fake)
        now[0] = 1.0
        write_stat(proc, pf.MPS_SERVER_PID, utime=500)  # the server runs: not a client for that
        write_stat(proc, 7101, utime=45)
        with_clients = _read(src, fake)
        del processes[1:3]  # the list names the server only
        alone = _read(src, fake)
    assert _clients(with_clients) == {"7101": 97.0} and with_clients[COMPLETE] == 1.0
    assert _clients(alone) == {str(pf.MPS_SERVER_PID): 97.0} and alone[COMPLETE] == 1.0


def test_idle_mps_clients_beside_an_idle_server_are_a_complete_count_of_none(tmp_path):
    proc, now = _procfs(tmp_path), [0.0]
    with _source(pf.h100_mps(0), proc, clock=lambda: now[0]) as (src, fake):
        _read(src, fake)
        fake.fake_state["gpus"][0]["processes"][0]["sm"] = 0  # the server's sample says 0 %
        now[0] = 1.0
        r = _read(src, fake)
    assert _clients(r) == {} and r[COMPLETE] == 1.0


def test_mps_client_activity_that_cannot_be_told_leaves_the_count_partial(tmp_path):
    proc, now = _procfs(tmp_path), [0.0]
    with _source(pf.h100_mps(0), proc, clock=lambda: now[0]) as (src, fake):
        _read(src, fake)
        now[0] = 1.0
        write_stat(proc, 7101, utime=50)
        write_stat(proc, 7102, utime=50, starttime=9000)  # pid 7102 reused by another process
        reused = _read(src, fake)
        now[0] = 2.0
        (proc / "7101" / "stat").unlink()  # exited, or hidden (hidepid)
        write_stat(proc, 7102, utime=60, starttime=9000)
        gone = _read(src, fake)
    assert _clients(reused) == {"7101": 97.0} and reused[NO_ACTIVITY] == 0.0
    assert _clients(gone) == {"7102": 97.0} and gone[NO_ACTIVITY] == 0.0


def test_mps_clients_outside_the_host_pid_namespace_are_unknown_but_a_lone_one_counts(tmp_path):
    proc, now = _procfs(tmp_path, host=False), [0.0]  # a container without hostPID: its 7101 is not NVML's
    with _source(pf.h100_mps(0), proc, clock=lambda: now[0]) as (src, fake):
        _read(src, fake)
        now[0] = 1.0
        for pid in (7101, 7102):
            write_stat(proc, pid, utime=45)
        two = _read(src, fake)
    with _source(pf.h100_mps_one(0), proc) as (src, fake):
        one = _read(src, fake)  # the server's work is its one client's: no CPU time needed
    assert _clients(two) == {} and two[NO_ACTIVITY] == 0.0
    assert _clients(one) == {"7101": 97.0} and one[COMPLETE] == 1.0


def test_a_second_mps_client_is_judged_against_the_first_ones_kept_time(tmp_path):
    """A lone client's CPU time is taken too: when a second one comes, the first is already
    known (only the newcomer waits a poll)."""
    proc, now = _procfs(tmp_path), [0.0]
    with _source(pf.h100_mps(0), proc, clock=lambda: now[0]) as (src, fake):
        processes = fake.fake_state["gpus"][0]["processes"]
        second = processes.pop()
        alone = _read(src, fake)
        processes.append(second)
        now[0] = 1.0
        write_stat(proc, 7101, utime=45)
        pair = _read(src, fake)
    assert _clients(alone) == {"7101": 97.0}
    assert _clients(pair) == {"7101": 97.0} and pair[NO_ACTIVITY] == 0.0  # 7102 first seen


def test_mps_series_mode_exports_the_active_clients_and_no_utilization_for_the_server(tmp_path):
    proc, now = _procfs(tmp_path), [0.0]
    with _source(pf.h100_mps(0), proc, clock=lambda: now[0], processes="series") as (src, fake):
        _read(src, fake)
        now[0] = 1.0
        write_stat(proc, 7102, utime=45)
        r = _read(src, fake)
    assert _clients(r, "process.sm_util", "pid") == {"7102": 97.0}
    mem = _clients(r, "process.memory_used", "pid")
    assert mem == {"7101": 9 * 1024 * 2**20, "7102": 9 * 1024 * 2**20, str(pf.MPS_SERVER_PID): 64 * 2**20}


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


@contextmanager
def _running(proc, *pids: int):
    """``pids`` run on a CPU while the block lasts: their CPU time advances every 0.1 s."""
    stop = threading.Event()

    def tick() -> None:
        utime = 40
        while not stop.wait(0.1):
            utime += 3
            for pid in pids:  # whole files only: a reader never sees half a line
                (proc / str(pid) / "stat.new").write_text(stat_text(pid, utime=utime))
                os.replace(proc / str(pid) / "stat.new", proc / str(pid) / "stat")

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def test_two_saturating_mps_clients_read_contended(tmp_path):
    """Before: the MPS server was the one busy pid: memory_bound / single_client, no seconds."""
    def until(s):
        return bool(_state(s, state="contended")) and sum(_value(s, "gpu_memory_contention_seconds_total")) > 0

    proc = _procfs(tmp_path)
    with _running(proc, 7101, 7102):
        s = _serve(tmp_path, "h100_mps", until, flags=("--path.procfs", str(proc)))
    assert _value(s, "gpu_active_clients") == [2.0]
    assert _state(s)[0]["reason"] == "clients"


def test_a_busy_and_an_idle_mps_client_read_memory_bound(tmp_path):
    """What the H200 showed: a paused MPS client (holding its context) beside a busy one read
    contended / clients_sharing_bandwidth 100 % before; its CPU time says it submits nothing."""
    proc = _procfs(tmp_path)
    with _running(proc, 7101):
        s = _serve(tmp_path, "h100_mps", lambda s: bool(_state(s, state="memory_bound")),
                   flags=("--path.procfs", str(proc)))
    assert _value(s, "gpu_active_clients") == [1.0]
    assert _state(s)[0]["reason"] == "single_client"
    assert not _value(s, "gpu_memory_contention_seconds_total") or \
        sum(_value(s, "gpu_memory_contention_seconds_total")) == 0


def test_mps_clients_whose_activity_cannot_be_read_read_unknown(tmp_path):
    """A container without the host's pid namespace: two listed clients, activity unknown."""
    proc = _procfs(tmp_path, host=False)
    s = _serve(tmp_path, "h100_mps", lambda s: bool(_state(s, state="unknown", reason="mps_client_activity_unknown")),
               flags=("--path.procfs", str(proc)))
    assert not _value(s, "gpu_active_clients")
    assert _value(s, "gpu_contention_evidence_info", evidence="none", reason="mps_client_activity_unknown") == [1.0]


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
