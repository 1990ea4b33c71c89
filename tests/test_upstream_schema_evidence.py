"""A name whose spelling stayed but whose unit changed is never guessed.

``DCGM_FI_DEV_GPU_UTIL_RATIO`` is field 203 in 0-100 % under DCGM 4.6 (dcgm-exporter 4.8.3/4.8.4
with a custom CSV) and a 0-1 ratio under DCGM 4.7 (4.9+).  Each case serves a target from a
local HTTP server and reads it through the upstream source and the shipped mapping set: the
unit is taken only when names, HELP text and values agree (or the operator pins the schema);
otherwise the field is skipped, counted as ``unit_ambiguous`` and the target's schema reads
``dcgm-ambiguous``.  The bodies are built from tests/upstream_versions (see SOURCES.md there).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from exporter.run.daemon import Daemon, Settings
from exporter.sources.upstream import UpstreamSource
from exporter.testing import map_source_once
from exporter.yamlfile import ConfigError
from tests.test_upstream_samples import m
from tests.test_upstream_versions import DATA, mapped, source

UTIL = m("gpu_compute_utilization_percent")
_LABELS = ('gpu="{gpu}",UUID="GPU-5b7c3a2e-9d41-4f6a-b8e2-1c0d9e8f7a6{gpu}",pci_bus_id="00000000:1{gpu}:00.0",'
           'hostname="node-a"')


def util_body(*values: float, help_text: str = "", extra: str = "") -> str:
    """GPU_UTIL_RATIO of one GPU per value, plus a DCGM 4.6 name (the lower bound 4.6) and
    ``extra`` lines; no driver label, no FB fields."""
    out = [f"# HELP DCGM_FI_DEV_GPU_UTIL_RATIO {help_text}"] if help_text else []
    for gpu, v in enumerate(values):
        out.append(f"DCGM_FI_DEV_GPU_UTIL_RATIO{{{_LABELS.format(gpu=gpu)}}} {v:g}")
        out.append(f"DCGM_FI_DEV_GPU_TEMP_CELSIUS{{{_LABELS.format(gpu=gpu)}}} 50")
    return "\n".join(out) + "\n" + extra


def poll(src: UpstreamSource):
    src.open()
    try:
        return src.poll()
    finally:
        src.close()


def schema_and_ambiguous(server, path: str, body: str, **extra) -> tuple[str, int]:
    sample = poll(source(server, path, body, **extra))
    info = {name: dict(labels) for name, labels, _ in sample.self_samples}
    return info["upstream_schema_info"]["schema"], sample.errors["unit_ambiguous"]


def utils(server, mappings, path: str, body: str, **extra) -> list[float]:
    """gpu_compute_utilization_percent of every GPU (device labels kept apart)."""
    got = map_source_once(source(server, path, body, **extra), mappings=mappings)
    return sorted(round(v, 6) for (name, _), v in got.items() if name == UTIL[0])


def test_a_4_9_custom_csv_without_fb_or_driver_label_reads_the_ratio(server, mappings) -> None:
    """The headline 100x error: 4.9 with a custom CSV of GPU_UTIL_RATIO and PROF *_RATIO, no FB
    field, no driver label.  The names only prove "DCGM 4.6 or newer"; 0.97 cannot be the INT64
    percent of field 203, so it is the ratio: 97 %, not 0.97 %."""
    text = (DATA / "dcgm-exporter-4.9.prom").read_text()
    text = re.sub(r',DCGM_FI_SYSTEM_DRIVER_VERSION="[^"]*"', "", text)
    text = "\n".join(ln for ln in text.splitlines()
                     if not re.search(r"FB_|_UTIL_RATIO[{ ].*|HELP DCGM_FI_DEV_GPU_UTIL_RATIO", ln)
                     or ln.startswith(("DCGM_FI_DEV_GPU_UTIL_RATIO", "DCGM_FI_PROF_"))) + "\n"
    assert "FB_" not in text and "SYSTEM_DRIVER" not in text and "HELP DCGM_FI_DEV_GPU_UTIL_RATIO" not in text
    assert "DCGM_FI_DEV_GPU_UTIL_RATIO{" in text and "DCGM_FI_PROF_SM_UTIL_RATIO{" in text
    got = mapped(server, mappings, "/49-custom", text)
    assert got[UTIL] == 97
    assert schema_and_ambiguous(server, "/49-custom", text) == ("dcgm-4.7", 0)


def test_a_4_8_custom_csv_with_dcgm_4_6_names_reads_percent(server, mappings) -> None:
    """DCGM_FI_SYSTEM_DRIVER_VERSION is the DCGM 4.6 name of field 1, so a 4.8.3/4.8.4 CSV of 4.6
    names carries it: it proves 4.6 or newer, not 4.7.  97 cannot be a ratio: 97 %."""
    text = (DATA / "dcgm-exporter-4.8-dcgm46-names.prom").read_text()
    assert 'DCGM_FI_SYSTEM_DRIVER_VERSION="' in text
    assert utils(server, mappings, "/48-46", text) == [97]
    assert schema_and_ambiguous(server, "/48-46", text) == ("dcgm-4.6", 0)


def test_a_value_that_proves_nothing_is_skipped_counted_and_shown(server, mappings) -> None:
    """1 is 1 % or 100 %: with no HELP and names that prove only 4.6+, not mapped (counted);
    the schema reported is what the names prove, "dcgm-4.6 or newer" (nothing contradicts it)."""
    body = util_body(1)
    assert utils(server, mappings, "/amb", body) == []
    assert schema_and_ambiguous(server, "/amb", body) == ("dcgm-4.6", 1)


def test_one_gpu_with_a_fraction_proves_the_unit_of_the_whole_target(server, mappings) -> None:
    body = util_body(1, 0.5)
    assert utils(server, mappings, "/two", body) == [50, 100]
    assert schema_and_ambiguous(server, "/two", body) == ("dcgm-4.7", 0)


def test_zero_is_zero_in_every_unit(server, mappings) -> None:
    """An idle GPU (0) reads 0 whichever the unit: mapped, not ambiguous."""
    assert utils(server, mappings, "/zero", util_body(0)) == [0]
    assert schema_and_ambiguous(server, "/zero", util_body(0)) == ("dcgm-4.6", 0)


@pytest.mark.parametrize(("help_text", "want", "schema"), [
    ("GPU utilization (ratio 0-1).", 100, "dcgm-4.7"),
    ("Fraction of time a kernel ran (0.0 to 1.0)", 100, "dcgm-4.7"),
])
def test_the_help_text_decides_a_value_that_does_not(server, mappings, help_text, want, schema) -> None:
    body = util_body(1, help_text=help_text)
    assert utils(server, mappings, "/help", body) == [want]
    assert schema_and_ambiguous(server, "/help", body) == (schema, 0)


@pytest.mark.parametrize(("body", "why"), [
    # FB_CAPACITY_BYTES exists from DCGM 4.7 on, where GPU_UTIL_RATIO is a ratio: 97 cannot be one
    (util_body(97, extra='DCGM_FI_DEV_FB_CAPACITY_BYTES{gpu="0",UUID="GPU-5b7c3a2e-9d41-4f6a-b8e2-1c0d9e8f7a60",'
                         'pci_bus_id="00000000:10:00.0",hostname="node-a"} 85520809984\n'), "names say 4.7, value says %"),
])
def test_signals_that_disagree_are_not_mapped(server, mappings, body, why) -> None:
    assert utils(server, mappings, "/conflict", body) == [], why
    assert schema_and_ambiguous(server, "/conflict", body) == ("dcgm-ambiguous", 1), why


@pytest.mark.parametrize(("pin", "body", "want"), [
    ("dcgm-4.6", util_body(1), [1]),
    ("dcgm-4.7", util_body(1), [100]),
    # the operator's word beats a copied HELP text ...
    ("dcgm-4.7", util_body(0.97, help_text="GPU utilization (in %)."), [97]),
    # ... but not a value the pinned unit cannot have
    ("dcgm-4.7", util_body(97), []),
    ("dcgm-4.6", util_body(0.97), []),
])
def test_a_pinned_schema(server, mappings, pin, body, want) -> None:
    assert utils(server, mappings, "/pin", body, schema=pin) == want
    schema, ambiguous = schema_and_ambiguous(server, "/pin", body, schema=pin)
    assert (schema, ambiguous) == ((pin, 0) if want else ("dcgm-ambiguous", 1))


def test_the_pin_must_name_a_schema_of_the_exporter(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text("collectors:\n  upstream:\n    options:\n      targets:\n"
                   "        - name: d\n          url: http://127.0.0.1:1/metrics\n          exporter: dcgm-exporter\n"
                   "          max_series: 5000\n          max_label_values: 100\n          schema: dcgm-4.9\n")
    with pytest.raises(ConfigError) as info:
        Daemon(Settings(config_path=cfg)).load()
    assert (f"{cfg}:10: collectors.upstream.options.targets[0].schema: 'dcgm-4.9' is not a schema of "
            "dcgm-exporter (known: dcgm-4.8, dcgm-4.7, dcgm-4.6, legacy)") in str(info.value)
    cfg.write_text(cfg.read_text().replace("dcgm-4.9", "dcgm-4.7"))
    daemon = Daemon(Settings(config_path=cfg))
    daemon.load()
    target, = daemon.config.collector("upstream").options.targets
    assert (target.schema_pin, target.max_series, target.max_label_values) == ("dcgm-4.7", 5000, 100)
