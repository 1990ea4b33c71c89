"""The mapping engine: validation errors, unit arithmetic, counters, rates, preference, derivation."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from exporter.map.mapper import Mapper
from exporter.map.mapping import MappingSet, load_mapping
from exporter.map.schema import default_mappings_dir, load_schema
from exporter.sources.base import Device, PollResult
from exporter.testing import flat, frames_of
from exporter.yamlfile import ConfigError

DEV = Device(key="0000:01:00.0", vendor="nvidia", index="0", mapping="t", uuid="GPU-1")
DL = (("vendor", "nvidia"), ("gpu", "0"), ("uuid", "GPU-1"))


@pytest.fixture(scope="module")
def schema():
    return load_schema()


def make_set(tmp_path: Path, schema, body: str) -> MappingSet:
    path = tmp_path / "t.yaml"
    path.write_text(body)
    return MappingSet(schema, {"t": load_mapping(path, schema, "t")})


def run(mapper: Mapper, t: float, *readings) -> dict:
    s = PollResult(monotonic=t)
    for r in readings:
        s.add(DEV.key, *r)
    return flat(mapper.map(s, {DEV.key: DEV}).frames)


def test_scale_offset_and_fixed_labels(tmp_path, schema):
    ms = make_set(tmp_path, schema, """
vendor: nvidia
fields:
  - {raw: power.usage, metric: gpu_power_watts, scale: 0.001}
  - {raw: temp, metric: gpu_temperature_celsius, labels: {sensor: gpu}}
  - {raw: tempF, metric: gpu_temperature_celsius, labels: {sensor: memory}, scale: 0.5555555555555556, offset: -17.77777777777778}
""")
    out = run(Mapper(ms), 1.0, ("power.usage", 251345), ("temp", 41), ("tempF", 212))
    assert out[("gpu_power_watts", DL)] == pytest.approx(251.345)
    assert out[("gpu_temperature_celsius", DL + (("sensor", "gpu"),))] == 41
    assert out[("gpu_temperature_celsius", DL + (("sensor", "memory"),))] == pytest.approx(100.0)


def test_counter_reset_is_folded_in(tmp_path, schema):
    ms = make_set(tmp_path, schema, """
vendor: nvidia
fields:
  - {raw: energy, metric: gpu_energy_joules_total, scale: 0.001}
""")
    m = Mapper(ms)
    key = ("gpu_energy_joules_total", DL)
    assert run(m, 1, ("energy", 5000))[key] == 5.0
    assert run(m, 2, ("energy", 7000))[key] == 7.0
    # driver reload: the device counter restarts near zero; our total keeps going up
    assert run(m, 3, ("energy", 1000))[key] == 8.0
    assert run(m, 4, ("energy", 3000))[key] == 10.0


def test_counter_wrap(tmp_path, schema):
    ms = make_set(tmp_path, schema, """
vendor: intel
fields:
  - {raw: energy_uj, metric: gpu_energy_joules_total, scale: 0.000001, wrap: 4294967296}
  - {raw: energy_uj, metric: gpu_power_watts, transform: rate, scale: 0.000001, wrap: 4294967296}
""")
    m = Mapper(ms)
    out1 = run(m, 10.0, ("energy_uj", 4294967296 - 100_000_000))
    assert ("gpu_power_watts", DL) not in out1  # a rate needs two samples
    out2 = run(m, 12.0, ("energy_uj", 500_000_000))  # wrapped: 600 J in 2 s
    assert out2[("gpu_power_watts", DL)] == pytest.approx(300.0)
    assert out2[("gpu_energy_joules_total", DL)] == pytest.approx(4294.967296 - 100 + 600)


def test_rate_transform_with_offset_and_clamp_and_backwards(tmp_path, schema):
    ms = make_set(tmp_path, schema, """
vendor: intel
fields:
  - {raw: idle_ms, metric: gpu_compute_utilization_percent, transform: rate, scale: -0.1, offset: 100, clamp: [0, 100]}
""")
    m = Mapper(ms)
    key = ("gpu_compute_utilization_percent", DL)
    assert key not in run(m, 0.0, ("idle_ms", 1000))
    assert run(m, 2.0, ("idle_ms", 1500))[key] == pytest.approx(75.0)  # 250 ms idle per s
    assert run(m, 3.0, ("idle_ms", 1500))[key] == 100.0
    assert run(m, 4.0, ("idle_ms", 2600))[key] == 0.0   # clamped (1100 ms/s would be -10 %)
    assert key not in run(m, 5.0, ("idle_ms", 10))     # went backwards: no value this poll
    assert run(m, 6.0, ("idle_ms", 510))[key] == pytest.approx(50.0)


def test_integrate_turns_a_throughput_gauge_into_a_byte_counter(tmp_path, schema):
    """DCGM's NVLink throughput (units of 1024000 B/s, averaged by DCGM over its window): each
    poll adds value x scale x seconds since the previous one; from 0, never down."""
    ms = make_set(tmp_path, schema, """
vendor: nvidia
fields:
  - {raw: nvl, metric: gpu_interconnect_bytes_total, labels: {interconnect: nvlink, direction: total},
     transform: integrate, scale: 1024000, invalid: [9.223372036854775808e+18]}
""")
    m = Mapper(ms)
    key = ("gpu_interconnect_bytes_total", DL + (("direction", "total"), ("interconnect", "nvlink")))
    assert run(m, 10.0, ("nvl", 100))[key] == 0                       # first sight: starts at 0
    assert run(m, 12.0, ("nvl", 100))[key] == 100 * 1024000 * 2        # 2 s at 100
    assert run(m, 12.5, ("nvl", 0))[key] == 100 * 1024000 * 2          # idle
    s = PollResult(monotonic=13.5)
    s.add(DEV.key, "nvl", -5)                                           # a negative rate: malformed
    assert m.map(s, {DEV.key: DEV}).malformed == 1
    assert key not in run(m, 14.5, ("nvl", 2.0**63))                  # a blank: no value
    # nothing is assumed for the polls without a value: the next one restarts the window
    assert run(m, 15.5, ("nvl", 50))[key] == 100 * 1024000 * 2
    assert run(m, 16.5, ("nvl", 50))[key] == 100 * 1024000 * 2 + 50 * 1024000 * 1.0


def test_integrate_spans_no_gap_longer_than_consecutive_polls_make(tmp_path, schema):
    """Without a poll interval given, the shortest step between map() calls is the expected
    one: a step over 2x it (polls that raised never reach map()) restarts the window; a value
    outside ``valid`` (B/s after scale) is malformed, not integrated."""
    ms = make_set(tmp_path, schema, """
vendor: nvidia
fields:
  - {raw: nvl, metric: gpu_interconnect_bytes_total, labels: {interconnect: nvlink, direction: total},
     transform: integrate, valid: [0, 1000]}
""")
    m = Mapper(ms)
    key = ("gpu_interconnect_bytes_total", DL + (("direction", "total"), ("interconnect", "nvlink")))
    assert run(m, 10.0, ("nvl", 100))[key] == 0
    assert run(m, 11.0, ("nvl", 100))[key] == 100
    assert run(m, 12.0, ("nvl", 100))[key] == 200
    assert run(m, 42.0, ("nvl", 100))[key] == 200      # 30 s since the last map(): an outage
    assert run(m, 43.0, ("nvl", 100))[key] == 300
    s = PollResult(monotonic=44.0)
    s.add(DEV.key, "nvl", 5000)                         # above valid: junk, not 5000 B for good
    assert m.map(s, {DEV.key: DEV}).malformed == 1
    assert run(m, 45.0, ("nvl", 100))[key] == 300       # the window restarts after it
    assert run(m, 46.0, ("nvl", 100))[key] == 400
    # the runner gives the source's interval: the first step is judged by it, too
    m = Mapper(ms, interval=1.0)
    assert run(m, 10.0, ("nvl", 100))[key] == 0
    assert run(m, 25.0, ("nvl", 100))[key] == 0


def test_first_listed_rule_wins_and_invalid_values_are_counted(tmp_path, schema):
    ms = make_set(tmp_path, schema, """
vendor: amd
fields:
  - {raw: gpu_metrics.average_gfx_activity, metric: gpu_compute_utilization_percent, invalid: [65535]}
  - {raw: gpu_busy_percent, metric: gpu_compute_utilization_percent}
""")
    m = Mapper(ms)
    key = ("gpu_compute_utilization_percent", DL)
    assert run(m, 1, ("gpu_busy_percent", 40), ("gpu_metrics.average_gfx_activity", 42))[key] == 42
    s = PollResult(monotonic=2)
    s.add(DEV.key, "gpu_busy_percent", 40)
    s.add(DEV.key, "gpu_metrics.average_gfx_activity", 65535)
    s.add(DEV.key, "gpu_busy_percent", "N/A")
    res = m.map(s, {DEV.key: DEV})
    assert flat(res.frames)[key] == 40
    assert res.malformed == 1 and s.errors["malformed_value"] == 1


def test_label_map_and_derived_metrics(tmp_path, schema):
    ms = make_set(tmp_path, schema, """
vendor: nvidia
fields:
  - {raw: nvlink.tx, metric: gpu_interconnect_bytes_total, labels: {interconnect: nvlink, direction: tx}, label_map: {link_id: link}}
  - {raw: mem.used, metric: gpu_memory_used_bytes}
  - {raw: mem.total, metric: gpu_memory_total_bytes}
  - {raw: bus, metric: gpu_memory_bus_width_bytes, scale: 0.125}
  - {raw: maxmem, metric: gpu_clock_max_mhz, labels: {domain: memory}}
  - {raw: dram, metric: gpu_memory_bandwidth_utilization_percent}
""")
    out = run(Mapper(ms), 1, ("nvlink.tx", 10, (("link_id", "3"),)), ("mem.used", 20 * 2**30),
              ("mem.total", 80 * 2**30), ("bus", 5120), ("maxmem", 2619), ("dram", 50))
    assert out[("gpu_interconnect_bytes_total",
                DL + (("direction", "tx"), ("interconnect", "nvlink"), ("link", "3")))] == 10
    assert out[("gpu_memory_utilization_percent", DL)] == pytest.approx(25.0)
    # H100 SXM: 5120 bit / 8 * 2619 MHz * 2 (DDR) = 3352.32 GB/s
    assert out[("gpu_memory_peak_bandwidth_gbps", DL)] == pytest.approx(3352.32)
    assert out[("gpu_memory_bandwidth_gbps", DL)] == pytest.approx(1676.16)


def test_a_source_value_beats_the_derived_one(tmp_path, schema):
    ms = make_set(tmp_path, schema, """
vendor: amd
fields:
  - {raw: used, metric: gpu_memory_used_bytes}
  - {raw: total, metric: gpu_memory_total_bytes}
  - {raw: util, metric: gpu_memory_utilization_percent}
""")
    out = run(Mapper(ms), 1, ("used", 1), ("total", 4), ("util", 33))
    assert out[("gpu_memory_utilization_percent", DL)] == 33


@pytest.mark.parametrize("body, line, field, message", [
    ("vendor: nvidia\nfields:\n  - raw: x\n    metric: gpu_nope\n", 4, "fields[0].metric",
     "unknown canonical metric 'gpu_nope'"),
    ("vendor: nvidia\nfields:\n  - raw: x\n    metric: gpu_clock_mhz\n", 4, "fields[0].metric",
     "requires labels ['domain']"),
    ("vendor: nvidia\nfields:\n  - raw: x\n    metric: gpu_power_watts\n    labels: {sensor: a}\n", 4,
     "fields[0].metric", "not allowed on gpu_power_watts"),
    ("vendor: nvidia\nfields:\n  - raw: x\n    metric: gpu_power_watts\n    scale: fast\n", 5,
     "fields.0.scale", "valid number"),
    ("vendor: nvidia\nfields:\n  - raw: x\n    metric: gpu_power_watts\n    colour: red\n", 5,
     "fields.0.colour", "Extra inputs are not permitted"),
    ("vendor: nvidia\nfields:\n  - raw: x\n    metric: [unclosed\n", 5, "", "invalid YAML"),
    ("vendor: acme\nfields: []\n", 1, "vendor", "Input should be"),
    ("vendor: nvidia\nfields:\n  - raw: x\n    metric: gpu_power_watts\n    transform: integrate\n", 4,
     "fields[0].metric", "transform: integrate makes a counter"),
    # unit evidence is between schemas; a schema a rule names must be one the file lists
    ("vendor: nvidia\nfields:\n  - raw: x\n    metric: gpu_power_watts\n    integer: true\n", 3,
     "fields[0]", "only for a raw field qualified by one"),
    ("vendor: nvidia\nfields:\n  - raw: 'x{schema=\"a\"}'\n    metric: gpu_power_watts\n    unit_help: '('\n", 3,
     "fields[0]", "unit_help is not a regular expression"),
    ("vendor: nvidia\nschemas: [{name: a}]\nfields:\n  - raw: 'x{schema=\"b\"}'\n    metric: gpu_power_watts\n", 4,
     "fields[0].raw", "names a schema the file does not list"),
])
def test_invalid_mapping_names_file_line_and_field(tmp_path, schema, body, line, field, message):
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    with pytest.raises(ConfigError) as exc:
        load_mapping(path, schema)
    text = str(exc.value)
    assert f"{path}:{line}:" in text
    assert field.replace(".0.", "[0].") in text
    assert message in text


def test_every_shipped_mapping_loads(schema):
    ms = MappingSet.load_dir(default_mappings_dir(), schema)
    assert ms.mappings, "no mapping files found"


def test_load_dir_reports_the_broken_file(tmp_path, schema):
    d = tmp_path / "m"
    shutil.copytree(default_mappings_dir(), d)
    (d / "zz-broken.yaml").write_text("vendor: nvidia\nfields:\n  - {raw: a, metric: gpu_nope}\n")
    with pytest.raises(ConfigError, match=r"zz-broken.yaml:3: fields\[0\].metric"):
        MappingSet.load_dir(d, schema)


def test_combine_max_ors_several_registers_into_one_series(tmp_path, schema):
    ms = make_set(tmp_path, schema, """
vendor: intel
fields:
  - {raw: pl1, metric: gpu_throttle_active, labels: {reason: power_cap}, combine: max}
  - {raw: pl2, metric: gpu_throttle_active, labels: {reason: power_cap}, combine: max}
  - {raw: a, metric: gpu_power_watts, combine: sum}
  - {raw: b, metric: gpu_power_watts, combine: sum}
""")
    m = Mapper(ms)
    key = ("gpu_throttle_active", DL + (("reason", "power_cap"),))
    assert run(m, 1, ("pl1", 0), ("pl2", 1))[key] == 1
    assert run(m, 2, ("pl1", 1), ("pl2", 0))[key] == 1
    assert run(m, 3, ("pl1", 0), ("pl2", 0))[key] == 0
    assert run(m, 4, ("a", 2), ("b", 3))[("gpu_power_watts", DL)] == 5


def test_histogram_parts_map_and_render_in_order(tmp_path, schema):
    from exporter.map.store import SourceState, Store
    from exporter.render.exposition import Renderer

    ms = make_set(tmp_path, schema, """
vendor: nvidia
fields:
  - {raw: d.bucket, metric: gpu_kernel_execution_time_milliseconds, histogram: bucket, label_map: {kernel: kernel, le: le}}
  - {raw: d.sum, metric: gpu_kernel_execution_time_milliseconds, histogram: sum, label_map: {kernel: kernel}}
  - {raw: d.count, metric: gpu_kernel_execution_time_milliseconds, histogram: count, label_map: {kernel: kernel}}
""")
    k = (("kernel", "gemm"),)
    out = run(Mapper(ms), 1, ("d.count", 3, k), ("d.bucket", 3, k + (("le", "+Inf"),)),
              ("d.sum", 4.5, k), ("d.bucket", 1, k + (("le", "1"),)), ("d.bucket", 2, k + (("le", "2.5"),)))
    assert out[("gpu_kernel_execution_time_milliseconds_bucket", DL + (("kernel", "gemm"), ("le", "1")))] == 1
    assert out[("gpu_kernel_execution_time_milliseconds_sum", DL + k)] == 4.5
    store = Store()
    st = SourceState("t")
    st.frames = frames_of(out)
    store.add(st)
    text = Renderer(schema).render(store).text.decode()
    lines = [ln for ln in text.splitlines() if ln.startswith("gpu_kernel_execution_time_milliseconds")]
    assert "# TYPE gpu_kernel_execution_time_milliseconds histogram" in text
    assert [ln.split("{")[0] + (ln.split('le="')[1].split('"')[0] if 'le="' in ln else "") for ln in lines] == [
        "gpu_kernel_execution_time_milliseconds_bucket1", "gpu_kernel_execution_time_milliseconds_bucket2.5",
        "gpu_kernel_execution_time_milliseconds_bucket+Inf", "gpu_kernel_execution_time_milliseconds_sum",
        "gpu_kernel_execution_time_milliseconds_count"]


@pytest.mark.parametrize("rule, message", [
    ("{raw: d, metric: gpu_kernel_execution_time_milliseconds, label_map: {kernel: kernel}}", "say which part"),
    ("{raw: d, metric: gpu_kernel_execution_time_milliseconds, histogram: bucket, label_map: {kernel: kernel}}",
     "needs the le label"),
    ("{raw: d, metric: gpu_power_watts, histogram: sum}", "applies to histogram metrics"),
])
def test_histogram_rules_are_validated(tmp_path, schema, rule, message):
    path = tmp_path / "h.yaml"
    path.write_text(f"vendor: nvidia\nfields:\n  - {rule}\n")
    with pytest.raises(ConfigError, match=message):
        load_mapping(path, schema)


def test_values_lookup_is_for_gauges_mapped_as_read(tmp_path):
    schema = load_schema()
    good = tmp_path / "good.yaml"
    good.write_text("vendor: nvidia\nfields:\n  - raw: gen\n    metric: gpu_pcie_link_speed_gts\n"
                    "    values: {3: 8.0, 4: 16.0}\n")
    cm = load_mapping(good, schema)
    assert cm.rules["gen"][0].values == ((3.0, 8.0), (4.0, 16.0))
    bad = tmp_path / "bad.yaml"
    bad.write_text("vendor: nvidia\nfields:\n  - raw: replays\n    metric: gpu_pcie_replays_total\n"
                   "    values: {1: 2}\n")
    with pytest.raises(ConfigError, match="values"):
        load_mapping(bad, schema)
