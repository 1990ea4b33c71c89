"""End to end: a real Prometheus (Debian `prometheus`) scrapes the simulated exporter and PromQL
by canonical name returns series for all three vendors."""

from __future__ import annotations

import json

import pytest

from tests.conftest import require_binary
from tests.e2e_util import (
    ProcessSet,
    prom_query,
    prom_targets,
    start_exporter,
    start_prometheus,
    wait_until,
)

JOB = "unified-gpu-exporter"
MODELS = {"nvidia": "NVIDIA H100 80GB HBM3", "amd": "AMD Instinct MI300X",
          "intel": "Intel Data Center GPU Max 1550"}
COUNTS = {"nvidia": 2, "amd": 2, "intel": 1}


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    binary = require_binary("prometheus", "prometheus")
    tmp = tmp_path_factory.mktemp("e2e-prometheus")
    with ProcessSet() as procs:
        exp = start_exporter(procs, tmp, ["--simulate", "--poll.interval", "500ms"])
        config = tmp / "prometheus.yml"
        config.write_text(json.dumps({  # JSON is YAML
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{
                "job_name": JOB,
                "static_configs": [{"targets": [exp.address], "labels": {"cloud": "aws"}}],
            }],
        }))
        server = start_prometheus(procs, binary, config, tmp)
        by_vendor = "count by (vendor) (gpu_compute_utilization_percent)"
        wait_until(lambda: len(prom_query(server, by_vendor)) == 3, 20, 0.2,
                   "series of three vendors in Prometheus")
        yield server


def test_query_by_canonical_name_returns_all_three_vendors(prom):
    result = prom_query(prom, "count by (vendor) (gpu_compute_utilization_percent)")
    counts = {r["metric"]["vendor"]: int(float(r["value"][1])) for r in result}
    assert counts == COUNTS


def test_exporter_target_is_up_without_scrape_errors(prom):
    result = prom_query(prom, f'up{{job="{JOB}"}}')
    assert [r["value"][1] for r in result] == ["1"]
    targets = [t for t in prom_targets(prom) if t["labels"]["job"] == JOB]
    assert len(targets) == 1
    assert targets[0]["health"] == "up" and targets[0]["lastError"] == ""
    # target labels reach the GPU series
    assert {r["metric"].get("cloud") for r in prom_query(prom, "gpu_info")} == {"aws"}


def test_gpu_info_join_adds_the_model(prom):
    expr = ("gpu_compute_utilization_percent"
            " * on (instance, vendor, gpu, uuid) group_left (model) gpu_info")
    result = prom_query(prom, expr)
    assert len(result) == sum(COUNTS.values())
    for r in result:
        labels = r["metric"]
        assert labels["model"] == MODELS[labels["vendor"]], labels
        assert 0 <= float(r["value"][1]) <= 100


def test_simulated_devices_are_marked(prom):
    result = prom_query(prom, 'count by (vendor) (gpu_info{simulated="true"})')
    assert {r["metric"]["vendor"]: int(r["value"][1]) for r in result} == COUNTS


def test_counters_have_rates(prom):
    def rates():
        return prom_query(prom, "sum by (vendor) (rate(gpu_energy_joules_total[5s]))")

    result = wait_until(lambda: len(rates()) == 3 and rates(), 10, 0.2, "energy rates")
    for r in result:
        assert float(r["value"][1]) > 0, r  # joules per second = watts, every GPU draws power


def test_self_metrics_are_scraped(prom):
    result = prom_query(prom, 'unified_gpu_exporter_source_up{source="simulator"}')
    assert [r["value"][1] for r in result] == ["1"]
    assert prom_query(prom, "unified_gpu_exporter_build_info")
