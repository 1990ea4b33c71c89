"""AMD rocprof v1 / rocprofv2 (Omniperf) / rocprofv3 CSV import."""

from __future__ import annotations

import shutil

import pytest

from exporter.importers.detect import import_file
from exporter.importers.model import CompanionFile, ProfileRejected


def fx(shared_fixtures, name):
    return shared_fixtures / "profilers" / name


def test_mi300x_tcc_l2_hit_and_fetch_size(shared_fixtures):
    prof = import_file(fx(shared_fixtures, "rocprofv2-via-omniperf-mi300x-tcc-pmc_perf.csv"))
    k0 = prof.kernels[0]
    assert k0.name == "vecCopy(double*, double*, double*, int, int)"  # " (.kd)" stripped
    # TCC_HIT_sum 66160 / (66160 + 131312) = 33.5 %
    assert k0.counters["l2cachehit"] == pytest.approx(33.50, abs=0.005)
    # gfx942: non-32B reads weigh 128 B: 65781 x 128 / 1024 KB; writes 131072 x 64 / 1024
    assert k0.counters["fetch_size_kb"] == pytest.approx(65781 * 128 / 1024)
    assert k0.counters["write_size_kb"] == 8192
    assert k0.duration_ns == 16840
    assert k0.counters["dram_bytes_per_second"] / 1e9 == pytest.approx(998.1, abs=0.1)
    # companion sysinfo.csv (same name prefix) gives hbm_bw 5324.8 GB/s: 18.7 %
    assert k0.counters["dram_bw_pct_of_peak"] == pytest.approx(18.75, abs=0.01)
    assert prof.devices[k0.device].model == "MI300X_A1"
    assert not any(c.startswith(("wave_size_", "correlation_id_")) for c in k0.counters)


def test_sysinfo_only_applies_to_its_own_workload(shared_fixtures, tmp_path):
    shutil.copy(fx(shared_fixtures, "rocprofv2-via-omniperf-mi300x-tcc-pmc_perf.csv"), tmp_path / "pmc_perf.csv")
    prof = import_file(tmp_path / "pmc_perf.csv")
    assert "dram_bw_pct_of_peak" not in prof.kernels[0].counters
    v1 = import_file(fx(shared_fixtures, "rocprof-v1-rocm5.3-results.csv"))
    assert v1.devices["0"].model == ""  # the MI300X sysinfo beside it is not this run's


def test_v1_results_dispatch_to_begin_latency(shared_fixtures):
    prof = import_file(fx(shared_fixtures, "rocprof-v1-rocm5.3-results.csv"))
    assert prof.variant == "rocprof v1 results.csv"
    assert len(prof.kernels) == 10
    assert prof.kernels[0].name == "bodyForce(Body*, float, int)"
    assert prof.kernels[0].launch_delay_ns == 526262  # BeginNs - DispatchNs
    assert prof.kernels[0].duration_ns == 26316649


def test_v1_derived_counters(shared_fixtures):
    c = import_file(fx(shared_fixtures, "rocprof-v1-rocm5.3-derived-counters.csv")).kernels[0].counters
    assert c["l2cachehit"] == pytest.approx(96.5684331443)
    assert c["memunitstalled"] == pytest.approx(0.0044357832)
    assert c["fetch_size_kb"] == pytest.approx(9429.1875)


@pytest.mark.parametrize("name,device,count", [
    ("rocprofv3-kernel_trace-rocm-systems-docs.csv", "4", 4),   # Agent_Id "Agent 4", Stream_Id column
    ("rocprofv3-kernel_trace-sdk-2024-10.csv", "1", 7),         # integer Agent_Id, Private_Segment_Size
])
def test_v3_kernel_trace_column_sets(shared_fixtures, name, device, count):
    prof = import_file(fx(shared_fixtures, name))
    assert len(prof.kernels) == count
    assert {k.device for k in prof.kernels} == {device}
    assert all(k.duration_ns and k.duration_ns > 0 for k in prof.kernels)


def test_v3_counter_collection_pivot(shared_fixtures):
    cur = import_file(fx(shared_fixtures, "rocprofv3-counter_collection-rocm-systems-docs.csv"))
    assert len(cur.kernels) == 4
    assert cur.kernels[0].counters["sq_waves"] == 16384
    assert cur.kernels[0].duration_ns == 3200098838483232 - 3200098838431081
    old = import_file(fx(shared_fixtures, "rocprofv3-counter_collection-sdk-2024-10.csv"))
    assert all(k.duration_ns is None for k in old.kernels)  # the Oct-2024 format has no timestamps


def test_v3_launch_delay_from_hip_api_trace(tmp_path):
    (tmp_path / "77_kernel_trace.csv").write_text(
        '"Kind","Agent_Id","Queue_Id","Stream_Id","Thread_Id","Dispatch_Id","Kernel_Id","Kernel_Name",'
        '"Correlation_Id","Start_Timestamp","End_Timestamp"\n'
        '"KERNEL_DISPATCH","Agent 2",1,1,9,1,10,"k",5,2000,3000\n'
        '"KERNEL_DISPATCH","Agent 2",1,1,9,2,10,"k",6,3500,4500\n')
    (tmp_path / "77_hip_api_trace.csv").write_text(
        '"Domain","Function","Process_Id","Thread_Id","Correlation_Id","Start_Timestamp","End_Timestamp"\n'
        '"HIP_RUNTIME_API","hipLaunchKernel",9,9,5,1000,1500\n'
        '"HIP_RUNTIME_API","hipLaunchKernel",9,9,6,1600,1700\n')
    prof = import_file(tmp_path / "77_kernel_trace.csv")
    assert [k.launch_delay_ns for k in prof.kernels] == [500, 1800]
    assert prof.queue_length_max == {"2": 2}


@pytest.mark.parametrize("name", ["rocprofv3-hip_runtime_trace-sdk-2024-10.csv",
                                  "rocprofv2-via-omniperf-mi300x-sysinfo.csv",
                                  "rocprofv3-agent_info-rocm-systems-docs.csv",
                                  "rocprofv3-memory_copy_trace-sdk-2024-10.csv"])
def test_companion_files_are_named_not_failed(shared_fixtures, name):
    with pytest.raises(CompanionFile):
        import_file(fx(shared_fixtures, name))


def test_shifted_columns(tmp_path):
    p = tmp_path / "results.csv"
    p.write_text('"Index","KernelName","gpu-id","DispatchNs","BeginNs","EndNs"\n'
                 '0,"k",0,100,200,300\n'
                 '1,"k",0,100,200\n'
                 '2,"a, b",0,1,100,200,300\n')
    prof = import_file(p)
    assert len(prof.kernels) == 1 and prof.kernels[0].duration_ns == 100
    assert any("shifted" in w for w in prof.warnings)


def test_unknown_csv_rejected(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(ProfileRejected, match="unrecognised format"):
        import_file(p)
