"""Every exporter version users run, served from a local HTTP server, gives the canonical series of
the same GPU served in the oldest supported format (units included).

The dcgm-exporter files in tests/upstream_versions/ are BUILT, not captured: no public scrape of
dcgm-exporter 4.8.3 or later exists; they follow each release's collector CSV, release notes and
the DCGM headers (tests/upstream_versions/SOURCES.md names the source of every name, and which
DCGM 4.7 names are inferred).  The AMD DME files there are built from each tag's GaugeVec names;
the DME 1.4.1 form of the vendor doc sample is derived here (GPU_CLOCK_TYPE_* enum values up to
v1.4.1).  nvidia_gpu_exporter: tests/test_upstream_versions_nge.py.
"""

from __future__ import annotations

import functools
import logging
import re
from pathlib import Path

import pytest

from exporter.sources.context import SourceContext
from exporter.sources.upstream import UpstreamSource
from exporter.testing import load_mappings, map_source_once
from tests.test_upstream_http import ExporterServer, Route
from tests.test_upstream_samples import amd_blocks, canon, m

MiB = 1048576
DATA = Path(__file__).parent / "upstream_versions"
OLDEST = "dcgm-exporter-3.3.prom"
# what the oldest format gives, by hand from its lines (units converted as commented)
H100 = {
    m("gpu_clock_mhz", domain="sm"): 1980,                   # SM_CLOCK 1980 MHz
    m("gpu_clock_mhz", domain="memory"): 2619,
    m("gpu_temperature_celsius", sensor="gpu"): 52,
    m("gpu_temperature_celsius", sensor="memory"): 45,
    m("gpu_power_watts"): 612.5,
    m("gpu_energy_joules_total"): 123456.789,                 # 123456789 mJ
    m("gpu_pcie_replays_total"): 3,
    m("gpu_compute_utilization_percent"): 97,                 # GPU_UTIL 97 %
    m("gpu_memory_bandwidth_utilization_percent"): 71.23,     # DRAM_ACTIVE 0.7123 x 100
    m("gpu_engine_utilization_percent", engine="encoder"): 0,
    m("gpu_engine_utilization_percent", engine="decoder"): 0,
    m("gpu_memory_free_bytes"): 1576 * MiB,
    m("gpu_memory_used_bytes"): 79488 * MiB,
    m("gpu_memory_reserved_bytes"): 495 * MiB,
    m("gpu_memory_remapped_rows", state="uncorrected"): 0,
    m("gpu_memory_remapped_rows", state="corrected"): 2,
    m("gpu_memory_remapped_rows", state="failure"): 0,
    m("gpu_sm_active_percent"): 88,
    m("gpu_compute_occupancy_percent"): 31,
    m("gpu_tensor_utilization_percent"): 43.21,
    m("gpu_profiling_available"): 1,
    # NVLINK_BANDWIDTH_TOTAL 12500 (DCGM: KiB/s / 1000, so x 1024000 B/s), integrated over the
    # 1 s between the two polls from 0
    m("gpu_interconnect_bytes_total", interconnect="nvlink", direction="total"): 12_800_000_000,
}
# 4.9 collects FB_CAPACITY_BYTES by default: the total, and the utilization derived from it
FB_CAPACITY = {m("gpu_memory_total_bytes"): 81559 * MiB,
               m("gpu_memory_utilization_percent"): round(79488 / 81559 * 100, 6)}
GENERATIONS = [  # file, schema recognised, series beyond the oldest format's
    ("dcgm-exporter-3.3.prom", "legacy", {}),
    ("dcgm-exporter-4.8.prom", "legacy", {}),
    ("dcgm-exporter-4.8-dcgm46-names.prom", "dcgm-4.6", {}),
    ("dcgm-exporter-4.9.prom", "dcgm-4.7", FB_CAPACITY),
    ("dcgm-exporter-4.10.prom", "dcgm-4.8", FB_CAPACITY),
]


def source(server: ExporterServer, path: str, body: str, exporter: str = "dcgm-exporter", **extra) -> UpstreamSource:
    """An upstream source with the shipped mapping set, as the daemon builds it (``mappings=``:
    the schemas and the known names come from it)."""
    server.routes[path] = Route(body=body.encode())
    return UpstreamSource(SourceContext(options={"targets": [{"name": "t", "url": server.url(path), "exporter": exporter,
                                                **extra}]}, mappings=_shipped()))


@functools.lru_cache(maxsize=1)
def _shipped():
    return load_mappings()


def mapped(server, mappings, path: str, body: str, **kw) -> dict:
    return canon(map_source_once(source(server, path, body, **kw), mappings=mappings))


def self_samples(src: UpstreamSource) -> dict[str, dict]:
    src.open()
    try:
        sample = src.poll()
    finally:
        src.close()
    return {name: dict(labels) | {"value": value} for name, labels, value in sample.self_samples}


def test_the_oldest_format_gives_the_hand_computed_series(server, mappings) -> None:
    assert mapped(server, mappings, "/oldest", (DATA / OLDEST).read_text()) == H100


@pytest.mark.parametrize(("name", "schema", "extra"), GENERATIONS, ids=[g[0] for g in GENERATIONS])
def test_every_generation_gives_the_series_of_the_oldest(server, mappings, name, schema, extra) -> None:
    oldest = mapped(server, mappings, "/oldest", (DATA / OLDEST).read_text())
    got = mapped(server, mappings, f"/{name}", (DATA / name).read_text())
    assert got == {**oldest, **extra}
    info = self_samples(source(server, f"/{name}", (DATA / name).read_text()))
    assert info["upstream_schema_info"] == {"target": "t", "exporter": "dcgm-exporter", "schema": schema,
                                            "value": 1.0}
    assert info["upstream_unknown_fields"]["value"] == 0   # every name of the release is known


def test_a_4_9_ratio_is_not_read_as_a_percent(server, mappings) -> None:
    """The headline bug: DCGM_FI_DEV_GPU_UTIL_RATIO 0.97 from 4.9 was exported as 0.97 %."""
    text = (DATA / "dcgm-exporter-4.9.prom").read_text()
    assert re.search(r"^DCGM_FI_DEV_GPU_UTIL_RATIO\{.*\} 0\.97$", text, re.MULTILINE)
    got = mapped(server, mappings, "/ratio", text)
    assert got[m("gpu_compute_utilization_percent")] == 97
    # and the same name from a DCGM 4.6 custom CSV (4.8.3/4.8.4) is field 203 in percent
    text46 = (DATA / "dcgm-exporter-4.8-dcgm46-names.prom").read_text()
    assert re.search(r"^DCGM_FI_DEV_GPU_UTIL_RATIO\{.*\} 97$", text46, re.MULTILINE)
    assert mapped(server, mappings, "/ratio46", text46)[m("gpu_compute_utilization_percent")] == 97


def test_a_ratio_above_one_is_not_a_value(server, mappings) -> None:
    """A 4.9 target (driver label renamed) serving a percent under the ratio name: 9700 % is
    malformed, skipped, never exported; the next rule of the series (GR_ENGINE_UTIL_RATIO
    0.955) gives the value."""
    text = (DATA / "dcgm-exporter-4.9.prom").read_text().replace("} 0.97\n", "} 97\n")
    got = mapped(server, mappings, "/ratio-bad", text)
    assert got[m("gpu_compute_utilization_percent")] == 95.5


def test_a_renamed_field_is_counted_and_logged(server, caplog) -> None:
    text = (DATA / "dcgm-exporter-4.9.prom").read_text()
    text = text.replace("DCGM_FI_DEV_GPU_TEMP_CELSIUS", "DCGM_FI_DEV_GPU_TEMPERATURE_CELSIUS")
    text += ('DCGM_FI_DEV_NEW_FIELD{gpu="0",UUID="GPU-5b7c3a2e-9d41-4f6a-b8e2-1c0d9e8f7a65",'
             'pci_bus_id="00000000:1B:00.0",hostname="node-a"} 1\n')
    with caplog.at_level(logging.INFO, logger="exporter.sources.upstream"):
        info = self_samples(source(server, "/renamed", text))
    assert info["upstream_unknown_fields"] == {"target": "t", "exporter": "dcgm-exporter", "value": 2.0}
    assert "DCGM_FI_DEV_GPU_TEMPERATURE_CELSIUS, DCGM_FI_DEV_NEW_FIELD" in caplog.text


def test_amd_dme_clock_types_before_and_after_1_4_2(server, mappings, shared_fixtures: Path) -> None:
    """v1.4.2 normalized clock_type ("system"); up to v1.4.1 it is the enum name
    ("GPU_CLOCK_TYPE_SYSTEM"): the vendor doc's sample in both spellings gives the same series,
    every one of them (three GPUs, device labels kept), min/max clocks aside (v1.4.2+ only)."""
    new = amd_blocks(shared_fixtures)[5]
    assert 'clock_type="system"' in new
    old = re.sub(r'clock_type="([a-z]+)"', lambda mt: f'clock_type="GPU_CLOCK_TYPE_{mt[1].upper()}"', new)
    old = "\n".join(ln for ln in old.splitlines() if not ln.startswith(("gpu_min_clock", "gpu_max_clock")))
    dme = "amd-device-metrics-exporter"
    got_new = map_source_once(source(server, "/dme142", new, exporter=dme), mappings=mappings)
    got_old = map_source_once(source(server, "/dme141", old, exporter=dme), mappings=mappings)
    clocks = [k for k in got_new if k[0] == "gpu_clock_mhz"]
    assert len(clocks) == 5 and any(k[0] == "gpu_interconnect_bytes_total" for k in got_new)
    assert got_old == {k: v for k, v in got_new.items() if k[0] not in ("gpu_clock_min_mhz", "gpu_clock_max_mhz")}
    assert self_samples(source(server, "/dme141", old, exporter=dme))["upstream_schema_info"]["schema"] != "dme-1.4.2"
    assert self_samples(source(server, "/dme142", new, exporter=dme))["upstream_schema_info"]["schema"] == "dme-1.4.2"


# one MI300X OAM in the oldest DME format tested (v1.3.1: xgmi_neighbor_*, clock_type enum names),
# by hand from tests/upstream_versions/dme-1.3.1.prom (units converted as commented)
MI300X = {
    m("gpu_compute_utilization_percent"): 87,                # gpu_gfx_activity
    m("gpu_memory_bandwidth_utilization_percent"): 41,       # gpu_umc_activity
    m("gpu_temperature_celsius", sensor="junction"): 71,
    m("gpu_temperature_celsius", sensor="memory"): 63,       # edge 0: no sensor on MI3xx, absent
    m("gpu_power_watts"): 642,
    m("gpu_energy_joules_total"): 8123456.789,               # 8.123456789e12 uJ
    m("gpu_memory_used_bytes"): 150000 * MiB,                # VRAM in MB (MiB as amdsmi computes it)
    m("gpu_memory_free_bytes"): 46256 * MiB,
    m("gpu_memory_total_bytes"): 196256 * MiB,
    m("gpu_memory_utilization_percent"): round(150000 / 196256 * 100, 6),
    m("gpu_memory_visible_used_bytes"): 150000 * MiB,
    m("gpu_memory_visible_total_bytes"): 196256 * MiB,
    m("gpu_memory_gtt_used_bytes"): 12 * MiB,
    m("gpu_memory_gtt_total_bytes"): 257000 * MiB,
    m("gpu_pcie_link_speed_gts"): 32,
    m("gpu_pcie_link_max_speed_gts"): 32,
    m("gpu_pcie_replays_total"): 4,
    m("gpu_ecc_errors_total", severity="corrected"): 7,
    m("gpu_ecc_errors_total", severity="uncorrected"): 0,
    m("gpu_interconnect_bytes_total", interconnect="xgmi", direction="rx", link="1"): 2776148269 * 1024,  # KB
    m("gpu_interconnect_bytes_total", interconnect="xgmi", direction="tx", link="1"): 3539423344 * 1024,
    m("gpu_compute_occupancy_percent"): 38.5,                # gpu_prof_occupancy_percent
    m("gpu_tensor_utilization_percent"): 22.25,
    m("gpu_profiling_available"): 1,
    m("gpu_clock_mhz", domain="graphics"): 2100,             # clock_type GPU_CLOCK_TYPE_SYSTEM
    m("gpu_clock_mhz", domain="memory"): 1300,
    m("gpu_clock_mhz", domain="video"): 1523,
    m("gpu_clock_mhz", domain="soc"): 1143,
    m("gpu_clock_mhz", domain="fabric"): 1400,               # clock_type data (fclk)
}
# v1.4.2+ also serves the clock limits
MI300X_LIMITS = {
    **{m("gpu_clock_min_mhz", domain=d): v for d, v in
       (("graphics", 100), ("memory", 900), ("video", 100), ("soc", 100), ("fabric", 100))},
    **{m("gpu_clock_max_mhz", domain=d): v for d, v in
       (("graphics", 2100), ("memory", 1300), ("video", 1523), ("soc", 1143), ("fabric", 1400))},
}
DME_GENERATIONS = [  # file, schema recognised, series beyond the oldest format's
    ("dme-1.3.1.prom", "dme-1.0", {}),
    ("dme-1.4.1.prom", "dme-1.4", {}),
    ("dme-1.4.2.prom", "dme-1.4.2", MI300X_LIMITS),
]


@pytest.mark.parametrize(("name", "schema", "extra"), DME_GENERATIONS, ids=[g[0] for g in DME_GENERATIONS])
def test_every_dme_release_gives_the_series_of_the_oldest(server, mappings, name, schema, extra) -> None:
    """v1.3.1 (xgmi_neighbor_*), v1.4.0/1.4.1 (gpu_xgmi_nbr_*, *_processor_hot_*,
    pcie_bidirectional_bandwidth; clock_type enum names) and v1.4.2+ (normalized clock_type,
    gpu_min/max_clock): every canonical value equal; the generation recognised; no unknown name."""
    dme = "amd-device-metrics-exporter"
    body = (DATA / name).read_text()
    assert mapped(server, mappings, f"/{name}", body, exporter=dme) == {**MI300X, **extra}
    info = self_samples(source(server, f"/{name}", body, exporter=dme))
    assert info["upstream_schema_info"]["schema"] == schema
    assert info["upstream_unknown_fields"]["value"] == 0


def test_amd_dme_clock_sentinel_is_not_a_value(server, mappings) -> None:
    """A partitioned GPU without clock info reports gpu_clock 4294967295 (math.MaxUint32)."""
    body = ('gpu_clock{clock_index="0",clock_type="system",gpu_id="1",serial_number="S1"} 4294967295\n'
            'gpu_gfx_activity{gpu_id="1",serial_number="S1"} 5\n')
    got = mapped(server, mappings, "/dme-sentinel", body, exporter="amd-device-metrics-exporter")
    assert got == {m("gpu_compute_utilization_percent"): 5}


# the B580 of test_upstream_samples.XPUMD_2X, as XPU Manager 1.x serves the same values (names and
# 0-1 ratios from prometheus_exporter_types.py / convert-metrics.sh; built, not captured)
_X1 = ('dev_file="card0",dev_name="Intel(R) Arc(TM) B580 Graphics",pci_bdf="0000:03:00.0",pci_dev="0xe20b",'
       'uuid="8680e20b-0000-0000-0300-000000000000",vendor="Intel(R) Corporation"')
XPUM_1X_B580 = f"""\
xpum_engine_ratio{{{_X1},src="avg"}} 0.125
xpum_engine_group_ratio{{{_X1},src="direct",type="compute"}} 1
xpum_engine_group_ratio{{{_X1},src="direct",type="copy"}} 0
xpum_frequency_mhz{{{_X1},location="gpu",src="direct",type="actual"}} 2800
xpum_temperature_celsius{{{_X1},location="gpu",src="direct"}} 61
xpum_temperature_celsius{{{_X1},location="mem",src="direct"}} 54
xpum_memory_used_bytes{{{_X1},src="direct"}} 1073741824
xpum_memory_bandwidth_ratio{{{_X1},src="avg"}} 0.9
xpum_power_watts{{{_X1},src="direct"}} 151.5
# TYPE xpum_energy_joules_total counter
xpum_energy_joules_total{{{_X1},src="direct"}} 98765.25
# TYPE xpum_pcie_read_bytes_total counter
xpum_pcie_read_bytes_total{{{_X1},src="direct"}} 4096
# TYPE xpum_pcie_write_bytes_total counter
xpum_pcie_write_bytes_total{{{_X1},src="direct"}} 2048
"""


def test_xpu_manager_2x_gives_the_series_of_1x(server, mappings) -> None:
    from tests.test_upstream_samples import XPUMD_2X
    v1 = mapped(server, mappings, "/xpum1", XPUM_1X_B580, exporter="xpumanager")
    v2 = mapped(server, mappings, "/xpum2", XPUMD_2X, exporter="xpumanager")
    # 2.x also reports the frequency limit and the memory size (1.x has neither)
    extra = {m("gpu_clock_max_mhz", domain="graphics"), m("gpu_memory_total_bytes"),
             m("gpu_memory_utilization_percent")}
    assert set(v2) - set(v1) == extra
    assert {k: v for k, v in v2.items() if k not in extra} == v1
    assert v1[m("gpu_clock_mhz", domain="graphics")] == 2800 and v1[m("gpu_compute_utilization_percent")] == 12.5
    schemas = {name: self_samples(source(server, path, body, exporter="xpumanager"))["upstream_schema_info"]["schema"]
               for name, path, body in (("1", "/xpum1", XPUM_1X_B580), ("2", "/xpum2", XPUMD_2X))}
    assert schemas == {"1": "xpum-1.x", "2": "xpumd-2.x"}


def test_without_a_mapping_set_no_schema_is_claimed(server) -> None:
    """A bare source (no ``mappings=``) recognises nothing and counts nothing as unknown."""
    server.routes["/bare"] = Route(body=(DATA / "dcgm-exporter-4.9.prom").read_text().encode())
    src = UpstreamSource(SourceContext(options={"targets": [{"name": "t", "url": server.url("/bare"), "exporter": "dcgm-exporter"}]}))
    assert self_samples(src) == {}


def test_amd_dme_current_names_give_the_series_of_v1_0(server, mappings, shared_fixtures: Path) -> None:
    """The v1.0 sample (gpu_usage, gpu_total_memory, upper-case GPU_UUID/SERIAL_NUMBER) and the same
    GPU in today's names and labels (gpu_gfx_activity, gpu_total_vram, gpu_id/gpu_uuid/serial_number)."""
    old = (shared_fixtures / "amd/amd-device-metrics-exporter-v1.0-mini.prom").read_text()
    new = (old.replace("gpu_usage", "gpu_gfx_activity").replace("gpu_total_memory", "gpu_total_vram")
           .replace('GPU_UUID="', 'gpu_id="0",gpu_uuid="').replace("SERIAL_NUMBER", "serial_number"))
    v10 = mapped(server, mappings, "/dme10", old, exporter="amd-device-metrics-exporter")
    now = mapped(server, mappings, "/dme15", new, exporter="amd-device-metrics-exporter")
    assert v10 == now == {m("gpu_power_watts"): 41, m("gpu_compute_utilization_percent"): 0,
                          m("gpu_memory_total_bytes"): 68702 * MiB}
    assert self_samples(source(server, "/dme10", old, exporter="amd-device-metrics-exporter"))[
        "upstream_schema_info"]["schema"] == "dme-1.0"
