"""Absent is not down (issue 15): a source that is only on by default and whose backend the node
lacks is ``absent`` (state and reason, no ``source_up``); ``down`` means enabled and failing:
asked for (flag or config), or up before."""

from __future__ import annotations

import shutil
from typing import ClassVar

import pytest

from exporter.map.schema import default_mappings_dir
from exporter.run.daemon import Daemon, Settings
from exporter.run.oneshot import run_once
from exporter.sources import registry
from exporter.sources.base import Device, PollResult, SourceUnavailable

MAPPING = "vendor: nvidia\nfields:\n  - {raw: util, metric: gpu_compute_utilization_percent}\n"
BACKEND = {"present": True}


class MissingSource:
    name: ClassVar[str] = "missing"

    def __init__(self, context: object = None) -> None:  # a SourceContext
        pass

    def open(self) -> None:
        raise SourceUnavailable("libmissing.so.1 not found")

    def poll(self) -> PollResult:
        raise AssertionError("never polled")

    def close(self) -> None:
        pass


class VanishingSource(MissingSource):
    """Present until BACKEND["present"] is cleared (a driver unloaded before a reload)."""

    name: ClassVar[str] = "vanishing"

    def open(self) -> None:
        if not BACKEND["present"]:
            raise SourceUnavailable("driver not loaded")

    def poll(self) -> PollResult:
        dev = Device(key="0", vendor="nvidia", index="0", mapping="states", uuid="GPU-s0")
        s = PollResult(devices=[dev])
        s.add("0", "util", 50)
        return s


@pytest.fixture
def collectors(monkeypatch, tmp_path):
    for name, cls in [("missing", "MissingSource"), ("vanishing", "VanishingSource")]:
        # on by default, like the hardware collectors
        monkeypatch.setitem(registry.COLLECTORS, name, registry.Collector(name, __name__, cls, True, name))
    BACKEND["present"] = True
    mdir = tmp_path / "mappings"
    mdir.mkdir()
    shutil.copy(default_mappings_dir() / "canonical.yaml", mdir)
    (mdir / "states.yaml").write_text(MAPPING)
    return mdir


def _settings(mdir, tmp_path, config: str | None = None, **flags: bool) -> Settings:
    off = {n: False for n in registry.COLLECTORS if n not in ("missing", "vanishing")}
    cfg = None
    if config is not None:
        cfg = tmp_path / "c.yml"
        cfg.write_text(config)
    return Settings(config_path=cfg, mappings_dir=mdir, poll_interval=0.1, sysfs=tmp_path,
                    procfs=tmp_path, collectors={**off, **flags})


def _lines(text: bytes, name: str) -> list[str]:
    return [ln for ln in text.decode().splitlines() if ln.startswith(f"unified_gpu_exporter_{name}{{")]


async def test_on_by_default_without_backend_is_absent_without_source_up(collectors, tmp_path):
    daemon = Daemon(_settings(collectors, tmp_path))
    text, rc = await run_once(daemon, cycles=1)
    assert rc == 0
    assert _lines(text, "source_up") == ['unified_gpu_exporter_source_up{source="vanishing"} 1.0']
    enabled = [ln for ln in _lines(text, "source_enabled") if 'source="missing"' in ln]
    assert enabled == ['unified_gpu_exporter_source_enabled{reason="libmissing.so.1 not found",'
                       'source="missing",state="absent"} 1.0'], enabled


@pytest.mark.parametrize("how", ["flag", "config"])
async def test_asked_for_without_backend_is_down(collectors, tmp_path, how):
    if how == "flag":
        settings = _settings(collectors, tmp_path, missing=True)
    else:
        settings = _settings(collectors, tmp_path, config="collectors:\n  missing: {enabled: true}\n")
    daemon = Daemon(settings)
    text, rc = await run_once(daemon, cycles=1)
    assert rc == 1  # an explicitly enabled source failed
    assert 'unified_gpu_exporter_source_up{source="missing"} 0.0' in _lines(text, "source_up")
    assert any('state="down"' in ln and 'source="missing"' in ln for ln in _lines(text, "source_enabled"))


async def test_up_before_then_backend_gone_is_down(collectors, tmp_path):
    daemon = Daemon(_settings(collectors, tmp_path, missing=False))
    await daemon.start()
    try:
        st = daemon.store.sources["vanishing"]
        assert st.stats.state == "up" and st.stats.was_up
        BACKEND["present"] = False  # the driver went away; the next reload re-opens the source
        assert await daemon.reload()
        rt = next(r for r in daemon.runtimes if r.state.name == "vanishing")
        await daemon.poll_once(rt)
        assert rt.stats.state == "down" and not rt.stats.up
        text = (await daemon.render()).text
        assert 'unified_gpu_exporter_source_up{source="vanishing"} 0.0' in _lines(text, "source_up")
    finally:
        await daemon.stop()
