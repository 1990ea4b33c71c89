"""A zero is not always a value: profiling counters that all read 0 (or DCGM's blanks) on a busy GPU
are skipped and counted (profiling_unavailable) and gpu_profiling_available reads 0 -- for an
upstream dcgm-exporter (every naming generation), AMD DME's profiler fields, our DCGM source and
NVML GPM; and through the real daemon, with its self-metrics."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from exporter.map.mapper import Mapper
from exporter.model import PollResult
from exporter.sources.dcgm import DcgmSource
from exporter.testing import flat
from tests.fakes import pynvml_fake as pf
from tests.reliability_util import ExporterProcess
from tests.test_dcgm_source import fake_bindings
from tests.test_nvml_source import make as make_nvml
from tests.test_nvml_source import poll as poll_nvml
from tests.test_upstream_http import ExporterServer, Route
from tests.test_upstream_samples import canon, m
from tests.test_upstream_versions import DATA
from tests.test_upstream_versions import source as upstream_source

PROF = ("gpu_compute_occupancy_percent", "gpu_sm_active_percent", "gpu_tensor_utilization_percent")
FP64_BLANK = "140737488355328"


def map_polls(src, mappings, polls: int = 1) -> tuple[dict, PollResult]:
    """Open ``src``, poll it ``polls`` times, map the last poll: (canon series, the poll)."""
    src.open()
    try:
        for _ in range(polls):
            sample = src.poll()
            sample.monotonic = time.monotonic()
    finally:
        src.close()
    devices = {d.key: d for d in sample.devices}
    return canon(flat(Mapper(mappings).map(sample, devices).frames)), sample


def prof_lines(text: str, value: str) -> str:
    """Every DCGM_FI_PROF_* activity line of ``text`` with ``value`` (PCIe byte rates kept)."""
    return re.sub(r"^(DCGM_FI_PROF_(?!PCIE)\w+\{.*\}) \S+$", rf"\1 {value}", text, flags=re.MULTILINE)


def util_line(text: str, value: str) -> str:
    return re.sub(r"^(DCGM_FI_DEV_GPU_UTIL(?:_RATIO)?\{.*\}) \S+$", rf"\1 {value}", text, flags=re.MULTILINE)


@pytest.mark.parametrize(("name", "busy"), [("dcgm-exporter-3.3.prom", "97"), ("dcgm-exporter-4.8-dcgm46-names.prom", "97"),
                                            ("dcgm-exporter-4.9.prom", "0.97"), ("dcgm-exporter-4.10.prom", "0.97")])
def test_busy_gpu_with_all_zero_profiling_fields(server, mappings, name, busy) -> None:
    text = util_line(prof_lines((DATA / name).read_text(), "0"), busy)
    got, sample = map_polls(upstream_source(server, f"/zero-{name}", text), mappings)
    for metric in PROF:
        assert m(metric) not in got, metric
    assert got[m("gpu_profiling_available")] == 0
    assert got[m("gpu_compute_utilization_percent")] == 97          # GPU_UTIL, not a profiling field
    assert got[m("gpu_memory_bandwidth_utilization_percent")] == 61  # MEM_COPY_UTIL takes over from DRAM_ACTIVE
    # GR_ENGINE, SM_ACTIVE, SM_OCCUPANCY, TENSOR, DRAM: skipped and counted, not malformed
    assert sample.errors["profiling_unavailable"] == 5 and not sample.errors["malformed_value"]


def test_idle_gpu_zeros_are_values(server, mappings) -> None:
    text = util_line(prof_lines((DATA / "dcgm-exporter-4.9.prom").read_text(), "0"), "0.03")
    got, sample = map_polls(upstream_source(server, "/idle", text), mappings)
    assert got[m("gpu_compute_occupancy_percent")] == 0 and got[m("gpu_profiling_available")] == 1
    assert got[m("gpu_memory_bandwidth_utilization_percent")] == 0  # DRAM_ACTIVE 0: a value
    assert not sample.errors["profiling_unavailable"]


def test_one_nonzero_profiling_field_keeps_them_all(server, mappings) -> None:
    text = prof_lines((DATA / "dcgm-exporter-4.9.prom").read_text(), "0")
    text = re.sub(r"^(DCGM_FI_PROF_SM_UTIL_RATIO\{.*\}) \S+$", r"\1 0.02", text, flags=re.MULTILINE)
    got, sample = map_polls(upstream_source(server, "/one", text), mappings)
    assert got[m("gpu_sm_active_percent")] == 2 and got[m("gpu_compute_occupancy_percent")] == 0
    assert got[m("gpu_profiling_available")] == 1 and not sample.errors["profiling_unavailable"]


def test_blank_sentinels_are_unavailable_not_malformed(server, mappings) -> None:
    """Old dcgm-exporter releases printed DCGM's blanks (2^47 for FP64 fields) as values."""
    text = prof_lines((DATA / "dcgm-exporter-3.3.prom").read_text(), FP64_BLANK)
    got, sample = map_polls(upstream_source(server, "/blank", text), mappings)
    assert not any(k[0] in PROF for k in got) and got[m("gpu_profiling_available")] == 0
    assert sample.errors["profiling_unavailable"] == 5 and not sample.errors["malformed_value"]


def test_amd_dme_profiler_zero_on_a_busy_gpu(server, mappings) -> None:
    body = ('gpu_gfx_activity{gpu_id="0",serial_number="S0"} 95\n'
            'gpu_prof_occupancy_percent{gpu_id="0",serial_number="S0"} 0\n'
            'gpu_prof_tensor_active_percent{gpu_id="0",serial_number="S0"} 0\n')
    src = upstream_source(server, "/dme-prof", body, exporter="amd-device-metrics-exporter")
    got, sample = map_polls(src, mappings)
    assert got == {m("gpu_compute_utilization_percent"): 95, m("gpu_profiling_available"): 0}
    assert sample.errors["profiling_unavailable"] == 2
    busy = body.replace("occupancy_percent{gpu_id=\"0\",serial_number=\"S0\"} 0", "occupancy_percent{gpu_id=\"0\",serial_number=\"S0\"} 40")
    got, _ = map_polls(upstream_source(server, "/dme-prof2", busy, exporter="amd-device-metrics-exporter"), mappings)
    assert got[m("gpu_compute_occupancy_percent")] == 40 and got[m("gpu_profiling_available")] == 1


def test_dcgm_source_busy_gpu_with_zero_dcp_fields(mappings) -> None:
    values = {0: {203: 99, 1001: 0.0, 1002: 0.0, 1003: 0.0, 1004: 0.0, 1005: 0.0, 1009: 1000.0}}
    mods, _ = fake_bindings(values)
    got, sample = map_polls(DcgmSource(module=mods), mappings)
    assert got == {m("gpu_compute_utilization_percent"): 99, m("gpu_profiling_available"): 0}
    assert sample.errors["profiling_unavailable"] == 4  # 1002-1005 (1001 and 1009 are not mapped)
    values[0][1003] = 0.25
    got, _ = map_polls(DcgmSource(module=fake_bindings(values)[0]), mappings)
    assert got[m("gpu_compute_occupancy_percent")] == 25 and got[m("gpu_profiling_available")] == 1


def test_dcgm_field_203_as_a_float_is_not_read_as_a_percent(mappings) -> None:
    """Field 203 is DCGM_FT_INT64 0-100 % (DCGM 4.6.0); a float for it would be a redefined unit
    (a 0-1 ratio): skipped and counted, not exported as 0.97 %."""
    values = {0: {203: 0.97, 1003: 0.25}}
    got, sample = map_polls(DcgmSource(module=fake_bindings(values)[0]), mappings)
    assert m("gpu_compute_utilization_percent") not in got
    assert sample.errors["unit_ambiguous"] == 1 and got[m("gpu_compute_occupancy_percent")] == 25
    values[0][203] = 97
    got, sample = map_polls(DcgmSource(module=fake_bindings(values)[0]), mappings)
    assert got[m("gpu_compute_utilization_percent")] == 97 and sample.errors["unit_ambiguous"] == 0


def test_gpm_busy_gpu_with_zero_metrics(mappings) -> None:
    gpu = pf.h100(0)
    gpu["gpm"] = {k: 0.0 for k in gpu["gpm"]}
    fake, clock, src = make_nvml([gpu])
    try:
        poll_nvml(src, fake, clock)      # seeds GPM
        sample = poll_nvml(src, fake, clock)
        sample.monotonic = time.monotonic()
    finally:
        src.close()
    got = canon(flat(Mapper(mappings).map(sample, {d.key: d for d in sample.devices}).frames))
    assert got[m("gpu_compute_utilization_percent")] == 100   # utilization.gpu
    assert not any(k[0] in PROF for k in got) and got[m("gpu_profiling_available")] == 0
    assert got[m("gpu_memory_bandwidth_utilization_percent")] == 11  # utilization.memory takes over
    assert sample.errors["profiling_unavailable"] == 4


# ------------------------------------------------------------------ through the real daemon

def _daemon(tmp_path: Path, server: ExporterServer) -> ExporterProcess:
    text = util_line(prof_lines((DATA / "dcgm-exporter-4.9.prom").read_text(), "0"), "0.97")
    server.routes["/busy-zero"] = Route(body=text.encode())
    cfg = tmp_path / "c.yaml"
    cfg.write_text("collectors:\n  upstream:\n    enabled: true\n    interval: 1s\n    options:\n      targets:\n"
                   f"        - {{name: dcgm, url: '{server.url('/busy-zero')}', exporter: dcgm-exporter}}\n")
    return ExporterProcess(["--config.file", str(cfg)], tmp_path, ready=b"gpu_profiling_available{")


def _wait_for(exp: ExporterProcess, pattern: str, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = exp.scrape()
        if re.search(pattern, text, re.MULTILINE):
            return text
        time.sleep(0.1)
    raise AssertionError(f"{pattern!r} not in the exposition:\n{text}")


def test_daemon_exports_the_unavailability_and_the_schema(tmp_path, server) -> None:
    exp = _daemon(tmp_path, server)
    try:
        text = _wait_for(exp, r'^unified_gpu_exporter_source_errors_total\{kind="profiling_unavailable",'
                              r'source="upstream"\} [1-9]')
    finally:
        exp.stop()
    assert re.search(r'^gpu_profiling_available\{.*\} 0(\.0)?$', text, re.MULTILINE)
    assert not re.search(r"^gpu_compute_occupancy_percent\{", text, re.MULTILINE)
    assert re.search(r'^unified_gpu_exporter_upstream_schema_info\{exporter="dcgm-exporter",schema="dcgm-4.7",'
                     r'source="upstream",target="dcgm"\} 1', text, re.MULTILINE)
    assert re.search(r'^unified_gpu_exporter_upstream_unknown_fields\{exporter="dcgm-exporter",'
                     r'source="upstream",target="dcgm"\} 0', text, re.MULTILINE)


def test_daemon_reads_unknown_not_healthy(tmp_path, server) -> None:
    exp = _daemon(tmp_path, server)
    try:
        text = _wait_for(exp, r'^gpu_memory_state_info\{', timeout=20.0)
        text = _wait_for(exp, r'^gpu_memory_state_info\{.*reason="profiling_unavailable".*state="unknown".*\} 1',
                         timeout=10.0)
    finally:
        exp.stop()
    assert re.search(r'^gpu_memory_state\{.*state="unknown".*\} 1', text, re.MULTILINE)


def test_daemon_with_gpm_reading_zero_on_a_busy_gpu_reads_unknown(tmp_path) -> None:
    """Our own NVML source: the faithful fake H100 at 99 % utilization with every GPM metric 0
    (another profiler holds the counters) and one busy process, through the real daemon
    (tests.fakes.nvml_exporter).  With two busy processes the session no longer hides the
    co-tenancy (issue 36, tests/test_cotenancy_truth.py)."""
    empty_sys = tmp_path / "sys"
    empty_sys.mkdir()
    exp = ExporterProcess(["--path.sysfs", str(empty_sys), "--poll.interval", "500ms",
                           "--state.dir", str(tmp_path / "state")], tmp_path, ready_timeout=30.0,
                          ready=b"gpu_profiling_available{", module="tests.fakes.nvml_exporter",
                          env={"FAKE_NVML_GPUS": "h100_gpm_held_alone"})
    try:
        text = _wait_for(exp, r'^gpu_memory_state_info\{.*reason="profiling_unavailable".*state="unknown".*\} 1',
                         timeout=30.0)
    finally:
        exp.stop()
    assert re.search(r'^gpu_profiling_available\{.*\} 0(\.0)?$', text, re.MULTILINE)
    assert re.search(r'^gpu_compute_utilization_percent\{.*vendor="nvidia"\} 99(\.0)?$', text, re.MULTILINE)
    for metric in PROF:  # the zeros are not exported as values
        assert not re.search(rf"^{metric}\{{", text, re.MULTILINE), metric
    assert re.search(r'^unified_gpu_exporter_source_errors_total\{kind="profiling_unavailable",source="nvml"\} [1-9]',
                     text, re.MULTILINE)
    assert not re.search(r'^gpu_memory_state_info\{.*state="(idle|healthy)".*\} 1', text, re.MULTILINE)


# ------------------------------------------------------------------ mapping file checks

@pytest.mark.parametrize(("body", "message"), [
    ("fields:\n  - {raw: e, metric: gpu_energy_joules_total, profiling: true}\n",
     r"fields\[0\].metric: profiling: applies to gauges mapped as read"),
    ("profiling_guard: {busy_metric: gpu_no_such_metric}\nfields:\n"
     "  - {raw: o, metric: gpu_compute_occupancy_percent, profiling: true}\n",
     r"x.yaml:2: profiling_guard.busy_metric: unknown canonical metric 'gpu_no_such_metric'"),
    ("schemas: [{name: a}, {name: a}]\nfields: []\n", r"schemas: names must be unique"),
    ("schemas: [{name: 'a b'}]\nfields: []\n", r"schemas.0.name|schemas\[0\].name"),
])
def test_bad_profiling_and_schema_entries_name_file_and_line(tmp_path, body, message) -> None:
    from exporter.map.mapping import load_mapping
    from exporter.map.schema import default_mappings_dir, load_schema
    from exporter.yamlfile import ConfigError
    path = tmp_path / "x.yaml"
    path.write_text("vendor: nvidia\n" + body)
    with pytest.raises(ConfigError, match=message):
        load_mapping(path, load_schema(default_mappings_dir() / "canonical.yaml"))
