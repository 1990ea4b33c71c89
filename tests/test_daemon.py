"""The poll loop isolates sources: a hung, raising or flaky source degrades only itself."""

from __future__ import annotations

import asyncio
import shutil
import time

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from exporter.map.schema import default_mappings_dir
from exporter.run.daemon import Daemon, Settings
from exporter.run.oneshot import run_once
from exporter.serve.server import make_app
from exporter.sources import registry
from tests import fault_sources

TEST_MAPPING = """vendor: nvidia
fields:
  - {raw: util, metric: gpu_compute_utilization_percent}
  - {raw: energy_mj, metric: gpu_energy_joules_total, scale: 0.001}
"""


@pytest.fixture
def mappings_dir(tmp_path):
    d = tmp_path / "mappings"
    d.mkdir()
    shutil.copy(default_mappings_dir() / "canonical.yaml", d)
    (d / "testsrc.yaml").write_text(TEST_MAPPING)
    return d


@pytest.fixture
def test_collectors(monkeypatch):
    for name, cls in [("good", "GoodSource"), ("hanging", "HangingSource"),
                      ("raising", "RaisingSource"), ("flaky", "FlakySource")]:
        monkeypatch.setitem(registry.COLLECTORS, name,
                            registry.Collector(name, "tests.fault_sources", cls, False, name))
    fault_sources.RELEASE.clear()
    yield
    fault_sources.RELEASE.set()


def settings(mappings_dir, tmp_path, on: list[str], interval=0.1, config: str | None = None) -> Settings:
    collectors = {n: False for n in registry.COLLECTORS}
    collectors.update({n: True for n in on})
    cfg = None
    if config:
        cfg = tmp_path / "config.yaml"
        cfg.write_text(config)
    return Settings(config_path=cfg, mappings_dir=mappings_dir, poll_interval=interval,
                    collectors=collectors, sysfs=tmp_path, procfs=tmp_path)


def parse(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


async def test_hung_source_does_not_delay_scrapes_and_is_reported_down(
        mappings_dir, tmp_path, test_collectors):
    conf = "collectors:\n  hanging: {timeout: 0.5s}\n"
    daemon = Daemon(settings(mappings_dir, tmp_path, ["good", "hanging"], config=conf))
    await daemon.start()
    server = TestServer(make_app(daemon))
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            url = str(server.make_url("/metrics"))
            latencies = []
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline:
                t0 = time.perf_counter()
                async with session.get(url) as resp:
                    assert resp.status == 200
                    body = await resp.text()
                latencies.append(time.perf_counter() - t0)
                await asyncio.sleep(0.02)
            metrics = parse(body)
    finally:
        await server.close()
        await daemon.stop()
    # a scrape that waited on the hung source would take its whole 0.5 s timeout; below that, a
    # loaded machine's pause is not mistaken for one (scrapes take a few ms here)
    assert max(latencies) < 0.45, f"a scrape waited on the hung source: {max(latencies):.3f}s"
    assert metrics['unified_gpu_exporter_source_up{source="hanging"}'] == 0
    assert metrics['unified_gpu_exporter_source_errors_total{kind="timeout",source="hanging"}'] >= 1
    assert metrics['unified_gpu_exporter_source_up{source="good"}'] == 1
    assert metrics['gpu_compute_utilization_percent{gpu="0",uuid="GPU-TEST-0",vendor="nvidia"}'] == 42
    # the good source kept polling at its interval while the other one hung
    assert metrics['gpu_energy_joules_total{gpu="0",uuid="GPU-TEST-0",vendor="nvidia"}'] >= 5


async def test_raising_source_is_down_with_exception_counted(mappings_dir, tmp_path, test_collectors):
    daemon = Daemon(settings(mappings_dir, tmp_path, ["good", "raising"]))
    await daemon.start()
    await asyncio.sleep(0.5)
    rendered = await daemon.render()
    await daemon.stop()
    m = parse(rendered.text.decode())
    assert m['unified_gpu_exporter_source_up{source="raising"}'] == 0
    assert m['unified_gpu_exporter_source_errors_total{kind="exception",source="raising"}'] >= 3
    assert m['unified_gpu_exporter_source_up{source="good"}'] == 1
    assert daemon.ready
    reason = daemon.store.sources["raising"].stats.reason
    assert "RuntimeError: library exploded" in reason


async def test_lost_device_is_isolated_and_not_served_stale(mappings_dir, tmp_path, test_collectors):
    daemon = Daemon(settings(mappings_dir, tmp_path, ["flaky"]))
    daemon.load()
    daemon.build_runtimes()
    rt = daemon.runtimes[0]
    assert await daemon.poll_once(rt)
    first = parse((await daemon.render()).text.decode())
    assert first['gpu_compute_utilization_percent{gpu="1",uuid="GPU-TEST-1",vendor="nvidia"}'] == 20
    assert await daemon.poll_once(rt)
    second = parse((await daemon.render()).text.decode())
    assert 'gpu_compute_utilization_percent{gpu="1",uuid="GPU-TEST-1",vendor="nvidia"}' not in second
    assert second['gpu_compute_utilization_percent{gpu="0",uuid="GPU-TEST-0",vendor="nvidia"}'] == 10
    assert second['unified_gpu_exporter_device_up{gpu="1",source="flaky",uuid="GPU-TEST-1",vendor="nvidia"}'] == 0
    assert second['unified_gpu_exporter_device_up{gpu="0",source="flaky",uuid="GPU-TEST-0",vendor="nvidia"}'] == 1
    assert second['unified_gpu_exporter_source_errors_total{kind="device_lost",source="flaky"}'] == 1
    await daemon._close_sources(daemon.runtimes)


async def test_reload_keeps_running_config_when_new_one_is_invalid(mappings_dir, tmp_path, test_collectors):
    s = settings(mappings_dir, tmp_path, ["good"], config="labels: {node: a}\n")
    daemon = Daemon(s)
    await daemon.start()
    try:
        s.config_path.write_text("labels: {node: b}\npoll_interval: never\n")
        assert not await daemon.reload()
        assert daemon.config.labels == {"node": "a"}
        await asyncio.sleep(0.3)
        text = (await daemon.render()).text.decode()
        assert "unified_gpu_exporter_config_last_reload_successful 0.0" in text
        assert 'node="a"' in text
        s.config_path.write_text("labels: {node: c}\n")
        assert await daemon.reload()
        await asyncio.sleep(0.3)
        text = (await daemon.render()).text.decode()
        assert "unified_gpu_exporter_config_last_reload_successful 1.0" in text
        assert 'node="c"' in text and 'node="a"' not in text
    finally:
        await daemon.stop()


async def test_once_exits_nonzero_when_explicit_source_fails(mappings_dir, tmp_path, test_collectors):
    daemon = Daemon(settings(mappings_dir, tmp_path, ["good", "raising"], interval=0.05))
    text, rc = await run_once(daemon)
    assert rc == 1
    assert b"gpu_compute_utilization_percent" in text
    daemon = Daemon(settings(mappings_dir, tmp_path, ["good"], interval=0.05))
    _, rc = await run_once(daemon)
    assert rc == 0
