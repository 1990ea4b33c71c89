"""amdgpu sysfs source: real card dumps, an MI300X-class node, failing reads, pcie_bw thread."""

from __future__ import annotations

import errno
import os
import threading
import time

import pytest

from exporter.sources.amdgpu_sysfs import (
    AmdgpuSysfsSource,
    default_reader,
    parse_dpm,
    parse_link_speed,
    parse_pcie_bw,
)
from exporter.sources.base import SourceUnavailable
from exporter.sources.context import SourceContext
from exporter.testing import map_source_once, shipped_context, values_of
from tests.amd_fixture_tree import (
    MI300X_CARDS,
    MI300X_VRAM,
    REAL_CARDS,
    add_card,
    arrange_mi300x_node,
    arrange_real_card,
    failing_reader,
    mi300x_pci,
)

# ------------------------------------------------------------------------------------------------
# pure parsers


@pytest.mark.parametrize("text, expected", [
    ("0: 300Mhz \n1: 600Mhz \n2: 900Mhz *\n3: 1145Mhz \n", (900.0, 1145.0)),   # old ASIC, trailing spaces
    ("0: 500Mhz *\n1: 2660Mhz \n", (500.0, 2660.0)),
    ("0: 500Mhz\n1: 0Mhz *\n2: 2124Mhz\n", (0.0, 2124.0)),                     # RDNA3: middle line = current
    ("0: 500Mhz\n1: 1000Mhz *\n2: 2124Mhz\n", (1000.0, 2124.0)),
    ("S: 19Mhz *\n0: 500Mhz\n1: 2100Mhz\n", (19.0, 2100.0)),                   # deep sleep: not a level for max
    ("0: 0Mhz *\n1: 0Mhz *\n", (0.0, 0.0)),                                    # two marks: first wins
    ("0: 96Mhz *\n1: 456Mhz \n2: 772Mhz \n3: 1218MHz \n", (96.0, 1218.0)),
    ("0: 500Mhz\n1: 2100Mhz\n", (None, 2100.0)),
    ("garbage", (None, None)),
])
def test_parse_dpm(text, expected):
    assert parse_dpm(text) == expected


def test_parse_link_speed_and_pcie_bw():
    assert parse_link_speed("16.0 GT/s PCIe") == 16.0
    assert parse_link_speed("2.5 GT/s PCIe") == 2.5
    assert parse_link_speed("Unknown") is None
    assert parse_pcie_bw("6641 815 256") == (6641, 815, 256)
    assert parse_pcie_bw("") is None
    assert parse_pcie_bw("1 2") is None
    assert parse_pcie_bw("a b c") is None


# ------------------------------------------------------------------------------------------------
# real card dumps (amdgpu-sysfs-rs), arranged as card0..card3

PCI = {"vega56": "0000:0b:00.0", "rx580": "0000:09:00.0", "rx6900xt": "0000:0c:00.0", "rx7800xt": "0000:2f:00.0"}

# hand-written from the files in ../shared/fixtures/amd/sysfs-amdgpu-sysfs-rs/<card>/
EXPECTED_RAW = {
    "vega56": {
        "gpu_busy_percent": 0, "mem_info_vram_used": 16613376, "mem_info_vram_total": 8573157376,
        "mem_info_vis_vram_used": 16613376, "mem_info_vis_vram_total": 268435456,
        "mem_info_gtt_used": 12337152, "mem_info_gtt_total": 8342863872, "current_link_speed": 8.0,
        "current_link_width": 16, "max_link_speed": 8.0, "pcie_replay_count": 0,
        "pp_dpm_sclk": 852, "pp_dpm_sclk.max": 1590, "pp_dpm_mclk": 167, "pp_dpm_mclk.max": 920,
        "pp_dpm_socclk": 600, "pp_dpm_socclk.max": 1107,
        "hwmon.temp.edge": 38000, "hwmon.temp.junction": 38000, "hwmon.temp.mem": 39000,
        "hwmon.power1_average": 8000000, "hwmon.power1_cap": 260000000, "hwmon.power1_cap_max": 390000000,
        "hwmon.fan1_input": 5, "hwmon.pwm1": 0, "hwmon.in.vddgfx": 762,
        "hwmon.freq.sclk": 26000000, "hwmon.freq.mclk": 167000000,
    },
    "rx580": {
        "gpu_busy_percent": 11, "mem_busy_percent": 2, "mem_info_vram_used": 536870912,
        "mem_info_vram_total": 4294967296, "mem_info_vis_vram_used": 150302720,
        "mem_info_gtt_used": 92377088, "mem_info_gtt_total": 8342712320, "current_link_speed": 8.0,
        "pcie_replay_count": 3, "pp_dpm_sclk": 900, "pp_dpm_sclk.max": 1366, "pp_dpm_mclk": 1750,
        "hwmon.temp.edge": 44000, "hwmon.power1_average": 41045000, "hwmon.power1_cap": 155000000,
        "hwmon.fan1_input": 595, "hwmon.pwm1": 35, "hwmon.in.vddgfx": 975,
    },
    "rx6900xt": {
        "gpu_busy_percent": 3, "mem_busy_percent": 0, "mem_info_vram_used": 668274688,
        "mem_info_vram_total": 17163091968, "mem_info_gtt_total": 16786171904, "current_link_speed": 16.0,
        "pp_dpm_sclk": 500, "pp_dpm_sclk.max": 2660, "pp_dpm_mclk": 1000, "pp_dpm_fclk": 1302,
        "pp_dpm_fclk.max": 1941, "pp_dpm_socclk": 800, "hwmon.temp.edge": 56000,
        "hwmon.temp.junction": 59000, "hwmon.temp.mem": 54000, "hwmon.power1_average": 36000000,
        "hwmon.power1_cap_max": 332000000, "hwmon.in.vddgfx": 775,
        # from gpu_metrics_v1_3_rx6900xt_navi21.bin, placed as the card's gpu_metrics file
        "gpu_metrics.temperature_hotspot": 59, "gpu_metrics.average_gfx_activity": 3,
        "gpu_metrics.average_socket_power": 36, "gpu_metrics.current_gfxclk": 500,
        "gpu_metrics.voltage_soc": 818, "gpu_metrics.indep_throttle_status.class_power": 0,
    },
    "rx7800xt": {
        "gpu_busy_percent": 0, "current_link_speed": 16.0, "current_link_width": 16,
        "pp_dpm_sclk": 0, "pp_dpm_sclk.max": 2124, "pp_dpm_mclk": 96, "pp_dpm_mclk.max": 1218,
        "pp_dpm_socclk": 750, "pp_dpm_socclk.max": 1500, "hwmon.temp.edge": 37000,
        "hwmon.temp.junction": 43000, "hwmon.temp.mem": 56000, "hwmon.power1_average": 10000000,
        "hwmon.power1_cap": 222000000, "hwmon.power1_cap_max": 243000000, "hwmon.in.vddgfx": 64,
    },
}
ABSENT_RAW = {
    "vega56": {"mem_busy_percent", "gpu_metrics.average_gfx_activity"},
    "rx580": {"hwmon.temp.junction", "hwmon.temp.mem"},
    "rx6900xt": {"gpu_metrics.average_socclk_frequency", "gpu_metrics.temperature_hbm"},
    "rx7800xt": {"mem_info_vram_used", "mem_busy_percent", "hwmon.power1_input"},
}


@pytest.fixture
def real_node(tmp_path, shared_fixtures):
    metrics = (shared_fixtures / "amd" / "gpu_metrics_v1_3_rx6900xt_navi21.bin").read_bytes()
    for number, name in enumerate(REAL_CARDS):
        arrange_real_card(tmp_path, shared_fixtures, name, number, metrics if name == "rx6900xt" else None)
    return tmp_path


def _by_device(sample):
    out: dict[str, dict[str, float]] = {}
    for r in sample.readings:
        if not r.labels:
            out.setdefault(r.device, {})[r.field] = r.value
    return out


def test_real_cards_raw_readings_and_identity(real_node):
    src = AmdgpuSysfsSource(SourceContext(sysfs=real_node, options={"pcie_bw": False}))
    src.open()
    try:
        sample = src.poll()
    finally:
        src.close()
    devices = {d.key: d for d in sample.devices}
    assert set(devices) == set(PCI.values())
    assert [d.index for d in sample.devices] == ["0", "1", "2", "3"]
    assert devices["0000:0c:00.0"].uuid == "946d7e1ef9b172dd"          # unique_id
    assert devices["0000:0b:00.0"].uuid == "pci-0000:0b:00.0"          # no unique_id on Vega10 dump
    assert devices["0000:09:00.0"].model == "AMD GPU 1002:67DF"
    got = _by_device(sample)
    for card, expected in EXPECTED_RAW.items():
        readings = got[PCI[card]]
        for field, value in expected.items():
            assert readings.get(field) == value, (card, field)
        assert not (ABSENT_RAW[card] & set(readings)), card
    assert sample.errors == {}


def test_real_cards_canonical_values(real_node):
    series = map_source_once(AmdgpuSysfsSource(SourceContext(sysfs=real_node, options={"pcie_bw": False})))

    def one(metric, gpu, **labels):
        vals = values_of(series, metric, gpu=gpu, vendor="amd", **labels)
        assert len(vals) == 1, (metric, gpu, labels, vals)
        return vals[0]

    def none(metric, gpu, **labels):
        assert values_of(series, metric, gpu=gpu, **labels) == [], (metric, gpu, labels)

    # vega56 (card0)
    assert one("gpu_compute_utilization_percent", "0") == 0
    none("gpu_memory_bandwidth_utilization_percent", "0")         # no mem_busy_percent, no gpu_metrics
    assert one("gpu_power_watts", "0") == pytest.approx(8.0)
    assert one("gpu_temperature_celsius", "0", sensor="junction") == pytest.approx(38.0)
    assert one("gpu_temperature_celsius", "0", sensor="memory") == pytest.approx(39.0)
    assert one("gpu_clock_mhz", "0", domain="graphics") == 852
    assert one("gpu_clock_max_mhz", "0", domain="graphics") == 1590
    assert one("gpu_clock_mhz", "0", domain="memory") == 167
    assert one("gpu_power_limit_watts", "0") == pytest.approx(260.0)
    assert one("gpu_power_limit_max_watts", "0") == pytest.approx(390.0)
    assert one("gpu_memory_used_bytes", "0") == 16613376
    assert one("gpu_memory_utilization_percent", "0") == pytest.approx(100 * 16613376 / 8573157376)
    assert one("gpu_voltage_volts", "0", rail="vddgfx") == pytest.approx(0.762)
    # rx580 (card1)
    assert one("gpu_compute_utilization_percent", "1") == 11
    assert one("gpu_memory_bandwidth_utilization_percent", "1") == 2
    assert one("gpu_power_watts", "1") == pytest.approx(41.045)
    assert one("gpu_temperature_celsius", "1", sensor="edge") == pytest.approx(44.0)
    none("gpu_temperature_celsius", "1", sensor="junction")
    assert one("gpu_fan_speed_rpm", "1") == 595
    assert one("gpu_fan_speed_percent", "1") == pytest.approx(35 * 100 / 255)
    assert one("gpu_pcie_replays_total", "1") == 3
    assert one("gpu_pcie_link_speed_gts", "1") == 8.0
    assert one("gpu_clock_mhz", "1", domain="memory") == 1750
    # rx6900xt (card2) with its real gpu_metrics table
    assert one("gpu_compute_utilization_percent", "2") == 3          # gpu_busy_percent preferred
    assert one("gpu_temperature_celsius", "2", sensor="junction") == pytest.approx(59.0)
    assert one("gpu_voltage_volts", "2", rail="vddsoc") == pytest.approx(0.818)   # gpu_metrics only
    assert one("gpu_voltage_volts", "2", rail="vddmem") == pytest.approx(1.356)
    assert one("gpu_clock_mhz", "2", domain="fabric") == 1302
    for reason in ("power_cap", "current", "thermal", "prochot", "other"):
        assert one("gpu_throttle_active", "2", reason=reason) == 0
    assert one("gpu_memory_gtt_used_bytes", "2") == 62369792
    # rx7800xt (card3): RDNA3 dpm format, no mem_info files in the dump
    assert one("gpu_clock_mhz", "3", domain="graphics") == 0
    assert one("gpu_clock_max_mhz", "3", domain="graphics") == 2124
    assert one("gpu_power_watts", "3") == pytest.approx(10.0)
    assert one("gpu_temperature_celsius", "3", sensor="memory") == pytest.approx(56.0)
    none("gpu_memory_used_bytes", "3")
    none("gpu_throttle_active", "3")
    # the uuid label carries unique_id where the ASIC has one
    assert values_of(series, "gpu_power_watts", gpu="2", uuid="946d7e1ef9b172dd") == [pytest.approx(36.0)]


def test_invalid_gpu_metrics_is_counted_and_the_rest_of_the_card_survives(tmp_path, shared_fixtures):
    bad = (shared_fixtures / "amd" / "gpu_metrics_invalid_mangohud.bin").read_bytes()
    arrange_real_card(tmp_path, shared_fixtures, "rx6900xt", 0, bad)
    src = AmdgpuSysfsSource(SourceContext(sysfs=tmp_path, options={"pcie_bw": False}))
    src.open()
    sample = src.poll()
    src.close()
    assert sample.errors == {"parse_error": 1}
    raw = _by_device(sample)["0000:0c:00.0"]
    assert raw["gpu_busy_percent"] == 3 and raw["hwmon.temp.junction"] == 59000
    assert not any(f.startswith("gpu_metrics.") for f in raw)


# ------------------------------------------------------------------------------------------------
# project-owned fixtures: an MI300X-class node with card0..7 + card10, card11, v1_5 tables


def test_mi300x_node_discovers_card10_and_maps_v1_5_tables(tmp_path):
    arrange_mi300x_node(tmp_path)
    os.makedirs(tmp_path / "class" / "drm" / "card0-DP-1")          # connector: not a card
    add_card(tmp_path, 12, "0000:99:00.0", {"uevent": "DRIVER=i915\nPCI_SLOT_NAME=0000:99:00.0\n",
                                             "gpu_busy_percent": "7\n"})  # another driver
    src = AmdgpuSysfsSource(SourceContext(sysfs=tmp_path, options={"pcie_bw": False}))
    series = map_source_once(src)
    assert sorted(int(d.index) for d in src.devices) == list(MI300X_CARDS)
    for i, number in enumerate(MI300X_CARDS):
        gpu = str(number)
        uuid = f"{0x1122334455660000 + i:016x}"

        def one(metric, gpu=gpu, uuid=uuid, **labels):
            vals = values_of(series, metric, gpu=gpu, uuid=uuid, **labels)
            assert len(vals) == 1, (metric, gpu, labels, vals)
            return vals[0]

        assert one("gpu_compute_utilization_percent") == 50 + i
        assert one("gpu_memory_bandwidth_utilization_percent") == 80 + i
        assert one("gpu_power_watts") == pytest.approx(300 + i)              # hwmon power1_input
        assert one("gpu_temperature_celsius", sensor="junction") == pytest.approx(40 + i)
        assert one("gpu_memory_total_bytes") == MI300X_VRAM
        assert one("gpu_memory_used_bytes") == (i + 1) * 1024 ** 3
        assert one("gpu_clock_mhz", domain="graphics") == 2100
        assert one("gpu_clock_mhz", domain="soc") == 1143                  # gpu_metrics current_socclk[0]
        assert one("gpu_clock_max_mhz", domain="graphics") == 2100         # S: level excluded
        assert one("gpu_pcie_link_speed_gts") == 32.0
        assert one("gpu_energy_joules_total") == pytest.approx(1000 + i)  # 65536 counts = 1 J
        assert one("gpu_pcie_replays_total") == i                          # gpu_metrics pcie_replay_count_acc
        for link in range(7):
            assert one("gpu_interconnect_bytes_total", interconnect="xgmi", direction="rx",
                       link=str(link)) == (1000 * (i + 1) + link) * 1024
            assert one("gpu_interconnect_bytes_total", interconnect="xgmi", direction="tx",
                       link=str(link)) == (2000 * (i + 1) + link) * 1024
        assert values_of(series, "gpu_interconnect_bytes_total", gpu=gpu, link="7") == []  # all-ones
    assert values_of(series, "gpu_compute_utilization_percent", gpu="12") == []


def test_gpu_busy_percent_eopnotsupp_is_counted_not_zero(tmp_path):
    devs = arrange_mi300x_node(tmp_path, cards=(0, 10))
    reader = failing_reader({devs[10] / "gpu_busy_percent": errno.EOPNOTSUPP})
    src = AmdgpuSysfsSource(SourceContext(sysfs=tmp_path, options={"pcie_bw": False}), reader=reader)
    src.open()
    sample = src.poll()
    src.close()
    assert sample.errors == {"not_supported": 1}
    raw = _by_device(sample)
    assert "gpu_busy_percent" not in raw[mi300x_pci(1)]
    assert raw[mi300x_pci(1)]["mem_busy_percent"] == 81
    assert raw[mi300x_pci(0)]["gpu_busy_percent"] == 50
    # canonical: utilization falls back to gpu_metrics average_gfx_activity (51 in card10's table)
    series = map_source_once(AmdgpuSysfsSource(SourceContext(sysfs=tmp_path, options={"pcie_bw": False}), reader=reader))
    assert values_of(series, "gpu_compute_utilization_percent", gpu="10") == [51]


def test_unreadable_file_as_directory_is_a_read_error(tmp_path):
    devs = arrange_mi300x_node(tmp_path, cards=(0,))
    (devs[0] / "gpu_busy_percent").unlink()
    (devs[0] / "gpu_busy_percent").mkdir()            # open() fails with EISDIR, even as root
    src = AmdgpuSysfsSource(SourceContext(sysfs=tmp_path, options={"pcie_bw": False}))
    src.open()
    sample = src.poll()
    src.close()
    assert sample.errors == {"read_error": 1}
    assert "gpu_busy_percent" not in _by_device(sample)[mi300x_pci(0)]


def test_no_cards_is_unavailable_and_lost_card_is_reported(tmp_path):
    with pytest.raises(SourceUnavailable, match="no amdgpu cards"):
        AmdgpuSysfsSource(SourceContext(sysfs=tmp_path)).open()
    devs = arrange_mi300x_node(tmp_path, cards=(0, 1))
    src = AmdgpuSysfsSource(SourceContext(sysfs=tmp_path, options={"pcie_bw": False}))
    src.open()
    os.rename(devs[1], devs[1].with_name("gone"))
    sample = src.poll()
    src.close()
    assert sample.device_up == {mi300x_pci(0): True, mi300x_pci(1): False}
    assert sample.errors == {"device_lost": 1}


# ------------------------------------------------------------------------------------------------
# pcie_bw: read in a background thread only, integrated into byte counters


def test_pcie_bw_is_read_off_the_poll_thread_and_integrated(tmp_path, shared_fixtures):
    arrange_real_card(tmp_path, shared_fixtures, "rx580", 0)          # pcie_bw "11886 2528 256"
    poll_thread_reads: list[str] = []
    bw_reads = threading.Semaphore(0)
    clock_values = iter([100.0, 102.0, 104.0] + [104.0] * 1000)
    gate = threading.Event()

    calls = []

    def reader(path):
        if path.name == "pcie_bw":
            calls.append(1)
            bw_reads.release()
            if len(calls) >= 3:  # two samples are integrated once the third read starts
                gate.wait(5)
        elif threading.current_thread() is threading.main_thread():
            poll_thread_reads.append(path.name)
        return default_reader(path)

    src = AmdgpuSysfsSource(SourceContext(sysfs=tmp_path, options={"pcie_bw_interval": 0.01}), reader=reader, clock=lambda: next(clock_values))
    src.open()
    try:
        assert src.pcie_bw_ready(5)
        for _ in range(3):
            assert bw_reads.acquire(timeout=5)
        sample = src.poll()
    finally:
        gate.set()
        src.close()
    assert "pcie_bw" not in poll_thread_reads and "gpu_busy_percent" in poll_thread_reads
    raw = _by_device(sample)["0000:09:00.0"]
    assert (raw["pcie_bw.received"], raw["pcie_bw.sent"], raw["pcie_bw.max_payload_size"]) == (11886, 2528, 256)
    # first sample covers 1 s, the second 2 s of clock: (1 + 2) x messages x 256 bytes
    assert raw["pcie_bw.received_bytes"] == 3 * 11886 * 256
    assert raw["pcie_bw.sent_bytes"] == 3 * 2528 * 256


def test_pcie_bw_empty_file_is_malformed_and_apu_enodata_stops_the_thread(tmp_path, shared_fixtures):
    arrange_real_card(tmp_path, shared_fixtures, "rx6900xt", 0)       # pcie_bw is empty in the dump
    devs = arrange_mi300x_node(tmp_path / "apu", cards=(1,))
    (devs[1] / "pcie_bw").write_text("")
    calls = []

    def reader(path):
        if path.name == "pcie_bw" and "apu" in str(path):
            calls.append(1)
            raise OSError(errno.ENODATA, "No data available")
        return default_reader(path)

    src = AmdgpuSysfsSource(SourceContext(sysfs=tmp_path, options={"pcie_bw_interval": 0.01}), reader=reader)
    src.open()
    assert src.pcie_bw_ready(5)
    sample = src.poll()
    src.close()
    assert sample.errors["malformed_value"] >= 1
    assert not any(r.field.startswith("pcie_bw") for r in sample.readings)
    apu = AmdgpuSysfsSource(SourceContext(sysfs=tmp_path / "apu", options={"pcie_bw_interval": 0.01}), reader=reader)
    apu.open()
    assert apu.pcie_bw_ready(5)
    first = apu.poll()
    apu.close()
    assert first.errors == {"not_supported": 1} and calls == [1]


def test_poll_fast_reads_the_busy_files_only_where_both_are_there(tmp_path):
    arrange_mi300x_node(tmp_path)
    src = AmdgpuSysfsSource(shipped_context(sysfs=tmp_path, options={"pcie_bw": False}))
    src.open()
    try:
        fast = src.poll_fast()
    finally:
        src.close()
    fields = {r.field for r in fast.readings}
    # both busy files on every card: they win over the table's averages, which is not read
    # (test_fast_poll_reads_the_table_only_where_a_busy_file_gives_nothing covers the fallback)
    assert fields == {"gpu_busy_percent", "mem_busy_percent"}
    assert sorted(int(d.index) for d in fast.devices) == list(MI300X_CARDS)


# ------------------------------------------------------------------------------------------------
# kept-open attribute files (keep_open: always here; auto keeps them only on a sysfs mount)


def test_kept_open_files_read_fresh_values_and_survive_unplug_and_replug(tmp_path):
    devs = arrange_mi300x_node(tmp_path, cards=(0, 1))
    src = AmdgpuSysfsSource(SourceContext(sysfs=tmp_path, options={"pcie_bw": False, "keep_open": "always"}))
    src.open()
    try:
        first = src.poll()
        kept = src._kept  # noqa: SLF001
        assert kept is not None and len(kept.fds) > 20
        plain = AmdgpuSysfsSource(SourceContext(sysfs=tmp_path, options={"pcie_bw": False, "keep_open": "never"}))
        plain.open()
        assert plain._kept is None  # noqa: SLF001
        def rows(sample):
            return sorted((r.device, r.field, r.value, r.labels) for r in sample.readings)

        assert rows(first) == rows(plain.poll())
        plain.close()
        (devs[0] / "gpu_busy_percent").write_text("77\n")          # rewritten in place: seen
        fast = src.poll_fast()
        assert ("gpu_busy_percent", 77.0) in {(r.field, r.value) for r in fast.readings if r.device == mi300x_pci(0)}
        gone = devs[1].with_name("gone")
        os.rename(devs[1], gone)                                     # unplugged
        sample = src.poll()
        assert sample.device_up[mi300x_pci(1)] is False and sample.errors == {"device_lost": 1}
        assert not [p for p in kept.fds if p.startswith(str(devs[1]) + "/")]
        os.rename(gone, devs[1])                                     # back again
        (devs[1] / "gpu_busy_percent").write_text("55\n")
        sample = src.poll()
        assert sample.device_up[mi300x_pci(1)] is True and not sample.errors
        assert ("gpu_busy_percent", 55.0) in {(r.field, r.value) for r in sample.readings
                                              if r.device == mi300x_pci(1)}
    finally:
        src.close()
    assert src._kept is not None and src._kept.fds == {}  # noqa: SLF001


def test_kept_descriptor_failing_with_enodev_is_reopened_and_enoent_is_absent(tmp_path, monkeypatch):
    from exporter.sources import sysfs_util

    f = tmp_path / "attr"
    f.write_text("1\n")
    kept = sysfs_util.KeptFiles(budget=10)
    assert kept.read(str(f)) == b"1\n" and str(f) in kept.fds
    real = os.pread
    calls = []

    def flaky(fd, n, off):
        if not calls:
            calls.append(fd)
            raise OSError(errno.ENODEV, "No such device")
        return real(fd, n, off)

    monkeypatch.setattr(sysfs_util.os, "pread", flaky)
    f.write_text("2\n")
    assert kept.read(str(f)) == b"2\n" and kept.reopened == 1
    monkeypatch.setattr(sysfs_util.os, "pread", real)
    f.unlink()
    os.close(kept.fds[str(f)])                                       # the descriptor is gone too: EBADF
    with pytest.raises(FileNotFoundError):
        kept.read(str(f))
    assert str(f) not in kept.fds
    small = sysfs_util.KeptFiles(budget=0)                          # over budget: plain reads
    g = tmp_path / "g"
    g.write_text("3\n")
    assert small.read(str(g)) == b"3\n" and small.fds == {}


def test_on_sysfs_reads_the_mount_table(tmp_path):
    from exporter.sources.sysfs_util import on_sysfs

    mi = tmp_path / "mountinfo"
    mi.write_text("22 1 0:21 / /sys rw,nosuid shared:7 - sysfs sysfs rw\n"
                  "30 22 0:26 / /sys/fs/cgroup rw shared:9 - cgroup2 cgroup2 rw\n"
                  f"40 1 0:30 / {tmp_path} rw - tmpfs tmpfs rw\n")
    assert on_sysfs("/sys", str(mi)) and on_sysfs("/sys/class/drm", str(mi))
    assert not on_sysfs("/sys/fs/cgroup/x", str(mi)) and not on_sysfs(tmp_path / "sys", str(mi))
    assert not on_sysfs("/sys", str(tmp_path / "missing"))


def test_with_the_mapping_set_unmapped_files_and_table_fields_are_not_read(real_node):
    """Handed the loaded mappings (as the daemon does), the source reads only files whose raw
    field a rule maps and emits only mapped table fields; the canonical series are the same."""
    from exporter.testing import load_mappings

    mappings = load_mappings()
    mapped = set(mappings.get("amdgpu").rules)
    read: list[str] = []

    def reader(path):
        read.append(str(path))
        with open(path, "rb") as fh:
            return fh.read()

    full = map_source_once(AmdgpuSysfsSource(SourceContext(sysfs=real_node, options={"pcie_bw": False})), mappings=mappings)
    src = AmdgpuSysfsSource(SourceContext(sysfs=real_node, options={"pcie_bw": False}, wanted=mappings.raw_fields()), reader=reader)
    lean = map_source_once(src, mappings=mappings)
    assert lean == full
    src.open()
    try:
        read.clear()
        sample = src.poll()
    finally:
        src.close()
    assert {r.field for r in sample.readings} <= mapped
    names = {os.path.basename(p) for p in read}
    # unmapped on every card: the caps' min and default, the video clocks' levels
    assert not names & {"power1_cap_min", "power1_cap_default", "pp_dpm_dclk"}, sorted(names)
    assert {"gpu_busy_percent", "power1_cap", "gpu_metrics", "pp_dpm_sclk"} <= names
    # no mapping set (a tool, a test): everything is read, as before
    plain = AmdgpuSysfsSource(SourceContext(sysfs=real_node, options={"pcie_bw": False}))
    plain.open()
    try:
        fields = {r.field for r in plain.poll().readings}
    finally:
        plain.close()
    assert fields - mapped, "without mappings the unmapped raw fields are still emitted"


def test_fast_poll_reads_the_table_only_where_a_busy_file_gives_nothing(tmp_path, shared_fixtures):
    """The busy files win over the table's averages in mappings/amdgpu.yaml (listed first), so a
    fast poll skips the table on a card with both files and reads it where one is missing or fails."""
    from exporter.testing import load_mappings

    rules = load_mappings().get("amdgpu").rules
    for file_raw, table_raw in (("gpu_busy_percent", "gpu_metrics.average_gfx_activity"),
                                ("mem_busy_percent", "gpu_metrics.average_umc_activity")):
        (file_rule,), (table_rule,) = rules[file_raw], rules[table_raw]
        assert file_rule.metric == table_rule.metric and file_rule.order < table_rule.order
    metrics = (shared_fixtures / "amd" / "gpu_metrics_v1_3_rx6900xt_navi21.bin").read_bytes()
    arrange_real_card(tmp_path, shared_fixtures, "rx6900xt", 0, metrics)   # both busy files
    arrange_real_card(tmp_path, shared_fixtures, "rx7800xt", 1, metrics)   # no mem_busy_percent
    def reader(path):
        if path.name == "gpu_busy_percent" and "/card0/" in str(path):  # card0: the rx6900xt
            raise OSError(errno.EOPNOTSUPP, "not supported")
        with open(path, "rb") as fh:
            return fh.read()

    src = AmdgpuSysfsSource(shipped_context(sysfs=tmp_path, options={"pcie_bw": False}))
    src.open()
    try:
        by_card = {}
        for r in src.poll_fast().readings:
            by_card.setdefault(r.device, set()).add(r.field)
    finally:
        src.close()
    both, missing = PCI["rx6900xt"], PCI["rx7800xt"]
    assert by_card[both] == {"gpu_busy_percent", "mem_busy_percent"}
    assert "gpu_metrics.average_umc_activity" in by_card[missing]
    # a busy file that fails at run time: the table stands in on that poll
    src = AmdgpuSysfsSource(shipped_context(sysfs=tmp_path, options={"pcie_bw": False}), reader=reader)
    src.open()
    try:
        fields = {r.field for r in src.poll_fast().readings if r.device == both}
    finally:
        src.close()
    assert "gpu_metrics.average_gfx_activity" in fields


def test_pcie_bw_threads_keep_their_own_descriptor_and_close_it(tmp_path, shared_fixtures):
    """With attribute files kept open, each pcie_bw thread re-reads its file through a
    descriptor of its own (pread, no open/close a second) and closes it when the source closes."""
    arrange_real_card(tmp_path, shared_fixtures, "rx580", 0)          # pcie_bw "11886 2528 256"

    def pcie_fds() -> int:
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                n += os.readlink(f"/proc/self/fd/{fd}").endswith("/pcie_bw")
            except OSError:
                pass
        return n

    src = AmdgpuSysfsSource(SourceContext(sysfs=tmp_path, options={"pcie_bw_interval": 0.05, "keep_open": "always"}))
    src.open()
    try:
        assert src.pcie_bw_ready(5)
        deadline = time.monotonic() + 10
        raw: dict = {}
        while time.monotonic() < deadline:  # two samples integrated
            raw = _by_device(src.poll())["0000:09:00.0"]
            if raw.get("pcie_bw.received_bytes", 0) > 11886 * 256:
                break
            time.sleep(0.05)
        assert raw["pcie_bw.received"] == 11886 and raw["pcie_bw.received_bytes"] > 11886 * 256
        assert pcie_fds() == 1
    finally:
        src.close()
    assert pcie_fds() == 0
