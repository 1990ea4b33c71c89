"""A source that goes down and comes back (issue 39): the devices it listed read ``device_up 0``
while it is down (nothing is known of them; a lost GPU reads the same, the rules tell the two
apart by ``source_up``), the log says when it is back and what the outage was, and ``/readyz``
keeps meaning "can serve": a pod whose only source is down stays in its Service, serving
``source_up 0``."""

from __future__ import annotations

import logging
import shutil
import threading
from typing import ClassVar

import pytest

from exporter.map.schema import default_mappings_dir
from exporter.run.daemon import Daemon, Settings
from exporter.sources import registry
from exporter.sources.base import Device, PollResult

MAPPING = "vendor: nvidia\nfields:\n  - {raw: util, metric: gpu_compute_utilization_percent}\n"
FAIL = threading.Event()


class OutageSource:
    """Two GPUs; every poll raises while FAIL is set (a driver/library version mismatch)."""

    name: ClassVar[str] = "outage"

    def __init__(self, context: object = None) -> None:
        pass

    def open(self) -> None:
        pass

    def poll(self) -> PollResult:
        if FAIL.is_set():
            raise RuntimeError("Driver/library version mismatch")
        devs = [Device(key=str(n), vendor="nvidia", index=str(n), mapping="outage", uuid=f"GPU-O{n}")
                for n in range(2)]
        s = PollResult(devices=devs)
        for d in devs:
            s.add(d.key, "util", 50)
        return s

    def close(self) -> None:
        pass


@pytest.fixture
def daemon(monkeypatch, tmp_path):
    monkeypatch.setitem(registry.COLLECTORS, "outage", registry.Collector("outage", __name__, "OutageSource",
                                                                          False, "outage"))
    FAIL.clear()
    mdir = tmp_path / "mappings"
    mdir.mkdir()
    shutil.copy(default_mappings_dir() / "canonical.yaml", mdir)
    (mdir / "outage.yaml").write_text(MAPPING)
    collectors = {n: False for n in registry.COLLECTORS} | {"outage": True}
    d = Daemon(Settings(mappings_dir=mdir, poll_interval=60, collectors=collectors, sysfs=tmp_path,
                        procfs=tmp_path))
    d.load()
    d.build_runtimes()
    yield d


def _device_up(text: str) -> dict[str, float]:
    return {line.split('uuid="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith("unified_gpu_exporter_device_up{")}


async def test_down_source_devices_read_device_up_0_and_recovery_is_logged(daemon, caplog):
    rt = daemon.runtimes[0]
    try:
        assert await daemon.poll_once(rt)
        up = await daemon.render()
        assert _device_up(up.text.decode()) == {"GPU-O0": 1.0, "GPU-O1": 1.0}
        FAIL.set()
        assert not await daemon.poll_once(rt)
        down = (await daemon.render()).text.decode()
        assert 'unified_gpu_exporter_source_up{source="outage"} 0' in down
        assert _device_up(down) == {"GPU-O0": 0.0, "GPU-O1": 0.0}  # not 1: nothing is known of them
        assert daemon.ready, "a source down must not take the exporter out of its Service"
        FAIL.clear()
        with caplog.at_level(logging.INFO):
            assert await daemon.poll_once(rt)
        back = [r for r in caplog.records if r.getMessage() == "source up again"]
        assert len(back) == 1 and back[0].source == "outage"
        assert "Driver/library version mismatch" in back[0].reason  # what the outage was
        assert _device_up((await daemon.render()).text.decode()) == {"GPU-O0": 1.0, "GPU-O1": 1.0}
    finally:
        await daemon._close_sources(daemon.runtimes)


async def test_ready_with_every_source_down_from_the_start(daemon):
    FAIL.set()
    rt = daemon.runtimes[0]
    try:
        assert not await daemon.poll_once(rt)
        text = (await daemon.render()).text.decode()
        assert 'unified_gpu_exporter_source_up{source="outage"} 0' in text
        assert daemon.ready  # it serves what it knows: the source is down
    finally:
        await daemon._close_sources(daemon.runtimes)
