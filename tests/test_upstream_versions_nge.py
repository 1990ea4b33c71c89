"""utkuozdemir/nvidia_gpu_exporter across the releases and drivers users run, served from a local
HTTP server: every canonical value equal to the same GPU in the real v1.14 exec-backend capture.

Names come from nvidia-smi query fields and the exporter's unit rules ([W] -> _watts, [MHz] ->
_clock_hz x1e6, [MiB] -> _bytes x1048576, [%] -> _ratio x0.01), unchanged since v0.1.0
(internal/exporter/exporter.go at v0.1.0, v1.0.0, v1.2.0, v1.8.0, v1.14.0), so every mapped name is
the same in every release.  What changed: the driver's field names (clocks_throttle_reasons.*
before driver 535), names of [us]/[ms]/[W/s] fields (none mapped), and the NVML backend's
families (v1.12.0+).  The old-driver and NVML forms are BUILT from the real capture
(../shared/fixtures/nvidia/nvidia_gpu_exporter-h100-load.prom) and docs/METRICS.md @ e656cd81.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_upstream_samples import m
from tests.test_upstream_versions import mapped, self_samples, source

NGE = "nvidia_gpu_exporter"
Z = 'uuid="00000000-0000-0000-0000-000000000000"'   # the capture's masked UUID


@pytest.fixture(scope="module")
def v114(shared_fixtures: Path) -> str:
    return (shared_fixtures / "nvidia/nvidia_gpu_exporter-h100-load.prom").read_text()


def pre_535(text: str) -> str:
    """The same GPU on a driver before 535: clocks_throttle_reasons.*, no event-reason counters."""
    text = "\n".join(ln for ln in text.splitlines() if "clocks_event_reasons_counters" not in ln) + "\n"
    return text.replace("nvidia_smi_clocks_event_reasons_", "nvidia_smi_clocks_throttle_reasons_")


# the NVML backend (v1.12.0+, --backend nvml): nvml_return_code in place of command_exit_code,
# and its own families (names and label sets of docs/METRICS.md)
NVML_EXTRA = f"""\
# TYPE nvidia_smi_energy_joules_total counter
nvidia_smi_energy_joules_total{{{Z}}} 1234567.891
# TYPE nvidia_smi_xid_errors_total counter
nvidia_smi_xid_errors_total{{{Z},xid="13"}} 2
nvidia_smi_xid_errors_total{{{Z},xid="79"}} 1
# TYPE nvidia_smi_xid_last_timestamp_seconds gauge
nvidia_smi_xid_last_timestamp_seconds{{{Z},xid="13"}} 1767000000
nvidia_smi_xid_last_timestamp_seconds{{{Z},xid="79"}} 1767000100
# TYPE nvidia_smi_pcie_throughput_tx_bytes_per_second gauge
nvidia_smi_pcie_throughput_tx_bytes_per_second{{{Z}}} 1.5e+09
nvidia_smi_pcie_throughput_rx_bytes_per_second{{{Z}}} 2.5e+09
# TYPE nvidia_smi_nvml_return_code gauge
nvidia_smi_nvml_return_code 0
"""
NVML_SERIES = {
    m("gpu_energy_joules_total"): 1234567.891,
    m("gpu_xid_errors_total", xid="13"): 2,
    m("gpu_xid_errors_total", xid="79"): 1,
    m("gpu_xid_last_timestamp_seconds"): 1767000100,   # the latest of the codes
}
MIG_EXTRA = f"""\
nvidia_smi_mig_info{{compute_instance_id="0",gpu_instance_id="2",mig_uuid="292b7eb0-0beb-5abe-04b8-475f1ff17b99",profile="3g.40gb",{Z}}} 1
nvidia_smi_mig_memory_used_bytes{{gpu_instance_id="2",{Z}}} 1.0737418240e+10
nvidia_smi_mig_memory_free_bytes{{gpu_instance_id="2",{Z}}} 3.0064771072e+10
nvidia_smi_mig_memory_total_bytes{{gpu_instance_id="2",{Z}}} 4.0802189312e+10
nvidia_smi_mig_memory_reserved_bytes{{gpu_instance_id="2",{Z}}} 1.34217728e+08
nvidia_smi_mig_graphics_activity_ratio{{gpu_instance_id="2",{Z}}} 0.5
nvidia_smi_mig_sm_activity_ratio{{gpu_instance_id="2",{Z}}} 0.4
nvidia_smi_mig_sm_occupancy_ratio{{gpu_instance_id="2",{Z}}} 0.25
nvidia_smi_mig_tensor_activity_ratio{{gpu_instance_id="2",{Z}}} 0.125
nvidia_smi_mig_pcie_throughput_tx_bytes_per_second{{gpu_instance_id="2",{Z}}} 1e+08
nvidia_smi_mig_pcie_throughput_rx_bytes_per_second{{gpu_instance_id="2",{Z}}} 2e+08
"""
GI = {"gpu_instance": "2"}
MIG_SERIES = {
    m("gpu_memory_used_bytes", **GI): 10737418240,
    m("gpu_memory_free_bytes", **GI): 30064771072,
    m("gpu_memory_total_bytes", **GI): 40802189312,
    m("gpu_memory_reserved_bytes", **GI): 134217728,
    m("gpu_memory_utilization_percent", **GI): round(10737418240 / 40802189312 * 100, 6),   # derived
    m("gpu_compute_utilization_percent", **GI): 50,
    m("gpu_sm_active_percent", **GI): 40,
    m("gpu_compute_occupancy_percent", **GI): 25,
    m("gpu_tensor_utilization_percent", **GI): 12.5,
    m("gpu_profiling_available"): 1,
}


def nvml(text: str, extra: str = "") -> str:
    text = "\n".join(ln for ln in text.splitlines() if "nvidia_smi_command_exit_code" not in ln) + "\n"
    return text + NVML_EXTRA + extra


@pytest.mark.parametrize(("form", "extra"), [
    ("v1.14 exec, driver 590 (captured)", {}),
    ("exec, driver < 535", {}),
    ("v1.12+ nvml backend", NVML_SERIES),
    ("v1.12+ nvml backend, MIG", {**NVML_SERIES, **MIG_SERIES}),
])
def test_every_release_and_driver_gives_the_series_of_the_capture(server, mappings, v114, form, extra) -> None:
    body = {"v1.14 exec, driver 590 (captured)": v114, "exec, driver < 535": pre_535(v114),
            "v1.12+ nvml backend": nvml(v114), "v1.12+ nvml backend, MIG": nvml(v114, MIG_EXTRA)}[form]
    base = mapped(server, mappings, "/nge-base", v114, exporter=NGE)
    assert m("gpu_throttle_active", reason="idle") in base and m("gpu_clock_mhz", domain="sm") in base
    assert mapped(server, mappings, "/nge", body, exporter=NGE) == {**base, **extra}
    info = self_samples(source(server, "/nge", body, exporter=NGE))
    assert info["upstream_unknown_fields"]["value"] == 0, form   # every name served is known
    assert info["upstream_schema_info"]["schema"] == "nvidia-smi"


def test_a_name_no_release_served_is_counted(server, v114) -> None:
    """not_mapped lists names, not families: a field a new driver adds shows up as unknown."""
    body = v114 + f"nvidia_smi_memory_carveout_bytes{{{Z}}} 1\nnvidia_smi_ecc_errors_corrected_volatile_hbm3e{{{Z}}} 0\n"
    assert self_samples(source(server, "/nge-new", body, exporter=NGE))["upstream_unknown_fields"]["value"] == 2
    # the _ms names of v1.8.0 - v1.9.0 (driver 590's [ms] fields before v1.9.1) are known
    old_ms = v114 + f"nvidia_smi_power_smoothing_window_multiplier_ms{{{Z}}} 3\n"
    assert self_samples(source(server, "/nge-ms", old_ms, exporter=NGE))["upstream_unknown_fields"]["value"] == 0
