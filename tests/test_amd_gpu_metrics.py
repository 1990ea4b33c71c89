"""gpu_metrics binary table parser: layouts, real dumps, invalid tables, units, throttle bits."""

from __future__ import annotations

import json
import re
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.sources import amd_gpu_metrics as gm
from exporter.sources.amd_gpu_metrics import GpuMetricsError, parse_gpu_metrics, table_readings
from exporter.testing import shipped_fast_fields
from tests.amd_fixture_tree import pack_gpu_metrics_v1_5

# the table fields a fast poll reads: those feeding a `fast: true` metric in the shipped mappings
FAST = frozenset(f for f in shipped_fast_fields("amdgpu") if f.startswith(gm.PREFIX))

LAYOUT_BY_DOC_NAME = {
    "metrics_table_header": gm.HEADER, "gpu_metrics_v1_0": gm.V1_0, "gpu_metrics_v1_1": gm.V1_1,
    "gpu_metrics_v1_2": gm.V1_2, "gpu_metrics_v1_3": gm.V1_3, "gpu_metrics_v1_4": gm.V1_4,
    "gpu_metrics_v1_5": gm.V1_5, "gpu_metrics_v1_6__OLD_torvalds_00dedab0": gm.V1_6_OLD,
    "gpu_metrics_v1_6__NEW_with_xcp_stats": gm.V1_6_NEW, "gpu_metrics_v1_7": gm.V1_7,
    "gpu_metrics_v1_8": gm.V1_8, "gpu_metrics_v2_0": gm.V2_0, "gpu_metrics_v2_1": gm.V2_1,
    "gpu_metrics_v2_2": gm.V2_2, "gpu_metrics_v2_3": gm.V2_3, "gpu_metrics_v2_4": gm.V2_4,
    "gpu_metrics_v3_0": gm.V3_0, "amdgpu_xcp_metrics": gm.XCP_V1_0,
    "amdgpu_xcp_metrics_v1_1": gm.XCP_V1_1, "amdgpu_xcp_metrics_v1_2": gm.XCP_V1_2,
}


def _read(shared_fixtures, name: str) -> bytes:
    return (shared_fixtures / "amd" / name).read_bytes()


def test_every_documented_struct_matches_computed_offsets_and_sizes(shared_fixtures):
    text = (shared_fixtures / "amd" / "gpu_metrics_struct_layouts.txt").read_text()
    blocks = re.split(r"^=== struct ", text, flags=re.M)[1:]
    seen = set()
    for block in blocks:
        head = block.splitlines()[0]
        name = head.split()[0]
        size = int(re.search(r"sizeof = (\d+)", head).group(1))
        layout = LAYOUT_BY_DOC_NAME[name]
        seen.add(name)
        assert layout.size == size, name
        doc_fields = re.findall(r"@\s+(\d+)\s+\S+\s+(\w+)", block)
        assert [f for _, f in doc_fields] == [f for f, _, _ in layout.fields], name
        for offset, fname in doc_fields:
            assert layout.offsets[fname] == int(offset), (name, fname)
    assert seen == set(LAYOUT_BY_DOC_NAME)


@pytest.mark.parametrize("binary", ["gpu_metrics_v1_3_rx6900xt_navi21.bin", "gpu_metrics_v2_2_mangohud_apu.bin"])
def test_real_tables_decode_to_the_published_values(shared_fixtures, binary):
    expected = json.loads((shared_fixtures / "amd" / "gpu_metrics_decoded.json").read_text())[binary]
    table = parse_gpu_metrics(_read(shared_fixtures, binary))
    hdr = expected["header"]
    assert (table.structure_size, table.format_revision, table.content_revision) == (
        hdr["structure_size"], hdr["format_revision"], hdr["content_revision"])
    assert table.fields == expected["fields"]


def test_rx6900xt_readings_drop_all_ones_and_keep_real_zeroes(shared_fixtures):
    table = parse_gpu_metrics(_read(shared_fixtures, "gpu_metrics_v1_3_rx6900xt_navi21.bin"))
    readings = {(name, labels): v for name, v, labels in table_readings(table)}
    assert readings[("gpu_metrics.temperature_hotspot", ())] == 59
    assert readings[("gpu_metrics.average_umc_activity", ())] == 0
    assert readings[("gpu_metrics.pcie_link_speed", ())] == 160
    assert readings[("gpu_metrics.voltage_mem", ())] == 1356
    # 65535 / 0xFFFFFFFF / all-ones u64 mean "not supported": no reading at all
    names = {name for name, _ in readings}
    for missing in ("gpu_metrics.average_socclk_frequency", "gpu_metrics.gfx_activity_acc",
                    "gpu_metrics.mem_activity_acc", "gpu_metrics.temperature_hbm",
                    "gpu_metrics.firmware_timestamp", "gpu_metrics.padding", "gpu_metrics.padding1"):
        assert missing not in names
    # v1_3 states no unit for energy: distinct raw name, not the v1_4+ 2^-16 J one
    assert readings[("gpu_metrics.energy_accumulator_unspecified", ())] == 17691682
    assert "gpu_metrics.energy_accumulator" not in names
    # indep_throttle_status == 0: every bit and class reads 0
    assert readings[("gpu_metrics.indep_throttle_status.class_power", ())] == 0
    assert readings[("gpu_metrics.indep_throttle_status.temp_hotspot", ())] == 0


def test_apu_table_units_get_distinct_names_and_throttle_bits(shared_fixtures):
    table = parse_gpu_metrics(_read(shared_fixtures, "gpu_metrics_v2_2_mangohud_apu.bin"))
    r = {(name, labels): v for name, v, labels in table_readings(table)}
    assert r[("gpu_metrics.temperature_gfx_centi", ())] == 8175      # 81.75 C
    assert r[("gpu_metrics.temperature_soc_centi", ())] == 7100
    assert r[("gpu_metrics.temperature_core_centi", (("core", "3"),))] == 7350
    assert ("gpu_metrics.temperature_core_centi", (("core", "4"),)) not in r  # 65535
    assert r[("gpu_metrics.average_gfx_power_mw", ())] == 6161
    assert r[("gpu_metrics.average_cpu_power_mw", ())] == 9235
    assert r[("gpu_metrics.average_socket_power_apu", ())] == 18844  # unit varies by ASIC: unmapped
    assert r[("gpu_metrics.average_gfx_activity_apu", ())] == 100
    assert "gpu_metrics.temperature_gfx" not in {n for n, _ in r}
    # indep_throttle_status = 96 = bits 5 (FPPT) and 6 (SPPT): power throttled (MangoHud agrees)
    assert r[("gpu_metrics.indep_throttle_status.fppt", ())] == 1
    assert r[("gpu_metrics.indep_throttle_status.sppt", ())] == 1
    assert r[("gpu_metrics.indep_throttle_status.ppt0", ())] == 0
    assert r[("gpu_metrics.indep_throttle_status.class_power", ())] == 1
    assert r[("gpu_metrics.indep_throttle_status.class_temperature", ())] == 0
    assert r[("gpu_metrics.indep_throttle_status.class_current", ())] == 0


def test_indep_throttle_bits_follow_the_kernel_numbering():
    data = bytearray(b"\xff" * 120)
    struct.pack_into("<HBB", data, 0, 120, 1, 3)
    struct.pack_into("<Q", data, 112, (1 << 36) | (1 << 47) | (1 << 18) | (1 << 57))
    r = {n: v for n, v, _ in table_readings(parse_gpu_metrics(bytes(data)))}
    prefix = "gpu_metrics.indep_throttle_status."
    assert r[prefix + "temp_hotspot"] == 1 and r[prefix + "prochot_gfx"] == 1
    assert r[prefix + "tdc_mem"] == 1 and r[prefix + "fit"] == 1
    assert r[prefix + "temp_edge"] == 0
    assert (r[prefix + "class_power"], r[prefix + "class_current"], r[prefix + "class_temperature"],
            r[prefix + "class_other"]) == (0, 1, 1, 1)


def test_invalid_real_table_is_rejected(shared_fixtures):
    with pytest.raises(GpuMetricsError, match="unknown format 0.0"):
        parse_gpu_metrics(_read(shared_fixtures, "gpu_metrics_invalid_mangohud.bin"))


def test_st_size_padded_capture_is_accepted_truncated_is_rejected(shared_fixtures):
    raw = _read(shared_fixtures, "gpu_metrics_v1_3_rx6900xt_navi21.bin")
    assert parse_gpu_metrics(raw + b"\0" * (4096 - 120)).fields["current_gfxclk"] == 500
    with pytest.raises(GpuMetricsError, match="truncated, 119 of 120"):
        parse_gpu_metrics(raw[:119])
    with pytest.raises(GpuMetricsError, match="shorter than the 4-byte header"):
        parse_gpu_metrics(raw[:3])
    bad_size = struct.pack("<HBB", 124, 1, 3) + raw[4:]
    with pytest.raises(GpuMetricsError, match="structure_size 124 is not a known layout"):
        parse_gpu_metrics(bad_size)
    with pytest.raises(GpuMetricsError, match="unknown format 1.9"):
        parse_gpu_metrics(struct.pack("<HBB", 16, 1, 9) + b"\0" * 12)


def test_v1_6_variants_are_told_apart_by_structure_size():
    old = bytearray(b"\xff" * 384)
    struct.pack_into("<HBB", old, 0, 384, 1, 6)
    struct.pack_into("<I", old, 128, 5)          # throttle_status in the OLD layout
    struct.pack_into("<H", old, 4, 71)           # temperature_hotspot
    t_old = parse_gpu_metrics(bytes(old))
    assert t_old.layout is gm.V1_6_OLD and t_old.fields["throttle_status"] == 5
    new = bytearray(b"\xff" * 1664)
    struct.pack_into("<HBB", new, 0, 1664, 1, 6)
    struct.pack_into("<H", new, 306, 2)          # num_partition
    struct.pack_into("<8I", new, 312, 10, 11, 12, 13, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF)
    struct.pack_into("<8I", new, 312 + 168, 20, 21, 22, 23, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF)
    struct.pack_into("<8I", new, 312 + 2 * 168, 99, 99, 99, 99, 99, 99, 99, 99)  # partition 2: ignored
    t_new = parse_gpu_metrics(bytes(new))
    assert t_new.layout is gm.V1_6_NEW and "throttle_status" not in t_new.fields
    busy = {(lbl, v) for n, v, lbl in table_readings(t_new) if n == "gpu_metrics.xcp.gfx_busy_inst"}
    assert busy == {((("xcp", "0"), ("xcc", str(i))), 10.0 + i) for i in range(4)} | {
        ((("xcp", "1"), ("xcc", str(i))), 20.0 + i) for i in range(4)}


def test_v1_5_table_built_from_documented_offsets():
    data = pack_gpu_metrics_v1_5(temperature_hotspot=55, curr_socket_power=412, average_umc_activity=87,
                                 energy_accumulator=3 * 65536, pcie_link_speed=320,
                                 xgmi_read_data_acc=[7, 8], xgmi_write_data_acc=[9],
                                 current_gfxclk=[2100, 2090], current_uclk=1300, pcie_nak_rcvd_count_acc=4)
    r = {(n, lbl): v for n, v, lbl in table_readings(parse_gpu_metrics(data))}
    assert r[("gpu_metrics.temperature_hotspot", ())] == 55
    assert r[("gpu_metrics.curr_socket_power", ())] == 412
    assert r[("gpu_metrics.average_umc_activity", ())] == 87
    assert r[("gpu_metrics.energy_accumulator", ())] == 3 * 65536
    assert r[("gpu_metrics.pcie_link_speed", ())] == 320
    assert r[("gpu_metrics.pcie_nak_rcvd_count_acc", ())] == 4
    assert r[("gpu_metrics.xgmi_read_data_acc", (("link", "1"),))] == 8
    assert r[("gpu_metrics.xgmi_write_data_acc", (("link", "0"),))] == 9
    assert ("gpu_metrics.xgmi_write_data_acc", (("link", "1"),)) not in r
    assert r[("gpu_metrics.current_gfxclk", (("xcc", "1"),))] == 2090
    assert r[("gpu_metrics.current_uclk", ())] == 1300
    assert not any(n == "gpu_metrics.throttle_status" for n, _ in r)  # left all-ones


def test_apu_v2_4_activity_is_centi_percent():
    data = bytearray(b"\xff" * 168)
    struct.pack_into("<HBB", data, 0, 168, 2, 4)
    struct.pack_into("<H", data, 28, 4250)
    r = {n: v for n, v, _ in table_readings(parse_gpu_metrics(bytes(data)))}
    assert r == {"gpu_metrics.average_gfx_activity_centi": 4250}


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=4200))
def test_random_bytes_never_escape_the_parser(data):
    try:
        table = parse_gpu_metrics(data)
    except GpuMetricsError:
        return
    table_readings(table)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(gm.LAYOUTS)), st.data())
def test_known_headers_with_random_bodies_decode(version, data):
    layout = data.draw(st.sampled_from(gm.LAYOUTS[version]))
    body = data.draw(st.binary(min_size=layout.size - 4, max_size=layout.size - 4))
    table = parse_gpu_metrics(struct.pack("<HBB", layout.size, *version) + body)
    for name, value, labels in table_readings(table):
        assert name.startswith("gpu_metrics.") and value >= 0 and isinstance(labels, tuple)


# ---- the precompiled path (gm.readings) gives exactly what the generic walk gives


@pytest.mark.parametrize("binary", ["gpu_metrics_v1_3_rx6900xt_navi21.bin", "gpu_metrics_v2_2_mangohud_apu.bin"])
def test_precompiled_readings_equal_the_generic_walk_on_real_tables(shared_fixtures, binary):
    data = _read(shared_fixtures, binary)
    walk = table_readings(parse_gpu_metrics(data))
    assert gm.readings(data) == walk
    fast = gm.readings(data, FAST)
    # the APU table's activities are *_apu (unit differs by ASIC, unmapped on purpose): nothing fast
    assert bool(fast) == ("apu" not in binary)
    assert all(r in walk for r in fast)
    assert {n for n, _, _ in fast} <= FAST
    assert [r for r in walk if r not in fast and r[0] in FAST] == []


def test_precompiled_readings_of_a_partitioned_v1_5_table():
    data = pack_gpu_metrics_v1_5()
    assert gm.readings(data) == table_readings(parse_gpu_metrics(data))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(gm.LAYOUTS)), st.data())
def test_precompiled_readings_equal_the_walk_on_random_bodies(version, data):
    layout = data.draw(st.sampled_from(gm.LAYOUTS[version]))
    body = data.draw(st.binary(min_size=layout.size - 4, max_size=layout.size - 4))
    raw = struct.pack("<HBB", layout.size, *version) + body
    walk = table_readings(parse_gpu_metrics(raw))
    assert gm.readings(raw) == walk
    assert gm.readings(raw, FAST) == [r for r in walk if r[0] in FAST]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=4200))
def test_precompiled_readings_reject_what_the_parser_rejects(data):
    try:
        walk = table_readings(parse_gpu_metrics(data))
    except GpuMetricsError:
        with pytest.raises(GpuMetricsError):
            gm.readings(data)
        with pytest.raises(GpuMetricsError):
            gm.readings(data, FAST)
        return
    assert gm.readings(data) == walk


@pytest.mark.parametrize("binary", ["gpu_metrics_v1_3_rx6900xt_navi21.bin", "gpu_metrics_v2_2_mangohud_apu.bin"])
def test_wanted_raw_names_select_exactly_those_readings(shared_fixtures, binary):
    """``readings(data, wanted=...)`` is the full list filtered by raw name, in the same order,
    for any selection (the source passes the raw fields its mapping file maps)."""
    import random

    data = _read(shared_fixtures, binary)
    everything = gm.readings(data)
    names = sorted({name for name, _, _ in everything})
    rng = random.Random(3)
    for _ in range(20):
        wanted = frozenset(rng.sample(names, rng.randint(0, len(names))) + ["gpu_metrics.not_a_field"])
        assert gm.readings(data, wanted=wanted) == [r for r in everything if r[0] in wanted]
    assert gm.readings(data, wanted=frozenset()) == []
