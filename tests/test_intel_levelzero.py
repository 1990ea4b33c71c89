"""LevelZeroSource against a faithful fake of pyzes (tests/fake_pyzes.py)."""

from __future__ import annotations

import importlib.util

import pytest

from exporter.sources.base import SourceUnavailable
from exporter.sources.context import SourceContext
from exporter.sources.levelzero import LevelZeroSource
from exporter.testing import map_source_once
from tests import fake_pyzes as fz
from tests.fdinfo_trees import add_card

GiB = 1 << 30
ADDR = "0000:3a:00.0"


@pytest.fixture
def dev():
    d = fz.FakeDevice(
        pci=(0, 0x3A, 0, 0),
        engines=[fz.FakeEngine(fz.ZES_ENGINE_GROUP_ALL), fz.FakeEngine(fz.ZES_ENGINE_GROUP_COMPUTE_ALL),
                 fz.FakeEngine(fz.ZES_ENGINE_GROUP_COPY_ALL)],
        memories=[fz.FakeMemory(size=48 * GiB, free=40 * GiB, max_bw=1_600_000_000_000),
                  fz.FakeMemory(size=64 * GiB, free=1 * GiB, location=fz.ZES_MEM_LOC_SYSTEM)])
    fz.reset([d])
    return d


def _advance(d, us=1_000_000, active=(500_000, 250_000, 0), read=3_000_000_000, write=1_000_000_000):
    for eng, a in zip(d.engines, active, strict=True):
        eng.active += a
        eng.timestamp += us
    mem = d.memories[0]
    mem.read, mem.write, mem.timestamp = mem.read + read, mem.write + write, mem.timestamp + us


def _raw(sample):
    return {(r.field, r.labels): r.value for r in sample.readings}


def _open(tmp_path, **kw):
    add_card(tmp_path / "sys", 2, ADDR)
    src = LevelZeroSource(SourceContext(sysfs=tmp_path / "sys", options={}), module=fz, **kw)
    src.open()
    return src


@pytest.mark.optional_in_ci
@pytest.mark.skipif(importlib.util.find_spec("pyzes") is not None, reason="pyzes is installed here")
def test_without_pyzes_the_source_is_off_with_the_reason():
    with pytest.raises(SourceUnavailable, match="pyzes"):
        LevelZeroSource(SourceContext(options={})).open()


def test_init_failure_is_unavailable(dev):
    fz.reset([dev], init_rc=fz.ZE_RESULT_ERROR_UNINITIALIZED)
    with pytest.raises(SourceUnavailable, match="zesInit failed"):
        LevelZeroSource(SourceContext(options={}), module=fz).open()
    fz.reset([])
    with pytest.raises(SourceUnavailable):
        LevelZeroSource(SourceContext(options={}), module=fz).open()


def test_two_samples(dev, tmp_path):
    src = _open(tmp_path)
    first = src.poll()
    (d,) = first.devices
    assert (d.key, d.index, d.vendor, d.mapping, d.model) == (ADDR, "2", "intel", "intel",
                                                              "Intel(R) Data Center GPU Max 1100")
    # state only from device-local modules; no rates from a single sample
    assert _raw(first) == {("l0.memory.size_bytes", ()): 48 * GiB, ("l0.memory.free_bytes", ()): 40 * GiB,
                           ("l0.memory.used_bytes", ()): 8 * GiB}
    _advance(dev)
    raw = _raw(src.poll())
    assert raw[("l0.engine.all", ())] == pytest.approx(50.0)
    assert raw[("l0.engine.compute_all", ())] == pytest.approx(25.0)
    assert raw[("l0.engine.copy_all", ())] == pytest.approx(0.0)
    # 3 GB read + 1 GB written in 1 s (timestamps in us); bytes as returned, not x32
    assert raw[("l0.memory.bandwidth_bytes_per_second", ())] == pytest.approx(4e9)
    assert raw[("l0.memory.bandwidth_utilization_percent", ())] == pytest.approx(0.25)


def test_counters_backwards_and_zero_max_bandwidth(dev, tmp_path):
    src = _open(tmp_path)
    _advance(dev)
    src.poll()
    dev.engines[0].active = 10  # was 500_000: the driver's counter went backwards
    dev.memories[0].max_bw = 0
    _advance(dev, active=(0, 1, 0))
    raw = _raw(src.poll())
    assert ("l0.engine.all", ()) not in raw  # went backwards: no value this poll
    assert ("l0.memory.bandwidth_utilization_percent", ()) not in raw  # maxBandwidth 0: no ratio
    assert raw[("l0.memory.bandwidth_bytes_per_second", ())] == pytest.approx(4e9)


def test_refused_capabilities_are_noted_not_errors(dev, tmp_path):
    dev.engines_rc = fz.ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS
    dev.memories[0].bw_rc = fz.ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS
    src = _open(tmp_path)
    src.poll()
    s = src.poll()
    assert any("root" in n and "engine" in n for n in src.notes)
    assert any("bandwidth" in n for n in src.notes)
    assert {r.field for r in s.readings} == {"l0.memory.size_bytes", "l0.memory.free_bytes", "l0.memory.used_bytes"}
    assert not s.errors


def test_lost_device_counted(dev, tmp_path):
    src = _open(tmp_path)
    for eng in dev.engines:
        eng.rc = fz.ZE_RESULT_ERROR_DEVICE_LOST
    s = src.poll()
    assert s.errors["device_lost"] == 3 and s.device_up == {ADDR: False}


def test_canonical_values(dev, tmp_path):
    class Stepping:
        name = "levelzero"

        def __init__(self, src):
            self.src, self.n = src, 0

        def open(self):
            self.src.open()

        def close(self):
            self.src.close()

        def poll(self):
            if self.n:
                _advance(dev)
            self.n += 1
            return self.src.poll()

    add_card(tmp_path / "sys", 2, ADDR)
    res = map_source_once(Stepping(LevelZeroSource(SourceContext(sysfs=tmp_path / "sys", options={}), module=fz)))
    got = {(n, tuple(sorted((k, v) for k, v in lbl if k not in ("vendor", "uuid")))): v for (n, lbl), v in res.items()}
    g = (("gpu", "2"),)
    assert got == pytest.approx({
        ("gpu_compute_utilization_percent", g): 50.0,
        ("gpu_engine_utilization_percent", (("engine", "compute"), ("gpu", "2"))): 25.0,
        ("gpu_engine_utilization_percent", (("engine", "copy"), ("gpu", "2"))): 0.0,
        ("gpu_memory_total_bytes", g): 48 * GiB,
        ("gpu_memory_free_bytes", g): 40 * GiB,
        ("gpu_memory_used_bytes", g): 8 * GiB,
        ("gpu_memory_utilization_percent", g): 8 / 48 * 100,  # derived by the engine
        ("gpu_memory_bandwidth_gbps", g): 4.0,
        ("gpu_memory_bandwidth_utilization_percent", g): 0.25,
    })
