"""The exporter serves the standard process_* metrics and its CPU per pipeline stage."""

from __future__ import annotations

import asyncio
import os
import re
import resource
import threading
import time

from exporter.render import cpustats, process_metrics
from exporter.run.daemon import Daemon, Settings
from exporter.run.oneshot import run_once


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
    text, rc = asyncio.run(run_once(daemon, cycles=3))
    assert rc == 0
    for name in process_metrics.HELP:
        assert f"# TYPE {name} ".encode() in text, name
        assert _values(text, name), name
    stages = _values(text, "unified_gpu_exporter_stage_cpu_seconds_total")
    assert any('stage="poll"' in k and 'source="simulator"' in k for k in stages), stages
    assert any('stage="map"' in k for k in stages) and any('stage="indicators"' in k for k in stages)
    assert all(v >= 0 for v in stages.values())
    cpu = _values(text, "process_cpu_seconds_total")[""]
    assert {'{stage="event_loop"}', '{stage="other"}'} <= stages.keys(), stages
    # the rows add up to the process's CPU (the ticks of os.times against the threads' clocks)
    assert abs(sum(stages.values()) - cpu) <= 0.02, (stages, cpu)


def _burn(seconds: float) -> float:
    """Spin until this thread used ``seconds`` of CPU; the CPU it used."""
    c0 = time.thread_time()
    while time.thread_time() - c0 < seconds:
        sum(range(1000))
    return time.thread_time() - c0


def _row(rows: list, stage: str) -> float:
    return next(s for st, src, s in rows if st == stage and not src)


def test_cpu_outside_the_stages_is_counted_where_it_ran():
    """CPU on the event loop thread outside a stage is event_loop; on a helper thread, other;
    a stage on the event loop thread is not counted twice."""
    before = cpustats.snapshot(time.process_time())
    _burn(0.05)  # the main thread outside any stage: the event loop's share
    c0 = cpustats.clock()
    _burn(0.05)
    cpustats.add("indicators", "", cpustats.clock() - c0)
    helper = threading.Thread(target=_burn, args=(0.05,))
    helper.start()
    helper.join()
    after = cpustats.snapshot(time.process_time())
    grew = {k: _row(after, k) - _row(before, k) for k in ("event_loop", "other", "indicators")}
    assert grew["indicators"] >= 0.05
    assert 0.05 <= grew["event_loop"] < 0.1, grew  # its own burn, not the stage's
    assert grew["other"] >= 0.045, grew  # the helper thread
    total = sum(s for _, _, s in after)
    assert abs(total - time.process_time()) < 0.05


def test_the_remainder_rows_never_go_back(monkeypatch):
    """``other`` is the process total minus every other row: the total moves in clock ticks, the
    rows in nanoseconds, so the remainder can come out lower than last served (a test run saw
    4.826 then 4.823 across a reload).  Served as a counter, it holds its most."""
    monkeypatch.setattr(cpustats, "_served", {})  # this test's totals stay its own
    now = time.process_time() + 1.0  # a second of helper threads
    first = _row(cpustats.snapshot(now), "other")
    again = _row(cpustats.snapshot(now - 0.005), "other")  # the total's tick came out 5 ms lower
    assert first >= 0.9 and again >= first


def test_content_types_are_prometheus_clients():
    from prometheus_client import exposition as text_format
    from prometheus_client.openmetrics import exposition as om_format

    from exporter.render.exposition import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE

    assert TEXT_CONTENT_TYPE == text_format.CONTENT_TYPE_PLAIN_0_0_4
    assert OPENMETRICS_CONTENT_TYPE == om_format.CONTENT_TYPE_LATEST
