"""End to end through mappings/nvml.yaml: canonical names, units and labels from the fake NVML."""

from __future__ import annotations

import itertools

import pytest

from exporter.sources.context import SourceContext
from exporter.sources.nvml import NvmlSource
from exporter.testing import map_source_once, values_of
from tests.fakes import pynvml_fake as pf

MIB = 1 << 20


def run(gpus, **options):
    fake = pf.make_module(gpus)
    ticks = itertools.count(0.0, 1.0)  # every GPU read advances 1 s: GPM windows are valid
    options.setdefault("xid", False)
    src = NvmlSource(SourceContext(options=options), module=fake, clock=lambda: next(ticks))
    return map_source_once(src, cycles=2), fake


def one(series, metric, **labels):
    vals = values_of(series, metric, **labels)
    assert len(vals) == 1, (metric, labels, vals)
    return vals[0]


def test_h100_every_canonical_metric():
    s, _ = run([pf.h100(0)], processes=True)
    g = {"gpu": "0", "vendor": "nvidia", "uuid": "GPU-h1000000-0000-0000-0000-000000000000"}
    assert one(s, "gpu_power_watts", **g) == pytest.approx(631.95)               # mW -> W
    assert one(s, "gpu_power_limit_watts", **g) == pytest.approx(700.0)
    assert one(s, "gpu_power_limit_max_watts", **g) == pytest.approx(700.0)
    assert one(s, "gpu_energy_joules_total", **g) == pytest.approx(1_234_567.89)  # mJ -> J
    assert one(s, "gpu_compute_utilization_percent", **g) == 100
    assert one(s, "gpu_memory_used_bytes", **g) == 19817 * MIB
    assert one(s, "gpu_memory_reserved_bytes", **g) == 479 * MIB
    assert one(s, "gpu_memory_total_bytes", **g) == 81559 * MIB
    assert one(s, "gpu_memory_utilization_percent", **g) == pytest.approx(19817 / 81559 * 100)
    assert one(s, "gpu_temperature_celsius", sensor="gpu", **g) == 59
    assert one(s, "gpu_temperature_celsius", sensor="memory", **g) == 54
    assert one(s, "gpu_clock_mhz", domain="sm", **g) == 1980
    assert one(s, "gpu_clock_max_mhz", domain="memory", **g) == 2619
    assert one(s, "gpu_memory_bus_width_bytes", **g) == 640  # 5120 bits
    # peak = 5120 bit / 8 x 2619 MHz x 2 (DDR) = 3352.32 GB/s
    assert one(s, "gpu_memory_peak_bandwidth_gbps", **g) == pytest.approx(3352.32)
    # GPM DRAM_BW_UTIL (percent, 0-100) wins over utilization.memory (11)
    assert one(s, "gpu_memory_bandwidth_utilization_percent", **g) == 88.5
    assert one(s, "gpu_memory_bandwidth_gbps", **g) == pytest.approx(0.885 * 3352.32)
    assert one(s, "gpu_compute_occupancy_percent", **g) == 38.25
    assert one(s, "gpu_sm_active_percent", **g) == 95.0
    assert one(s, "gpu_tensor_utilization_percent", **g) == 61.0
    assert one(s, "gpu_throttle_active", reason="sw_power_cap", **g) == 1
    assert one(s, "gpu_throttle_active", reason="hw_thermal", **g) == 0
    assert len(values_of(s, "gpu_throttle_active", **g)) == 9
    assert one(s, "gpu_pcie_bytes_total", direction="tx", **g) == 5_000_000_000
    assert one(s, "gpu_pcie_replays_total", **g) == 3
    # NVLink throughput counters are KiB: x1024
    assert one(s, "gpu_interconnect_bytes_total", interconnect="nvlink", direction="rx", **g) == 2_000_000 * 1024
    assert one(s, "gpu_interconnect_errors_total", interconnect="nvlink", type="replay", **g) == 2
    assert one(s, "gpu_ecc_errors_total", severity="corrected", **g) == 0
    assert one(s, "gpu_memory_remapped_rows", state="pending", **g) == 0
    assert one(s, "gpu_engine_utilization_percent", engine="encoder", **g) == 0
    assert one(s, "gpu_process_memory_bytes", pid="4242", process="python3", **g) == 18 * 1024 * MIB


def test_old_gpu_without_gpm_falls_back_and_has_no_gpm_series():
    s, _ = run([pf.t4(0)])
    g = {"gpu": "0"}
    assert values_of(s, "gpu_compute_occupancy_percent", **g) == []
    assert values_of(s, "gpu_sm_active_percent", **g) == []
    # fallback: NVML utilization.memory (percent of time), then the derived GB/s
    assert one(s, "gpu_memory_bandwidth_utilization_percent", **g) == 20
    assert one(s, "gpu_memory_peak_bandwidth_gbps", **g) == pytest.approx(256 / 8 * 5001 * 2 / 1000)
    assert values_of(s, "gpu_memory_remapped_rows", **g) == []


def test_a100_mig_series():
    s, _ = run([pf.a100_mig(0)])
    inst = {"gpu": "0", "gpu_instance": "11", "compute_instance": "0", "mig_profile": "1g.5gb"}
    assert one(s, "gpu_memory_used_bytes", **inst) == 2000 * MIB
    assert one(s, "gpu_memory_utilization_percent", **inst) == pytest.approx(2000 / 4864 * 100)
    profiles = {dict(lbl).get("mig_profile") for (name, lbl) in s if name == "gpu_memory_total_bytes"}
    assert profiles == {None, "1g.5gb", "2g.10gb"}
    assert values_of(s, "gpu_compute_occupancy_percent") == []


def test_h100_mig_gpm_series():
    s, _ = run([pf.h100_mig(0)])
    assert one(s, "gpu_compute_occupancy_percent", gpu_instance="1", mig_profile="3g.40gb") == 40.0
    assert one(s, "gpu_memory_bandwidth_utilization_percent", gpu_instance="2") == 10.0


def test_lost_gpu_keeps_other_gpus():
    fake = pf.make_module([pf.h100(0), pf.t4(1)])
    src = NvmlSource(SourceContext(options={"xid": False}), module=fake)
    src.open()
    try:
        fake.fake_lose(0)
        s = map_source_once(src, cycles=1, opened=True)
    finally:
        src.close()
    assert values_of(s, "gpu_power_watts", gpu="0") == []
    assert values_of(s, "gpu_power_watts", gpu="1") == [27.5]


def test_pcie_link_generation_becomes_gt_per_second_and_max_link_is_static():
    t4 = pf.t4(0)
    t4["pcie_gen"], t4["pcie_width"], t4["pcie_max_width"] = 1, 8, 16  # idle downshift, x8 of x16
    s, _ = run([pf.h100(0), t4])
    h = {"gpu": "0", "vendor": "nvidia", "uuid": "GPU-h1000000-0000-0000-0000-000000000000"}
    assert one(s, "gpu_pcie_link_speed_gts", **h) == 32.0      # Gen5
    assert one(s, "gpu_pcie_link_max_speed_gts", **h) == 32.0
    assert one(s, "gpu_pcie_link_max_width", **h) == 16
    t = {"gpu": "1", "vendor": "nvidia", "uuid": "GPU-74000000-0000-0000-0000-000000000000"}
    assert one(s, "gpu_pcie_link_speed_gts", **t) == 2.5       # Gen1
    assert one(s, "gpu_pcie_link_max_speed_gts", **t) == 8.0   # Gen3
    assert one(s, "gpu_pcie_link_width", **t) == 8 and one(s, "gpu_pcie_link_max_width", **t) == 16


def test_unknown_pcie_generation_is_malformed_not_exported():
    gpu = pf.h100(0)
    gpu["pcie_gen"] = 9  # not a generation the mapping knows
    s, _ = run([gpu])
    assert values_of(s, "gpu_pcie_link_speed_gts") == []
    assert values_of(s, "gpu_pcie_link_max_speed_gts") == [32.0]
