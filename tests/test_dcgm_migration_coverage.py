"""Issue 38: a migration from dcgm-exporter that loses nothing silently.

Every field of dcgm-exporter's default counter lists (3.0, 3.3, 4.8, 4.9, 4.10; the lists and
their sources: tests/upstream_versions/dcgm-exporter-default-counters.yaml) is recreated by the
compat rules, converted by the upstream collector's mapping, or dropped with a reason in
docs/dcgm-migration.md "Dropped" (and then logged once and counted). Read through the upstream
collector, XID, clock throttle reasons and the violation counters are converted, DCGM's blank
values are no value, and a remap failure and an XID make the shipped alerts fire (promtool)."""

from __future__ import annotations

import logging
import re
import subprocess
from types import SimpleNamespace

import pytest
import yaml

from exporter.map.mapper import Mapper
from exporter.map.store import SourceState, Store
from exporter.run.pipeline import poll_and_map
from exporter.run.runner import SourceRunner
from exporter.sources.context import SourceContext
from exporter.sources.upstream import UpstreamSource
from exporter.sources.upstream_events import REASON_FIELDS, XID_FIELDS
from exporter.sources.upstream_identity import EXPORTERS
from exporter.testing import flat, load_mappings
from tests.conftest import REPO, require_binary
from tests.test_upstream_http import ExporterServer, Route

LISTS = REPO / "tests" / "upstream_versions" / "dcgm-exporter-default-counters.yaml"
COMPAT = REPO / "deploy" / "prometheus" / "compat" / "dcgm-exporter.rules.yml"
DOC = REPO / "docs" / "dcgm-migration.md"
GENERATIONS = yaml.safe_load(LISTS.read_text())["generations"]


@pytest.fixture(scope="module")
def cm():
    return load_mappings().get("upstream/dcgm-exporter")


def recreated() -> set[str]:
    return {r["record"] for g in yaml.safe_load(COMPAT.read_text())["groups"] for r in g["rules"]}


def converted(cm) -> set[str]:
    """Raw names the mapping maps, the event-valued fields whose expansion it maps, and the label
    rows the dcgm-exporter identity reads (into gpu_info)."""
    raws = {r.partition("{")[0] for r in cm.rules}
    events = {f for f in XID_FIELDS if f"{f}.count" in raws} | {f for f in REASON_FIELDS if f"{f}.GpuIdle" in raws}
    identity = {"DCGM_FI_DRIVER_VERSION", "DCGM_FI_SYSTEM_DRIVER_VERSION", "DCGM_FI_DEV_SERIAL",
                "DCGM_FI_DEV_BOARD_SERIAL"} & EXPORTERS["dcgm-exporter"].identity_labels
    return raws | events | identity


def dropped_in_doc() -> dict[str, str]:
    """{field: kind} of the table under docs/dcgm-migration.md "## Dropped", whose rows must give a reason."""
    text = DOC.read_text()
    section = text[text.index("## Dropped"):]
    section = section[:section.index("\n## ", 3)]
    out = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            assert len(cells[2]) > 20, f"no reason given: {line}"
            for name in re.findall(r"`([A-Z0-9_]+)`", cells[0]):
                out[name] = cells[1]
    return out


@pytest.mark.parametrize("generation", sorted(GENERATIONS))
def test_every_default_counter_field_is_recreated_converted_or_dropped(generation, cm):
    g = GENERATIONS[generation]
    assert g["source"] and g["enabled"], generation
    known = recreated() | converted(cm) | set(dropped_in_doc())
    fields = g["enabled"] + g["optional"] + g["labels"]
    missing = sorted(f for f in fields if f not in known)
    assert not missing, (f"dcgm-exporter {generation}: neither recreated by the compat rules, converted by "
                         f"mappings/upstream/dcgm-exporter.yaml, nor listed in docs/dcgm-migration.md Dropped: {missing}")


def test_the_lists_hold_the_fields_the_issue_named(cm):
    """Remap rows/failure were the silent loss: enabled in every generation, and now recreated."""
    for generation, g in GENERATIONS.items():
        names = set(g["enabled"])
        assert {"DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_FAILED"} & names, generation
        assert {"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR"} & names, generation
    assert {"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            "DCGM_FI_DEV_ROW_REMAP_FAILURE"} <= recreated()


def test_dropped_metrics_are_the_mappings_not_mapped_so_they_are_logged_and_counted(cm):
    """A dropped metric must be in not_mapped (the upstream source logs it once and counts it in
    upstream_dropped_fields), and not_mapped names no metric the guide does not explain."""
    doc = dropped_in_doc()
    metrics = {n for n, kind in doc.items() if kind == "metric"}
    assert metrics <= set(cm.not_mapped)
    every = {f for g in GENERATIONS.values() for f in g["enabled"] + g["optional"]}
    assert set(cm.not_mapped) & every <= metrics


# ---------------------------------------------------------------- through the upstream collector
GPU = ('gpu="0",UUID="GPU-5b7c3a2e-9d41-4f6a-b8e2-1c0d9e8f7a65",pci_bus_id="00000000:1B:00.0",'
       'device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-a",DCGM_FI_DRIVER_VERSION="580.105.08"')


def scrape(xid: int, failure: int, reasons: int, thermal_ns: int, extra: str = "") -> str:
    return (f"DCGM_FI_DEV_GPU_UTIL{{{GPU}}} 97\n"
            f"DCGM_FI_DEV_MEMORY_TEMP{{{GPU}}} 9223372036854775794\n"  # DCGM_INT64_NOT_SUPPORTED
            f"DCGM_FI_DEV_POWER_USAGE{{{GPU}}} 140737488355328\n"       # DCGM_FP64_BLANK
            f"DCGM_FI_DEV_XID_ERRORS{{{GPU},err_code=\"{xid}\",err_msg=\"\"}} {xid}\n"
            f"DCGM_FI_DEV_ROW_REMAP_FAILURE{{{GPU}}} {failure}\n"
            f"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{{GPU}}} {reasons}\n"
            f"DCGM_FI_DEV_THERMAL_VIOLATION{{{GPU}}} {thermal_ns}\n"
            f"DCGM_FI_DEV_VGPU_LICENSE_STATUS{{{GPU}}} 0\n" + extra)


def run_polls(bodies: list[str], caplog=None):
    """Each body served in turn to one upstream source, polled and mapped 1 s apart: the last
    poll's canonical series, its malformed count and self samples."""
    srv = ExporterServer()
    try:
        srv.routes["/m"] = Route(body=bodies[0].encode())
        mappings = load_mappings()
        src = UpstreamSource(SourceContext(
            options={"targets": [{"name": "t", "url": srv.url("/m"), "exporter": "dcgm-exporter"}]},
            mappings=mappings))
        mapper, store, state = Mapper(mappings, interval=1.0), Store(), SourceState("upstream")
        store.add(state)
        src.open()
        for i, body in enumerate(bodies):
            srv.routes["/m"] = Route(body=body.encode())
            cycle = poll_and_map(src.poll, store, state, mapper, now=1000.0 + i)
            state.devices = cycle.devices
        src.close()
        series = {(n, tuple(sorted((k, v) for k, v in lb if k not in ("vendor", "gpu", "uuid")))): v
                  for (n, lb), v in flat(cycle.result.frames).items()}
        return series, cycle.result, cycle.sample
    finally:
        srv.close()


def test_xid_throttle_violation_and_remap_are_converted_and_blanks_are_no_value():
    series, result, sample = run_polls([scrape(0, 0, 0, 1000), scrape(79, 1, 0x44, 5000),
                                        scrape(79, 1, 0x44, 5000)])
    assert series[("gpu_xid_errors_total", (("xid", "79"),))] == 1  # the change 0 -> 79, once
    assert series[("gpu_memory_remapped_rows", (("state", "failure"),))] == 1
    assert series[("gpu_throttle_active", (("reason", "sw_power_cap"),))] == 1   # bit 0x4
    assert series[("gpu_throttle_active", (("reason", "hw_thermal"),))] == 1     # bit 0x40
    assert series[("gpu_throttle_active", (("reason", "idle"),))] == 0
    assert series[("gpu_throttle_active", (("reason", "thermal"),))] == 0        # the counter stood still
    # DCGM's blanks: no series, no error
    assert not [k for k in series if k[0] in ("gpu_power_watts", "gpu_temperature_celsius")]
    assert result.malformed == 0 and not sample.errors
    selfm = {(n, lb): v for n, lb, v in sample.self_samples}
    labels = (("target", "t"), ("exporter", "dcgm-exporter"))
    assert selfm[("upstream_unknown_fields", labels)] == 0
    assert selfm[("upstream_dropped_fields", labels)] == 1  # VGPU_LICENSE_STATUS


def test_a_new_xid_code_counts_and_a_violation_that_grows_reads_1():
    series, _, _ = run_polls([scrape(0, 0, 0, 1000), scrape(13, 0, 0, 1000), scrape(79, 0, 0, 900_000)])
    assert series[("gpu_xid_errors_total", (("xid", "13"),))] == 1
    assert series[("gpu_xid_errors_total", (("xid", "79"),))] == 1
    assert series[("gpu_throttle_active", (("reason", "thermal"),))] == 1


def test_a_malformed_value_is_counted_and_its_field_named(caplog):
    _, result, _ = run_polls([scrape(0, 0, 0, 1000, 'DCGM_FI_DEV_SM_CLOCK{' + GPU + '} -5\n')])
    assert result.malformed == 1 and result.malformed_fields == ["DCGM_FI_DEV_SM_CLOCK"]
    # the runner's warning names it at once, then stays quiet for MALFORMED_LOG_S
    runner = SimpleNamespace(state=SourceState("upstream"), malformed_logged=float("-inf"), malformed_since=0)
    with caplog.at_level(logging.WARNING, logger="unified_gpu_exporter"):
        SourceRunner._say_malformed(runner, result.malformed_fields)
        SourceRunner._say_malformed(runner, result.malformed_fields)
    lines = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    assert len(lines) == 1 and "DCGM_FI_DEV_SM_CLOCK" in lines[0]
    assert runner.malformed_since == 1


def test_dropped_fields_are_logged_once(caplog):
    with caplog.at_level(logging.INFO):
        run_polls([scrape(0, 0, 0, 1000)] * 3)
    lines = [r.getMessage() for r in caplog.records if "on purpose" in r.getMessage()]
    assert len(lines) == 1 and "DCGM_FI_DEV_VGPU_LICENSE_STATUS" in lines[0]


def _promtool_series(series: dict, minutes_absent: int) -> list[dict]:
    out = []
    for (name, labels), value in sorted(series.items()):
        lb = ", ".join(f'{k}="{v}"' for k, v in (("instance", "n1:9632"), ("job", "gpu"), ("vendor", "nvidia"),
                                                  ("gpu", "0"), ("uuid", "GPU-5b7c3a2e-9d41-4f6a-b8e2-1c0d9e8f7a65"),
                                                  *labels))
        out.append({"series": f"{name}{{{lb}}}", "values": f"{'_x' + str(minutes_absent) + ' ' if minutes_absent else ''}{value:g}x20"})
    return out


def test_remap_failure_and_xid_through_upstream_fire_the_shipped_alerts(tmp_path):
    """The canonical series the upstream collector makes of a dcgm-exporter scrape with a remap
    failure and XID 79, as Prometheus would scrape them, fire GPURowRemapFailure and GPUXidCritical
    of deploy/prometheus/rules (promtool test rules)."""
    promtool = require_binary("promtool", "prometheus")
    before, _, _ = run_polls([scrape(0, 0, 0, 1000)] * 2)
    after, _, _ = run_polls([scrape(0, 0, 0, 1000), scrape(79, 1, 0, 1000)])
    inputs = _promtool_series(before, 0)
    inputs += _promtool_series({k: v for k, v in after.items() if k not in before or k[0] == "gpu_memory_remapped_rows"}, 5)
    # the failure row existed at 0 before: its samples from minute 5 on say 1
    inputs = [i for i in inputs if not (i["series"].startswith("gpu_memory_remapped_rows") and
                                       i["values"].startswith("0x20") and 'state="failure"' in i["series"])]
    inputs.append({"series": next(i["series"] for i in _promtool_series(after, 0) if 'state="failure"' in i["series"]),
                   "values": "0x4 1x16"})
    test = {
        "rule_files": [str(p) for p in sorted((REPO / "deploy" / "prometheus" / "rules").glob("*.yml"))],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": inputs,
            "promql_expr_test": [
                {"expr": 'count by (alertname) (ALERTS{alertstate="firing", alertname=~"GPURowRemapFailure|GPUXidCritical"})',
                 "eval_time": "3m", "exp_samples": []},
                {"expr": 'count by (alertname) (ALERTS{alertstate="firing", alertname=~"GPURowRemapFailure|GPUXidCritical"})',
                 "eval_time": "8m", "exp_samples": [{"labels": '{alertname="GPURowRemapFailure"}', "value": 1},
                                                     {"labels": '{alertname="GPUXidCritical"}', "value": 1}]},
            ]}],
    }
    path = tmp_path / "upstream-alerts.test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    out = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr + path.read_text()
