"""An NVIDIA-only node with default flags (issue 15): the backends it does not have are reported
absent, not down; no GPUExporterSourceDown exists to inhibit anything, and the node's memory
contention alert reaches the platform team through a real Prometheus and a real Alertmanager.

The NVIDIA GPU is the faithful NVML fake (an H100 whose GPM reports 88.5 % DRAM bandwidth at
38.25 % SM occupancy); everything else (DCGM, amdgpu/Intel sysfs on an empty tree, amdsmi,
Level Zero) is looked for exactly as on a real node.
"""

from __future__ import annotations

import json
import sys

import yaml

from tests.conftest import REPO, require_binary
from tests.e2e_util import (
    ProcessSet,
    Server,
    WebhookReceiver,
    free_port,
    http_get,
    prom_query,
    start_alertmanager,
    start_prometheus,
    wait_until,
)
from tests.test_e2e_alerting import prepare_alertmanager_config, prepare_prometheus_dir

RULES = REPO / "deploy" / "prometheus" / "rules" / "unified-gpu-exporter.alerts.yml"


def _source_down_expr() -> str:
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "GPUExporterSourceDown":
                return rule["expr"]
    raise AssertionError("GPUExporterSourceDown not in the shipped rules")


def test_nvidia_only_node_has_no_source_down_and_its_contention_alert_is_delivered(tmp_path):
    prometheus = require_binary("prometheus", "prometheus")
    alertmanager = require_binary("prometheus-alertmanager", "prometheus-alertmanager")
    prom_dir = prepare_prometheus_dir(tmp_path)
    empty_sys = tmp_path / "sys"
    empty_sys.mkdir()
    port = free_port()
    # per-process utilization is the co-tenancy evidence: the fake H100's two active processes
    # make its memory-bound signature "contended" (docs/detection.md)
    config = tmp_path / "config.yml"
    config.write_text("collectors: {nvml: {options: {processes: true}}}\n")
    with WebhookReceiver() as receiver, ProcessSet() as procs:
        am = start_alertmanager(procs, alertmanager, prepare_alertmanager_config(tmp_path, receiver.url),
                                tmp_path)
        exporter = procs.add(Server(
            "exporter", [sys.executable, "-m", "tests.fakes.nvml_exporter",
                         "--web.listen-address", f"127.0.0.1:{port}", "--path.sysfs", str(empty_sys),
                         "--poll.interval", "500ms", "--state.dir", str(tmp_path / "state"),
                         "--config.file", str(config)],
            port, tmp_path / "exporter.log", env={"PYTHONUNBUFFERED": "1", "FAKE_NVML_GPUS": "h100",
                                                 "PATH": "/usr/bin:/bin"},
            listen_log=rf"\baddress=127\.0\.0\.1:{port}\b"))
        exporter.start().wait_ready("/readyz", 20)

        text = http_get(exporter.url + "/metrics").text
        lines = [ln for ln in text.splitlines() if ln.startswith("unified_gpu_exporter_source_")]
        assert 'unified_gpu_exporter_source_up{source="nvml"} 1' in text, "\n".join(lines)
        ups = [ln for ln in lines if ln.startswith("unified_gpu_exporter_source_up{")]
        assert all(ln.split()[-1] in ("1", "1.0") for ln in ups), ups  # no source_up 0
        for name in ("dcgm", "amdgpu", "intel"):
            assert any(ln.startswith('unified_gpu_exporter_source_enabled{') and f'source="{name}"' in ln
                       and 'state="absent"' in ln for ln in lines), (name, lines)

        targets = prom_dir / "e2e-targets"
        (targets / "exporter.json").write_text(json.dumps([{"targets": [exporter.address]}]))
        (targets / "alertmanager.json").write_text(json.dumps([{"targets": [am.address]}]))
        prom = start_prometheus(procs, prometheus, prom_dir / "prometheus-e2e.yml", tmp_path)

        wait_until(lambda: prom_query(prom, 'unified_gpu_exporter_source_enabled{state="absent"}'),
                   60, 0.5, "the absent sources scraped")
        assert prom_query(prom, _source_down_expr()) == []
        assert prom_query(prom, "unified_gpu_exporter_source_up == 0") == []

        got = wait_until(lambda: receiver.alerts("GPUMemoryContention"), 120, 0.5,
                         "GPUMemoryContention at the webhook receiver")
        assert {path for path, _ in got} == {"/platform-team"}
        labels = got[0][1]["labels"]
        assert labels["vendor"] == "nvidia" and labels["gpu"] == "0"
        alerts = json.loads(http_get(am.url + "/api/v2/alerts").text)
        mine = [a for a in alerts if a["labels"]["alertname"] == "GPUMemoryContention"]
        assert mine and all(a["status"]["state"] == "active" and not a["status"]["inhibitedBy"]
                            for a in mine), mine
        assert not [a for a in alerts if a["labels"]["alertname"] == "GPUExporterSourceDown"]
