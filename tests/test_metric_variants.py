"""A canonical metric in a second unit, and a ratio of two raw fields: each one declaration.

``derive: {of: M, scale: k}`` in canonical.yaml is a unit variant of M for every mapping file that
maps M (no vendor file changes, OTel pushes M only); ``divide_by`` in a mapping rule divides one
raw field by another of the same device and poll (amdgpu hwmon ``pwm1 / pwm1_max``).  A second
unit of one quantity is a series more per GPU for nothing a query cannot do, so the shipped schema
carries variants only while a renamed unit is deprecated (the kernel execution times: seconds
beside the deprecated milliseconds, issue 38); the gauge variant is proven on a copy of the
shipped mappings, the histogram variant on the shipped one through the real profiler fixtures.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from exporter import docs
from exporter.map.mapper import Mapper
from exporter.map.mapping import MappingSet, load_mapping
from exporter.map.schema import default_mappings_dir, load_schema
from exporter.otlp import docs as otel_docs
from exporter.otlp.naming import Skip
from exporter.otlp.naming import load_mapping as load_otel
from exporter.sources.base import Device, PollResult
from exporter.testing import flat
from exporter.yamlfile import ConfigError

VARIANT = """
  gpu_fan_speed_ratio:
    type: gauge
    unit: ratio
    help: Fan speed as a fraction of its maximum (0-1).
    derive: {of: gpu_fan_speed_percent, scale: 0.01}
"""


def with_canonical(tmp_path: Path, addition: str) -> Path:
    """A copy of the shipped mappings/ with ``addition`` appended to canonical.yaml's metrics."""
    d = tmp_path / "mappings"
    shutil.copytree(default_mappings_dir(), d)
    canonical = d / "canonical.yaml"
    canonical.write_text(canonical.read_text().rstrip("\n") + "\n" + addition)
    return d


def test_a_unit_variant_is_one_declaration_for_every_file_mapping_its_metric(tmp_path):
    d = with_canonical(tmp_path, VARIANT)
    schema = load_schema(d / "canonical.yaml")
    variant = schema.metrics["gpu_fan_speed_ratio"]
    assert variant.variant_of == "gpu_fan_speed_percent"
    assert variant.optional_labels == ["fan"]  # the metric's labels, not written again
    mappings = MappingSet.load_dir(d, schema)
    fed = 0
    for name, cm in mappings.mappings.items():
        for raw, rules in cm.rules.items():
            for rule in rules:
                if rule.metric != "gpu_fan_speed_percent" or "{" in raw or rule.divide_by:
                    continue
                dev = Device(key="k", vendor=cm.vendor, index="0", mapping=name, uuid="U")
                value = next(v for v in (40.0, 0.4) if v not in rule.invalid)
                sample = PollResult(monotonic=1.0)
                sample.add("k", raw, value)
                out = flat(Mapper(mappings).map(sample, {"k": dev}).frames)
                percent = [v for (n, _), v in out.items() if n == "gpu_fan_speed_percent"]
                ratio = [v for (n, _), v in out.items() if n == "gpu_fan_speed_ratio"]
                assert percent and ratio == pytest.approx([percent[0] / 100]), (name, raw, out)
                fed += 1
    assert fed >= 4  # nvml, amdgpu, and the upstream exporters' files: none of them edited

    # OTel: no entry in otel.yaml, the check passes, and the variant is named as pushed once
    otel = load_otel(schema, d)
    entry = otel.entry("gpu_fan_speed_ratio", schema)
    assert isinstance(entry, Skip) and "gpu_fan_speed_percent" in entry.skip
    assert otel.rules("gpu_fan_speed_ratio", schema) == []
    assert "`gpu_fan_speed_ratio` | - |" in otel_docs.render(schema, otel)
    assert "`gpu_fan_speed_percent` in ratio (x 0.01)" in docs.render(schema)


def test_a_variant_keeps_its_metric_labels_across_label_values(tmp_path):
    d = with_canonical(tmp_path, VARIANT)
    schema = load_schema(d / "canonical.yaml")
    rules = tmp_path / "fans.yaml"
    rules.write_text("vendor: intel\nfields:\n  - raw: fan\n    metric: gpu_fan_speed_percent\n"
                     "    label_map: {fan: fan}\n")
    ms = MappingSet(schema, {"fans": load_mapping(rules, schema, "fans")})
    dev = Device(key="k", vendor="intel", index="0", mapping="fans", uuid="U")
    sample = PollResult(monotonic=1.0)
    sample.add("k", "fan", 50.0, (("fan", "1"),))
    sample.add("k", "fan", 20.0, (("fan", "2"),))
    out = Mapper(ms).map(sample, {"k": dev}).frames[("intel", "0", "U")]
    assert out[("gpu_fan_speed_ratio", (("fan", "1"),))] == pytest.approx(0.5)
    assert out[("gpu_fan_speed_ratio", (("fan", "2"),))] == pytest.approx(0.2)


@pytest.mark.parametrize("addition, field, message", [
    (VARIANT.replace("    derive:", "    labels: [sensor]\n    derive:"), "metrics.gpu_fan_speed_ratio.derive.of",
     "a unit variant has its metric's labels"),
    (VARIANT.replace("unit: ratio", "unit: percent"), "metrics.gpu_fan_speed_ratio.derive.of",
     "a unit of its own"),
    (VARIANT.replace("type: gauge", "type: counter").replace("_ratio:", "_ratio_total:"),
     "metrics.gpu_fan_speed_ratio_total.derive.of", "a unit variant has its metric's type"),
    (VARIANT.replace("{of: gpu_fan_speed_percent,", "{of: gpu_nope,"), "metrics.gpu_fan_speed_ratio.derive",
     "unknown metric 'gpu_nope'"),
    (VARIANT.replace("scale: 0.01", "scale: 0"), "metrics.gpu_fan_speed_ratio.derive", "not 0 for a unit variant"),
    (VARIANT.replace("{of: gpu_fan_speed_percent,", "{of: gpu_fan_speed_percent, ratio: [a, b],"),
     "metrics.gpu_fan_speed_ratio.derive", "exactly one of ratio, product or of"),
])
def test_a_bad_variant_names_file_line_and_field(tmp_path, addition, field, message):
    d = with_canonical(tmp_path, addition)
    path = d / "canonical.yaml"
    with pytest.raises(ConfigError) as exc:
        load_schema(path)
    text = str(exc.value)
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines, 1) if line.startswith("  gpu_fan_speed_ratio"))
    derive = next(i for i in range(start, len(lines) + 1) if "derive:" in lines[i - 1])
    assert f"{path}:{derive}: {field}: " in text, text
    assert message in text


def _series(text: str) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families
    return {(smp.name, tuple(sorted(smp.labels.items()))): smp.value
            for fam in text_string_to_metric_families(text) for smp in fam.samples}


@pytest.mark.parametrize("artifact", ["nsys-2026.1.1-schema3.24.14-torch-tiny.sqlite", "kineto-mi250-rocm6.2.json",
                                      "ncu-details-b200-cc10.0-superbench.csv", "rocprofv3-kernel_trace-sdk-2024-10.csv",
                                      "unitrace-pvc-device-timing-and-metric-query.txt"])
def test_kernel_times_are_served_in_seconds_beside_the_deprecated_milliseconds(artifact, shared_fixtures, capsys):
    """Prometheus names a time in seconds: each kernel-time series of the milliseconds names has
    its seconds twin, bucket by bucket (le / 1000, the same count), sum / 1000, percentile / 1000,
    for every profiler's mapping file, none of them edited."""
    from exporter.importers.cli import main
    assert main([str(shared_fixtures / "profilers" / artifact)]) == 0
    out = _series(capsys.readouterr().out)
    ms = {k: v for k, v in out.items() if k[0].startswith("gpu_kernel_execution_time_") and "milliseconds" in k[0]}
    assert any(k[0].endswith("_bucket") for k in ms), sorted(out)[:5]
    for (name, labels), value in ms.items():
        twin_labels = tuple((k, "+Inf" if v == "+Inf" else f"{float(v) / 1000:g}") if k == "le" else (k, v)
                            for k, v in labels)
        twin = out[(name.replace("milliseconds", "seconds"), twin_labels)]
        part = name.rsplit("_", 1)[-1]
        assert twin == pytest.approx(value if part in ("bucket", "count") else value / 1000), (name, labels)
    assert len([k for k in out if "_seconds" in k[0] and "kernel_execution_time" in k[0]]) == len(ms)


def test_a_histograms_unit_variant_has_its_metrics_buckets_times_scale(tmp_path):
    d = tmp_path / "mappings"
    shutil.copytree(default_mappings_dir(), d)
    canonical = d / "canonical.yaml"
    canonical.write_text(canonical.read_text().replace("0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10]",
                                                       "0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5]"))
    with pytest.raises(ConfigError, match="a histogram's unit variant has its metric's buckets x scale"):
        load_schema(canonical)


DEV = Device(key="card0", vendor="amd", index="0", mapping="t", uuid="U")


def pwm_set(tmp_path: Path, extra: str = "") -> MappingSet:
    schema = load_schema()
    path = tmp_path / "t.yaml"
    path.write_text("vendor: amd\nfields:\n  - raw: hwmon.pwm1\n    metric: gpu_fan_speed_percent\n"
                    "    divide_by: hwmon.pwm1_max\n    scale: 100\n" + extra)
    return MappingSet(schema, {"t": load_mapping(path, schema, "t")})


def map_once(ms: MappingSet, *readings) -> tuple[dict, int]:
    sample = PollResult(monotonic=1.0)
    for r in readings:
        sample.add(DEV.key, *r)
    result = Mapper(ms).map(sample, {DEV.key: DEV})
    return {name: v for (name, _), v in flat(result.frames).items()}, result.malformed


def test_divide_by_is_a_ratio_of_two_raw_fields_of_one_poll(tmp_path):
    ms = pwm_set(tmp_path)
    # the divisor is read because a rule names it (a source reads only what is mapped)
    assert ms.raw_fields()["t"] == {"hwmon.pwm1", "hwmon.pwm1_max"}
    assert ms.raw_fields({"gpu_fan_speed_percent"})["t"] == {"hwmon.pwm1", "hwmon.pwm1_max"}
    for order in ([("hwmon.pwm1", 128.0), ("hwmon.pwm1_max", 255.0)],
                  [("hwmon.pwm1_max", 255.0), ("hwmon.pwm1", 128.0)]):
        out, malformed = map_once(ms, *order)
        assert out == {"gpu_fan_speed_percent": pytest.approx(128 / 255 * 100)} and malformed == 0
    # a fan whose maximum is not 255 (the reason to divide rather than scale by 100/255)
    out, _ = map_once(ms, ("hwmon.pwm1", 50.0), ("hwmon.pwm1_max", 100.0))
    assert out == {"gpu_fan_speed_percent": pytest.approx(50.0)}


@pytest.mark.parametrize("readings", [
    [("hwmon.pwm1", 128.0)],                                   # no divisor this poll
    [("hwmon.pwm1", 128.0), ("hwmon.pwm1_max", 0.0)],          # a zero divisor
    [("hwmon.pwm1", 128.0), ("hwmon.pwm1_max", float("inf"))], # not a number to divide by
])
def test_divide_by_without_a_usable_divisor_is_skipped_and_counted(tmp_path, readings):
    out, malformed = map_once(pwm_set(tmp_path), *readings)
    assert out == {} and malformed == 1


def test_divide_by_matches_raw_labels_and_keeps_valid_and_clamp(tmp_path):
    ms = pwm_set(tmp_path, "    clamp: [0, 100]\n    label_map: {fan: fan}\n")
    sample = PollResult(monotonic=1.0)
    sample.add(DEV.key, "hwmon.pwm1", 300.0, (("fan", "1"),))
    sample.add(DEV.key, "hwmon.pwm1_max", 255.0, (("fan", "1"),))
    sample.add(DEV.key, "hwmon.pwm1", 10.0, (("fan", "2"),))
    sample.add(DEV.key, "hwmon.pwm1_max", 20.0, (("fan", "2"),))
    frame = Mapper(ms).map(sample, {DEV.key: DEV}).frames[("amd", "0", "U")]
    assert frame == {("gpu_fan_speed_percent", (("fan", "1"),)): 100.0,
                     ("gpu_fan_speed_percent", (("fan", "2"),)): pytest.approx(50.0)}


def test_a_divisor_mapped_by_a_rule_of_its_own_still_maps(tmp_path):
    ms = pwm_set(tmp_path, "  - raw: hwmon.pwm1_max\n    metric: gpu_fan_speed_rpm\n")
    out, _ = map_once(ms, ("hwmon.pwm1", 51.0), ("hwmon.pwm1_max", 255.0))
    assert out == {"gpu_fan_speed_percent": pytest.approx(20.0), "gpu_fan_speed_rpm": 255.0}


@pytest.mark.parametrize("rule, line, message", [
    ("    metric: gpu_energy_joules_total\n    divide_by: y\n", 5, "a ratio of two raw fields is a gauge"),
    ("    metric: gpu_power_watts\n    transform: rate\n    divide_by: y\n", 6, "transform: rate"),
    ("    metric: gpu_power_watts\n    divide_by: x\n", 3, "divided by itself"),
    ("    metric: gpu_power_watts\n    divide_by: 'y{schema=\"a\"}'\n", 3, "qualified by a schema"),
])
def test_a_bad_divide_by_names_file_line_and_field(tmp_path, rule, line, message):
    path = tmp_path / "bad.yaml"
    path.write_text("vendor: amd\nfields:\n  - raw: x\n" + rule)
    with pytest.raises(ConfigError) as exc:
        load_mapping(path, load_schema())
    text = str(exc.value)
    assert f"{path}:{line}:" in text and message in text, text
    assert "divide_by" in text or "fields[0]" in text


def test_the_milliseconds_compat_rules_pair_every_bucket_of_the_schema():
    """deploy/prometheus/compat/kernel-time-milliseconds.rules.yml (for 0.4.0 on, when only the
    seconds names are served): each milliseconds bound of canonical.yaml is recreated from the
    seconds bucket of the same rank, matched as the exporter writes its bound and as a
    normalising Prometheus stores it; promtool's unit test (deploy/prometheus/tests/
    kernel-time-compat.test.yml, run by tests/test_rules.py) checks the values."""
    import re

    import yaml

    from tests.conftest import REPO
    rules = yaml.safe_load((REPO / "deploy" / "prometheus" / "compat" / "kernel-time-milliseconds.rules.yml")
                           .read_text())["groups"][0]["rules"]
    schema = load_schema()
    sec = schema.metrics["gpu_kernel_execution_time_seconds"].buckets
    ms = schema.metrics["gpu_kernel_execution_time_milliseconds"].buckets
    (bucket,) = [r["expr"] for r in rules if r["record"] == "gpu_kernel_execution_time_milliseconds_bucket"]
    pairs = re.findall(r'le=~"([^"]+)"\}, "le", "([^"]+)"', bucket)
    assert [to for _, to in pairs] == [f"{b:g}" for b in ms]
    for (matcher, _), s in zip(pairs, sec, strict=True):
        regex = re.compile(matcher.replace("\\\\", "\\"))
        spellings = {f"{s:g}"} | ({f"{s:g}.0"} if float(s).is_integer() else set())
        assert all(regex.fullmatch(x) for x in spellings), (matcher, spellings)
    assert 'le="+Inf"' in bucket
    assert {r["record"] for r in rules} == {f"gpu_kernel_execution_time_milliseconds_{p}" for p in
                                            ("bucket", "sum", "count")} | {"gpu_kernel_execution_time_percentile_milliseconds"}
