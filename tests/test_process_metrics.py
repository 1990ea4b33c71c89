"""The exporter serves the standard process_* metrics and its CPU per pipeline stage."""

from __future__ import annotations

import asyncio
import os
import re
import resource
import time

from exporter.render import process_metrics
from exporter.run.daemon import Daemon, Settings


def _values(text: bytes, name: str) -> dict[str, float]:
    out = {}
    for labels, value in re.findall(rb"^" + name.encode() + rb"(\{[^}]*\})? (\S+)$", text, re.M):
        out[labels.decode()] = float(value)
    return out


def test_process_values_match_what_the_kernel_says():
    got = process_metrics.sample()
    t = os.times()
    assert 0 < got["process_cpu_seconds_total"] <= t.user + t.system + 0.5
    with open("/proc/self/statm") as fh:
        rss = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    assert abs(got["process_resident_memory_bytes"] - rss) < 64 * 2**20
    assert got["process_virtual_memory_bytes"] >= got["process_resident_memory_bytes"]
    assert time.time() - 7 * 86400 < got["process_start_time_seconds"] <= time.time()
    assert abs(got["process_open_fds"] - len(os.listdir("/proc/self/fd"))) <= 2
    assert got["process_max_fds"] == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert process_metrics.sample()["process_start_time_seconds"] == got["process_start_time_seconds"]


def test_exposition_has_process_metrics_and_stage_cpu(tmp_path):
    daemon = Daemon(Settings(simulate="demo", state_dir=tmp_path / "state", poll_interval=0.05))
    text, rc = asyncio.run(daemon.run_once(cycles=3))
    assert rc == 0
    for name in process_metrics.HELP:
        assert f"# TYPE {name} ".encode() in text, name
        assert _values(text, name), name
    stages = _values(text, "unified_gpu_exporter_stage_cpu_seconds_total")
    assert any('stage="poll"' in k and 'source="simulator"' in k for k in stages), stages
    assert any('stage="map"' in k for k in stages) and any('stage="indicators"' in k for k in stages)
    assert all(v >= 0 for v in stages.values())
    cpu = _values(text, "process_cpu_seconds_total")[""]
    assert sum(stages.values()) <= cpu


def test_content_types_are_prometheus_clients():
    from prometheus_client import exposition as text_format
    from prometheus_client.openmetrics import exposition as om_format

    from exporter.render.exposition import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE

    assert TEXT_CONTENT_TYPE == text_format.CONTENT_TYPE_PLAIN_0_0_4
    assert OPENMETRICS_CONTENT_TYPE == om_format.CONTENT_TYPE_LATEST
