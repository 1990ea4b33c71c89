"""PyTorch Kineto JSON import (CUDA and ROCm) and Intel unitrace metric CSV."""

from __future__ import annotations

import json

import pytest

from exporter.importers.detect import import_file
from exporter.importers.model import ProfileRejected, quantile


def fx(shared_fixtures, name):
    return shared_fixtures / "profilers" / name


def test_triton_cuLaunchKernel_delay_clipped_at_zero(shared_fixtures):
    prof = import_file(fx(shared_fixtures, "kineto-a100-triton-cuLaunchKernel.json"))
    (k,) = prof.kernels
    assert k.name == "triton_poi_fused_add_cos_sin_0"
    assert k.duration_ns == pytest.approx(1760)
    # the kernel starts 45 us after cuLaunchKernel begins, before the call returns: HTA clips to 0
    assert k.launch_delay_ns == 0
    assert prof.wall_zero_ns == 1727743122000000000  # baseTimeNanoseconds
    assert prof.ranges[0].name == "ProfilerStep#1"


def test_simple_add_launch_delay_and_queue(shared_fixtures):
    prof = import_file(fx(shared_fixtures, "kineto-a100-simple-add.json.gz"))
    assert len(prof.kernels) == 79
    delays = sorted(k.launch_delay_ns for k in prof.kernels if k.launch_delay_ns is not None)
    assert len(delays) == 79
    assert quantile(delays, 0.5) == pytest.approx(3072)
    assert max(delays) == pytest.approx(873984)
    assert prof.queue_length_max == {"0": 5}


def test_rocm_trace_is_amd(shared_fixtures):
    prof = import_file(fx(shared_fixtures, "kineto-mi250-rocm6.2.json"))
    assert prof.variant == "kineto json (ROCm)"
    assert len(prof.kernels) == 14 and {k.device for k in prof.kernels} == {"2"}
    assert prof.devices["2"].vendor == "amd"
    assert all(k.launch_delay_ns is not None for k in prof.kernels)  # hipLaunchKernel / hipExtModuleLaunchKernel


def test_cupti_profiler_range_counters(shared_fixtures):
    prof = import_file(fx(shared_fixtures, "kineto-a100-cupti-profiler-range-counters.json.gz"))
    assert len(prof.kernels) == 77 and all(k.counters_only for k in prof.kernels)
    assert prof.kernels[0].counters["smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"] == 38731776


@pytest.mark.parametrize("data,reason", [({"foo": 1}, "no traceEvents"), ([1, 2], "no traceEvents"),
                                         ({"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 1}]}, "no kernel")])
def test_json_without_kernels_rejected(tmp_path, data, reason):
    p = tmp_path / "t.json"
    p.write_text(json.dumps(data))
    with pytest.raises(ProfileRejected, match=reason):
        import_file(p)


def test_unitrace_pvc_metric_query(shared_fixtures):
    prof = import_file(fx(shared_fixtures, "unitrace-pvc-device-timing-and-metric-query.txt"))
    names = [k.name for k in prof.kernels]
    assert names.count("hgemm_nocopy_nn_64x40_4x8[SIMD16 {56; 1; 1} {64; 8; 1}]") == 2
    k = next(k for k in prof.kernels if k.name.startswith("hgemm"))
    assert k.duration_ns == 4733040
    assert k.counters["GPU_MEMORY_BYTE_READ"] == 848934528
    assert k.counters["XVE_ACTIVE"] == pytest.approx(90.354)
    assert k.counters["XVE_THREADS_OCCUPANCY_ALL"] == pytest.approx(46.8018)
    # (848,934,528 + 125,991,296) B / 4,733,040 ns = 206 GB/s (read alone ~179 GB/s)
    assert k.counters["dram_bytes_per_second"] / 1e9 == pytest.approx(205.98, abs=0.01)
    assert prof.devices["0"].vendor == "intel"


def test_unitrace_kernel_name_with_commas_split_from_the_right(tmp_path):
    p = tmp_path / "metrics.csv"
    p.write_text("Kernel,Device,SubDeviceId,GpuTime[ns],XVE_ACTIVE[%],\n"
                 "foo<int, float>[SIMD16 {1; 1; 1}],0,0,1000,50.5,\n"
                 "short,row\n")
    prof = import_file(p)
    assert prof.kernels[0].name == "foo<int, float>[SIMD16 {1; 1; 1}]"
    assert prof.kernels[0].counters["XVE_ACTIVE"] == 50.5
    assert any("shifted" in w for w in prof.warnings)


def test_unitrace_timing_summary_only_is_rejected(tmp_path):
    p = tmp_path / "timing.txt"
    p.write_text("=== Device Timing Summary ===\n\nTotal Execution Time (ns): 5\n")
    with pytest.raises(ProfileRejected, match="metric-query"):
        import_file(p)
