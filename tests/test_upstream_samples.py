"""Each real vendor exporter sample, served over HTTP, read by UpstreamSource and mapped through
mappings/upstream/*.yaml.  Expected values are computed by hand from the sample lines (quoted in
the comments) and the unit notes in the mapping files.
"""

from __future__ import annotations

import re
from pathlib import Path

from exporter.sources.base import Device
from exporter.sources.context import SourceContext
from exporter.sources.upstream import UpstreamSource
from exporter.testing import Series, map_source_once
from tests.test_upstream_http import ExporterServer, Route

MiB = 1048576


def serve(server: ExporterServer, path: str, body: str) -> str:
    server.routes[path] = Route(body=body.encode())
    return server.url(path)


def source_for(url: str, exporter: str, **extra) -> UpstreamSource:
    return UpstreamSource(SourceContext(options={"targets": [{"name": "t", "url": url, "exporter": exporter, **extra}]}))


def devices_of(src: UpstreamSource) -> list[Device]:
    src.open()
    try:
        return src.poll().devices
    finally:
        src.close()


def canon(series: Series) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Series without the device labels vendor/gpu/uuid (checked separately), rounded."""
    out = {}
    for (name, labels), v in series.items():
        rest = tuple(sorted((k, val) for k, val in labels if k not in ("vendor", "gpu", "uuid")))
        out[(name, rest)] = round(v, 6)
    return out


def device_labels(series: Series) -> set[tuple[tuple[str, str], ...]]:
    return {tuple(sorted((k, v) for k, v in labels if k in ("vendor", "gpu", "uuid"))) for _, labels in series}


def m(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return (name, tuple(sorted(labels.items())))


# ---------------------------------------------------------------- NVIDIA dcgm-exporter (L4)

def test_dcgm_exporter_l4(server, mappings, shared_fixtures: Path) -> None:
    url = serve(server, "/dcgm", (shared_fixtures / "nvidia/dcgm-exporter-sample.prom").read_text())
    [dev] = devices_of(source_for(url, "dcgm-exporter"))
    assert dev == Device(key="0000:31:00.0", vendor="nvidia", index="0", mapping="upstream/dcgm-exporter",
                         uuid="GPU-c2f76b33-7953-256e-8f33-1343419b1a1c", model="NVIDIA L4",
                         pci_bus_id="0000:31:00.0", driver="580.105.08")
    series = map_source_once(source_for(url, "dcgm-exporter"), mappings=mappings)
    assert device_labels(series) == {(("gpu", "0"), ("uuid", "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"),
                                      ("vendor", "nvidia"))}
    assert canon(series) == {
        m("gpu_clock_mhz", domain="sm"): 210,                      # DCGM_FI_DEV_SM_CLOCK 210
        m("gpu_clock_mhz", domain="memory"): 405,                  # DCGM_FI_DEV_MEM_CLOCK 405
        # DCGM_FI_DEV_MEMORY_TEMP 0: the L4 has no memory sensor -> no series
        m("gpu_temperature_celsius", sensor="gpu"): 31,
        m("gpu_power_watts"): 16.365,
        m("gpu_energy_joules_total"): 4742.776,                    # 4742776 mJ
        m("gpu_pcie_replays_total"): 0,
        m("gpu_compute_utilization_percent"): 0,                   # GPU_UTIL 0 (GR_ENGINE_ACTIVE 0.0 too)
        m("gpu_memory_bandwidth_utilization_percent"): 0,          # DRAM_ACTIVE 0.0 x 100
        m("gpu_engine_utilization_percent", engine="encoder"): 0,
        m("gpu_engine_utilization_percent", engine="decoder"): 0,
        m("gpu_memory_free_bytes"): 22563 * MiB,                   # 23 659 020 288
        m("gpu_memory_used_bytes"): 0,
        m("gpu_memory_reserved_bytes"): 470 * MiB,
        m("gpu_memory_remapped_rows", state="uncorrected"): 0,
        m("gpu_memory_remapped_rows", state="corrected"): 0,
        m("gpu_memory_remapped_rows", state="failure"): 0,
        m("gpu_tensor_utilization_percent"): 0,
        m("gpu_profiling_available"): 1,           # PROF_* all 0 on an idle GPU: values, kept
    }


# ---------------------------------------------------------------- NVIDIA dcgm-exporter (A100 + MIG)

def test_dcgm_exporter_a100_mig(server, mappings, shared_fixtures: Path) -> None:
    url = serve(server, "/mig", (shared_fixtures / "nvidia/dcgm-exporter-sample-mig-a100.prom").read_text())
    [dev] = devices_of(source_for(url, "dcgm-exporter"))
    # 2.x label set: no pci_bus_id, so the UUID is the key
    assert (dev.key, dev.index, dev.uuid, dev.pci_bus_id, dev.model) == (
        "GPU-34319582-d595-d1c7-d1d2-179bcfa61660", "0", "GPU-34319582-d595-d1c7-d1d2-179bcfa61660", "", "")
    series = map_source_once(source_for(url, "dcgm-exporter"), mappings=mappings)
    mig = {"gpu_instance": "13", "mig_profile": "1g.5gb"}
    assert canon(series) == {
        m("gpu_clock_mhz", domain="sm"): 1215,
        m("gpu_clock_mhz", domain="memory"): 1215,
        m("gpu_temperature_celsius", sensor="gpu"): 61,
        m("gpu_temperature_celsius", sensor="memory"): 69,
        m("gpu_power_watts"): 409.692,
        m("gpu_energy_joules_total"): 319159.391,                 # 319159391 mJ
        m("gpu_pcie_replays_total"): 0,
        m("gpu_memory_free_bytes"): 35690 * MiB,
        m("gpu_memory_used_bytes"): 4845 * MiB,
        # whole GPU: PROF ratios x 100
        m("gpu_compute_utilization_percent"): 99.563,             # GR_ENGINE_ACTIVE 0.995630
        m("gpu_tensor_utilization_percent"): 92.926,              # PIPE_TENSOR_ACTIVE 0.929260
        m("gpu_memory_bandwidth_utilization_percent"): 69.0789,   # DRAM_ACTIVE 0.690789
        # the 1g.5gb GPU instance 13
        m("gpu_compute_utilization_percent", **mig): 99.5687,
        m("gpu_tensor_utilization_percent", **mig): 93.0433,
        m("gpu_memory_bandwidth_utilization_percent", **mig): 80.0339,
        m("gpu_profiling_available"): 1,
        # NVLINK_BANDWIDTH_TOTAL 0 (a throughput gauge): its integral from the first poll on
        m("gpu_interconnect_bytes_total", interconnect="nvlink", direction="total"): 0,
    }


# ---------------------------------------------------------------- utkuozdemir/nvidia_gpu_exporter (H100)

def test_nvidia_gpu_exporter_h100(server, mappings, shared_fixtures: Path) -> None:
    url = serve(server, "/nge", (shared_fixtures / "nvidia/nvidia_gpu_exporter-h100-load.prom").read_text())
    [dev] = devices_of(source_for(url, "nvidia_gpu_exporter"))
    # identity from nvidia_smi_gpu_info; the capture's UUID is masked to zeros -> no uuid
    assert dev == Device(key="0000:00:09.0", vendor="nvidia", index="0", mapping="upstream/nvidia_gpu_exporter",
                         uuid="", model="NVIDIA H100 80GB HBM3", pci_bus_id="0000:00:09.0",
                         driver="590.48.01", serial="0000000000000")
    series = map_source_once(source_for(url, "nvidia_gpu_exporter"), mappings=mappings)
    used, total = 2.0780679168e10, 8.5520809984e10
    reasons = ["idle", "app_clocks", "sw_power_cap", "hw_slowdown", "hw_thermal", "hw_power_brake",
               "sw_thermal", "sync_boost"]
    want = {
        m("gpu_compute_utilization_percent"): 100,                # utilization_gpu_ratio 1
        m("gpu_memory_bandwidth_utilization_percent"): 11,        # utilization_memory_ratio 0.11
        m("gpu_engine_utilization_percent", engine="encoder"): 0,
        m("gpu_engine_utilization_percent", engine="decoder"): 0,
        m("gpu_memory_used_bytes"): used,
        m("gpu_memory_free_bytes"): 6.4238911488e10,
        m("gpu_memory_total_bytes"): total,
        m("gpu_memory_reserved_bytes"): 5.02267904e8,
        m("gpu_memory_utilization_percent"): round(used / total * 100, 6),  # derived: 24.298974
        m("gpu_clock_mhz", domain="graphics"): 1980,              # 1.98e+09 Hz
        m("gpu_clock_mhz", domain="sm"): 1980,
        m("gpu_clock_mhz", domain="memory"): 2619,
        m("gpu_clock_mhz", domain="video"): 1545,
        m("gpu_clock_max_mhz", domain="graphics"): 1980,
        m("gpu_clock_max_mhz", domain="sm"): 1980,
        m("gpu_clock_max_mhz", domain="memory"): 2619,
        m("gpu_temperature_celsius", sensor="gpu"): 59,
        m("gpu_temperature_celsius", sensor="memory"): 54,
        m("gpu_power_watts"): 631.95,                             # power_draw_watts
        m("gpu_power_limit_watts"): 700,
        m("gpu_power_limit_max_watts"): 700,
        m("gpu_pcie_link_width"): 16,
        m("gpu_ecc_errors_total", severity="corrected"): 0,
        m("gpu_ecc_errors_total", severity="uncorrected"): 0,
        **{m("gpu_memory_remapped_rows", state=s): 0 for s in ("corrected", "uncorrected", "pending", "failure")},
        **{m("gpu_throttle_active", reason=r): 0 for r in reasons},
        m("gpu_process_memory_bytes", pid="11327", process="/root/tools/memhog"): 2.690646016e9,
        m("gpu_process_memory_bytes", pid="11328", process="/root/tools/memhog"): 1.616904192e9,
        m("gpu_process_memory_bytes", pid="11345", process="./gpu_burn"): 1.645215744e10,
    }
    assert canon(series) == want


# ---------------------------------------------------------------- AMD device-metrics-exporter

def amd_blocks(shared_fixtures: Path) -> dict[int, str]:
    """The sample file is a collection of 5 independent captures ("# --- Block N:"), each served
    alone like the /metrics of its own node."""
    text = (shared_fixtures / "amd/amd-device-metrics-exporter-sample.prom").read_text()
    parts = re.split(r"^# --- Block (\d+):.*$", text, flags=re.MULTILINE)
    return {int(parts[i]): parts[i + 1] for i in range(1, len(parts), 2)}


def test_amd_dme_block1_mi300x_vf_edge_sensor_absent(server, mappings, shared_fixtures: Path) -> None:
    url = serve(server, "/amd1", amd_blocks(shared_fixtures)[1])
    [dev] = devices_of(source_for(url, "amd-device-metrics-exporter"))
    assert dev == Device(key="17ff74b5-0000-1000-805c-37b0fbe69430", vendor="amd", index="0",
                         mapping="upstream/amd-device-metrics-exporter",
                         uuid="17ff74b5-0000-1000-805c-37b0fbe69430",
                         model="Aqua Vanjaram [Instinct MI300X VF]", driver="6.12.12")
    # gpu_edge_temperature 0: MI3xx have no edge sensor -> no series at all
    assert map_source_once(source_for(url, "amd-device-metrics-exporter"), mappings=mappings) == {}


def test_amd_dme_block2_mi300x_gfx_activity(server, mappings, shared_fixtures: Path) -> None:
    url = serve(server, "/amd2", amd_blocks(shared_fixtures)[2])
    [dev] = devices_of(source_for(url, "amd-device-metrics-exporter"))
    assert (dev.index, dev.uuid, dev.model, dev.serial) == (
        "2", "ccff74a1-0000-1000-80e0-c6d49f5b0d86", "AMD Instinct MI300X OAM", "692409005408")
    series = map_source_once(source_for(url, "amd-device-metrics-exporter"), mappings=mappings)
    assert series == {("gpu_compute_utilization_percent", frozenset({
        ("vendor", "amd"), ("gpu", "2"), ("uuid", "ccff74a1-0000-1000-80e0-c6d49f5b0d86")})): 0.0}


def test_amd_dme_block3_renamed_pcie_bandwidth_is_not_mapped(server, mappings, shared_fixtures: Path) -> None:
    url = serve(server, "/amd3", amd_blocks(shared_fixtures)[3])
    devs = devices_of(source_for(url, "amd-device-metrics-exporter"))
    assert [(d.index, d.key) for d in devs] == [("2", "8cff74b9-0000-1000-802c-c938055be37b"),
                                                ("3", "b6ff74b9-0000-1000-804b-b933ce354f93")]
    assert map_source_once(source_for(url, "amd-device-metrics-exporter"), mappings=mappings) == {}


def test_amd_dme_block4_prefix_and_zero_uuid(server, shared_fixtures: Path) -> None:
    """MetricsFieldPrefix "amd_", two virtualized GPUs (two hosts) with all-zero UUIDs."""
    url = serve(server, "/amd4", amd_blocks(shared_fixtures)[4])
    src = source_for(url, "amd-device-metrics-exporter", metric_prefix="amd_")
    src.open()
    sample = src.poll()
    src.close()
    assert [(d.key, d.index, d.uuid, d.model) for d in sample.devices] == [
        ("t:enc1-gpuvm022:gpu0", "0", "", "Aqua Vanjaram [Instinct MI300X VF]"),
        ("t:mi325x8-110.atl1.do.cpe.ice.amd.com:gpu0", "0", "", "Aqua Vanjaram [Instinct MI325X VF]"),
    ]
    assert [(r.device, r.field, r.value) for r in sample.readings] == [
        ("t:enc1-gpuvm022:gpu0", "gpu_gfx_activity", 0.0),
        ("t:mi325x8-110.atl1.do.cpe.ice.amd.com:gpu0", "gpu_gfx_activity", 83.0),
    ]
    assert ("kfd_process_id", "2912425") in sample.readings[1].labels


def test_amd_dme_block5_clocks_and_xgmi(server, mappings, shared_fixtures: Path) -> None:
    url = serve(server, "/amd5", amd_blocks(shared_fixtures)[5])
    series = map_source_once(source_for(url, "amd-device-metrics-exporter"), mappings=mappings)
    got = {(name, dict(labels)["gpu"]) + tuple(sorted((k, v) for k, v in labels
                                                       if k not in ("vendor", "gpu", "uuid"))): round(v, 6)
           for (name, labels), v in series.items()}
    KB = 1024
    rx = [0, 2.776148269e9, 2.914491813e9, 2.853215723e9, 2.857943554e9, 2.859773597e9, 2.852296682e9,
          2.757052542e9]
    tx = [0, 3.539423344e9, 3.708415141e9, 3.639806555e9, 3.675549728e9, 3.657430314e9, 3.646094607e9,
          3.545990503]  # link 7 as printed in the doc ("3.545990503e+0")
    want = {
        ("gpu_clock_mhz", "3", ("domain", "fabric")): 22,      # clock_type="data"
        ("gpu_clock_mhz", "0", ("domain", "graphics")): 132,   # clock_type="system"
        ("gpu_clock_mhz", "0", ("domain", "memory")): 900,
        ("gpu_clock_mhz", "5", ("domain", "video")): 29,
        ("gpu_clock_mhz", "5", ("domain", "soc")): 29,
    }
    for link, (r, t) in enumerate(zip(rx, tx, strict=True)):
        want[("gpu_interconnect_bytes_total", "0", ("direction", "rx"), ("interconnect", "xgmi"),
              ("link", str(link)))] = round(r * KB, 6)
        want[("gpu_interconnect_bytes_total", "0", ("direction", "tx"), ("interconnect", "xgmi"),
              ("link", str(link)))] = round(t * KB, 6)
    assert got == want


def test_amd_dme_v1_0_format(server, mappings, shared_fixtures: Path) -> None:
    url = serve(server, "/amdv1", (shared_fixtures / "amd/amd-device-metrics-exporter-v1.0-mini.prom").read_text())
    [dev] = devices_of(source_for(url, "amd-device-metrics-exporter"))
    # no gpu_id label in v1.0: numbered by order of appearance
    assert (dev.key, dev.index, dev.serial) == ("6699c0a8-4200-4242-037f-f97e6cae0f09", "0", "692247001282")
    series = map_source_once(source_for(url, "amd-device-metrics-exporter"), mappings=mappings)
    assert canon(series) == {
        m("gpu_power_watts"): 41,                               # gpu_power_usage 41
        m("gpu_memory_total_bytes"): 68702 * MiB,               # gpu_total_memory 68702 (MB)
        m("gpu_compute_utilization_percent"): 0,                # gpu_usage 0
    }


# ---------------------------------------------------------------- Intel XPU Manager 1.x

def test_xpumanager_1x_flex140(server, mappings, shared_fixtures: Path) -> None:
    url = serve(server, "/xpum", (shared_fixtures / "intel/xpumanager-sample.prom").read_text())
    src = source_for(url, "xpumanager")
    src.open()
    sample = src.poll()
    src.close()
    assert sample.devices == [Device(key="0000:17:00.0", vendor="intel", index="1", mapping="upstream/xpumanager",
                                     uuid="00000000-0000-0000-1ddb-7c1aed80a2fd",
                                     model="Intel(R) Data Center GPU Flex 140", pci_bus_id="0000:17:00.0")]
    # the duplicated decoder series (intel/xpumanager#112) is read once, first value kept
    assert [(r.field, r.value, r.labels) for r in sample.readings] == [
        ('xpum_per_engine_ratio{type="decoder"}', 0.044500000000000005, (("engine_id", "0"), ("src", "direct"))),
        ('xpum_per_engine_ratio{type="encoder"}', 0.044500000000000005, (("engine_id", "0"), ("src", "direct"))),
    ]
    # per-engine-instance ratios have no canonical series (one series per engine class only)
    assert map_source_once(source_for(url, "xpumanager"), mappings=mappings) == {}


XPUM_1X_DEVICE_LEVEL = """\
# Written for this project from the v1.3.7 exporter code (prometheus_exporter.py: labels
# uuid, dev_name, pci_dev, vendor, pci_bdf, dev_file, [sub_dev], src; ratios scaled by 0.01).
# HELP xpum_engine_ratio GPU active time of the elapsed time (in %), per GPU tile
# TYPE xpum_engine_ratio gauge
xpum_engine_ratio{dev_file="card0",dev_name="Intel(R) Data Center GPU Max 1550",pci_bdf="0000:29:00.0",pci_dev="0xbd5",src="avg",uuid="01000000-0000-0000-0000-000000290000",vendor="Intel(R) Corporation"} 0.625
xpum_engine_ratio{dev_file="card0",dev_name="Intel(R) Data Center GPU Max 1550",pci_bdf="0000:29:00.0",pci_dev="0xbd5",src="direct",sub_dev="0",uuid="01000000-0000-0000-0000-000000290000",vendor="Intel(R) Corporation"} 0.5
# TYPE xpum_engine_group_ratio gauge
xpum_engine_group_ratio{dev_file="card0",dev_name="Intel(R) Data Center GPU Max 1550",pci_bdf="0000:29:00.0",pci_dev="0xbd5",src="direct",type="compute",uuid="01000000-0000-0000-0000-000000290000",vendor="Intel(R) Corporation"} 0.75
# TYPE xpum_frequency_mhz gauge
xpum_frequency_mhz{dev_file="card0",dev_name="Intel(R) Data Center GPU Max 1550",location="gpu",pci_bdf="0000:29:00.0",pci_dev="0xbd5",src="direct",type="actual",uuid="01000000-0000-0000-0000-000000290000",vendor="Intel(R) Corporation"} 1600
xpum_frequency_mhz{dev_file="card0",dev_name="Intel(R) Data Center GPU Max 1550",location="gpu",pci_bdf="0000:29:00.0",pci_dev="0xbd5",src="direct",type="request",uuid="01000000-0000-0000-0000-000000290000",vendor="Intel(R) Corporation"} 1500
# TYPE xpum_temperature_celsius gauge
xpum_temperature_celsius{dev_file="card0",dev_name="Intel(R) Data Center GPU Max 1550",location="mem",pci_bdf="0000:29:00.0",pci_dev="0xbd5",src="direct",uuid="01000000-0000-0000-0000-000000290000",vendor="Intel(R) Corporation"} 48
# TYPE xpum_memory_bandwidth_ratio gauge
xpum_memory_bandwidth_ratio{dev_file="card0",dev_name="Intel(R) Data Center GPU Max 1550",pci_bdf="0000:29:00.0",pci_dev="0xbd5",src="avg",uuid="01000000-0000-0000-0000-000000290000",vendor="Intel(R) Corporation"} 0.875
# HELP xpum_energy_joules_total Total GPU energy consumption since boot (in Joules), per GPU
# TYPE xpum_energy_joules_total counter
xpum_energy_joules_total{dev_file="card0",dev_name="Intel(R) Data Center GPU Max 1550",pci_bdf="0000:29:00.0",pci_dev="0xbd5",src="direct",uuid="01000000-0000-0000-0000-000000290000",vendor="Intel(R) Corporation"} 123456.5
xpum_energy_joules_created{dev_file="card0",dev_name="Intel(R) Data Center GPU Max 1550",pci_bdf="0000:29:00.0",pci_dev="0xbd5",src="direct",uuid="01000000-0000-0000-0000-000000290000",vendor="Intel(R) Corporation"} 1.7e9
# TYPE xpum_power_watts gauge
xpum_power_watts{card="2147483649",src="sum"} 700
"""


def test_xpumanager_1x_ratios_are_scaled_and_tiles_ignored(server, mappings) -> None:
    url = serve(server, "/xpum1x", XPUM_1X_DEVICE_LEVEL)
    series = map_source_once(source_for(url, "xpumanager"), mappings=mappings)
    assert device_labels(series) == {(("gpu", "0"), ("uuid", "01000000-0000-0000-0000-000000290000"),
                                      ("vendor", "intel"))}
    assert canon(series) == {
        m("gpu_compute_utilization_percent"): 62.5,               # device-level 0.625; tile 0.5 ignored
        m("gpu_engine_utilization_percent", engine="compute"): 75,
        m("gpu_clock_mhz", domain="graphics"): 1600,              # type="actual" only
        m("gpu_temperature_celsius", sensor="memory"): 48,        # location="mem"
        m("gpu_memory_bandwidth_utilization_percent"): 87.5,
        m("gpu_energy_joules_total"): 123456.5,                   # card-level power: no device
    }


# ---------------------------------------------------------------- Intel XPU Manager 2.x (xpumd)

XPUMD_2X = """\
# Written for this project from the documented layout (no public capture exists): OTel metric
# and attribute names from xpumd/receiver/intelxpu/sysman/metadata.yaml, Prometheus naming as in
# xpumd/charts/xpumd/json/convert-metrics.sh (dots -> underscores, unit suffixes).
# TYPE hw_gpu_info gauge
hw_gpu_info{hw_id="8680e20b-0000-0000-0300-000000000000",hw_name="gpu-1",pci_bdf="0000:03:00.0",hw_model="Intel(R) Arc(TM) B580 Graphics",hw_serial_number="unknown",hw_vendor="Intel(R) Corporation",pci_device_id="e20b",pci_vendor_id="8086"} 1
# TYPE hw_gpu_utilization_ratio gauge
hw_gpu_utilization_ratio{hw_id="8680e20b-0000-0000-0300-000000000000",hw_name="engine-1-all",pci_bdf="0000:03:00.0",hw_gpu_task="all"} 0.125
hw_gpu_utilization_ratio{hw_id="8680e20b-0000-0000-0300-000000000000",hw_name="engine-2-compute-all",pci_bdf="0000:03:00.0",hw_gpu_task="compute-all"} 1
hw_gpu_utilization_ratio{hw_id="8680e20b-0000-0000-0300-000000000000",hw_name="engine-3-copy-all",pci_bdf="0000:03:00.0",hw_gpu_task="copy-all"} 0
hw_gpu_utilization_ratio{hw_id="8680e20b-0000-0000-0300-000000000000",hw_name="engine-4-media-decode-single",pci_bdf="0000:03:00.0",hw_gpu_task="media-decode-single"} 0.25
# TYPE hw_frequency_hertz gauge
hw_frequency_hertz{hw_id="8680e20b-0000-0000-0300-000000000000",hw_name="freq-1",pci_bdf="0000:03:00.0",hw_frequency_domain="gpu",aggregation="min"} 2.4e+09
hw_frequency_hertz{hw_id="8680e20b-0000-0000-0300-000000000000",hw_name="freq-1",pci_bdf="0000:03:00.0",hw_frequency_domain="gpu",aggregation="max"} 2.85e+09
hw_frequency_hertz{hw_id="8680e20b-0000-0000-0300-000000000000",hw_name="freq-1",pci_bdf="0000:03:00.0",hw_frequency_domain="gpu",aggregation="avg"} 2.8e+09
# TYPE hw_frequency_limit_hertz gauge
hw_frequency_limit_hertz{hw_id="8680e20b-0000-0000-0300-000000000000",hw_name="freq-1",pci_bdf="0000:03:00.0",hw_frequency_domain="gpu",hw_limit_type="max"} 2.85e+09
# TYPE hw_temperature_celsius gauge
hw_temperature_celsius{hw_id="8680e20b-0000-0000-0300-000000000000",hw_name="temp-1",pci_bdf="0000:03:00.0",hw_sensor_location="gpu",statistic="max"} 61
hw_temperature_celsius{hw_id="8680e20b-0000-0000-0300-000000000000",hw_name="temp-2",pci_bdf="0000:03:00.0",hw_sensor_location="memory",statistic="max"} 54
# TYPE hw_memory_usage_bytes gauge
hw_memory_usage_bytes{hw_id="8680e20b-0000-0000-0300-000000000000",hw_name="mem-1",pci_bdf="0000:03:00.0",hw_memory_location="device",hw_memory_type="gddr6"} 1.073741824e+09
hw_memory_usage_bytes{hw_id="8680e20b-0000-0000-0300-000000000000",hw_name="mem-2",pci_bdf="0000:03:00.0",hw_memory_location="system",hw_memory_type="ddr"} 5.36870912e+08
# TYPE hw_memory_size_bytes gauge
hw_memory_size_bytes{hw_id="8680e20b-0000-0000-0300-000000000000",hw_name="mem-1",pci_bdf="0000:03:00.0",hw_memory_location="device",hw_memory_type="gddr6"} 1.2884901888e+10
# TYPE hw_memory_bandwidth_utilization_ratio gauge
hw_memory_bandwidth_utilization_ratio{hw_id="8680e20b-0000-0000-0300-000000000000",hw_name="mem-1",pci_bdf="0000:03:00.0",hw_memory_location="device",hw_memory_type="gddr6"} 0.9
# TYPE hw_power_watts gauge
hw_power_watts{hw_id="8680e20b-0000-0000-0300-000000000000",hw_name="power-1",pci_bdf="0000:03:00.0",hw_sensor_location="card"} 151.5
hw_power_watts{hw_id="8680e20b-0000-0000-0300-000000000000",hw_name="power-2",pci_bdf="0000:03:00.0",hw_sensor_location="package"} 120.25
# TYPE hw_energy_joules_total counter
hw_energy_joules_total{hw_id="8680e20b-0000-0000-0300-000000000000",hw_name="power-1",pci_bdf="0000:03:00.0",hw_sensor_location="card"} 98765.25
# TYPE hw_gpu_io_bytes_total counter
hw_gpu_io_bytes_total{hw_id="8680e20b-0000-0000-0300-000000000000",hw_name="gpu-1-pci",pci_bdf="0000:03:00.0",network_io_direction="receive"} 4096
hw_gpu_io_bytes_total{hw_id="8680e20b-0000-0000-0300-000000000000",hw_name="gpu-1-pci",pci_bdf="0000:03:00.0",network_io_direction="transmit"} 2048
"""


def test_xpumd_2x_hw_metrics(server, mappings) -> None:
    url = serve(server, "/xpumd", XPUMD_2X)
    [dev] = devices_of(source_for(url, "xpumanager"))
    assert dev == Device(key="0000:03:00.0", vendor="intel", index="0", mapping="upstream/xpumanager",
                         uuid="8680e20b-0000-0000-0300-000000000000", model="Intel(R) Arc(TM) B580 Graphics",
                         pci_bus_id="0000:03:00.0")
    series = map_source_once(source_for(url, "xpumanager"), mappings=mappings)
    used, size = 1.073741824e9, 1.2884901888e10
    assert canon(series) == {
        m("gpu_compute_utilization_percent"): 12.5,               # hw_gpu_task="all"
        m("gpu_engine_utilization_percent", engine="compute"): 100,
        m("gpu_engine_utilization_percent", engine="copy"): 0,    # media-decode-single: not mapped
        m("gpu_clock_mhz", domain="graphics"): 2800,              # aggregation="avg" only
        m("gpu_clock_max_mhz", domain="graphics"): 2850,
        m("gpu_temperature_celsius", sensor="gpu"): 61,
        m("gpu_temperature_celsius", sensor="memory"): 54,
        m("gpu_memory_used_bytes"): used,                         # device memory, not system
        m("gpu_memory_total_bytes"): size,
        m("gpu_memory_utilization_percent"): round(used / size * 100, 6),
        m("gpu_memory_bandwidth_utilization_percent"): 90,
        m("gpu_power_watts"): 151.5,                              # card preferred over package
        m("gpu_energy_joules_total"): 98765.25,
        m("gpu_pcie_bytes_total", direction="rx"): 4096,
        m("gpu_pcie_bytes_total", direction="tx"): 2048,
    }
