"""The canonical schema loads, rejects bad definitions, and docs/metrics.md matches it."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.docs import render
from exporter.map.schema import load_schema
from exporter.yamlfile import ConfigError

REPO = Path(__file__).resolve().parent.parent


def test_canonical_schema_has_the_seed_metrics():
    schema = load_schema()
    for name in ["gpu_compute_utilization_percent", "gpu_compute_occupancy_percent",
                 "gpu_memory_utilization_percent", "gpu_memory_bandwidth_utilization_percent",
                 "gpu_memory_bandwidth_gbps", "gpu_memory_latency_nanoseconds",
                 "gpu_memory_arbitration_stalls_percent", "gpu_clock_mhz", "gpu_temperature_celsius",
                 "gpu_power_watts", "gpu_info", "gpu_memory_used_bytes", "gpu_memory_total_bytes",
                 "gpu_memory_reserved_bytes", "gpu_energy_joules_total", "gpu_power_limit_watts",
                 "gpu_throttle_active", "gpu_pcie_bytes_total", "gpu_interconnect_bytes_total",
                 "gpu_ecc_errors_total", "gpu_xid_errors_total"]:
        assert name in schema.metrics, name
    assert schema.device_labels == ["vendor", "gpu", "uuid"]
    # derived metrics come after their derived operands
    order = [n for n, _ in schema.derived()]
    assert order.index("gpu_memory_peak_bandwidth_gbps") < order.index("gpu_memory_bandwidth_gbps")


def test_docs_metrics_md_is_up_to_date():
    expected = render(load_schema())
    actual = (REPO / "docs" / "metrics.md").read_text()
    assert actual == expected, "docs/metrics.md is stale: run `make docs`"


@pytest.mark.parametrize("body, where, message", [
    # the schema's own checks name the metric they are about: its line, not the file's first
    ("version: 1\ndevice_labels: [vendor]\nmetrics:\n  bad_total:\n    type: gauge\n    help: x\n",
     ":4: metrics.bad_total:", "only counters may end in _total"),
    ("version: 1\ndevice_labels: [vendor]\nmetrics:\n  m:\n    type: histogramm\n    help: x\n",
     ":5:", "metrics.m.type"),
    ("version: 1\ndevice_labels: [vendor]\nmetrics:\n  m:\n    type: gauge\n    help: x\n"
     "    derive: {ratio: [a, b]}\n", ":7: metrics.m.derive:", "unknown metric 'a'"),
])
def test_invalid_schema_names_file_line_and_field(tmp_path, body, where, message):
    path = tmp_path / "canonical.yaml"
    path.write_text(body)
    with pytest.raises(ConfigError) as exc:
        load_schema(path)
    text = str(exc.value)
    assert str(path) + where in text
    assert message in text
