"""Sources polling at one interval are rendered once per round of polls, not once per source
(issue 35: the second render of every poll cycle was a quarter of the daemon's CPU)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from exporter.render.exposition import Renderer
from exporter.run.daemon import Daemon, Settings
from exporter.simulate import SimulatorSource

OTHERS = ("nvml", "dcgm", "amdsmi", "intel", "levelzero", "upstream", "profiles")


def _xe_card(root: Path) -> Path:
    """A sysfs with one DRM card bound to xe: the fdinfo source polls (an empty procfs)."""
    pci = "0000:03:00.0"
    card = root / "class" / "drm" / "card0"
    card.mkdir(parents=True)
    (card / "device").symlink_to(f"../../../devices/pci0000:00/{pci}")
    dev = root / "devices" / "pci0000:00" / pci
    dev.mkdir(parents=True)
    (dev / "driver").symlink_to("../../../bus/pci/drivers/xe")
    return root


async def test_two_sources_at_one_interval_are_rendered_once_a_round(tmp_path, monkeypatch):
    renders: list[float] = []
    polls: list[float] = []
    real_render, real_poll = Renderer.render, SimulatorSource.poll

    def render(self, *a, **kw):
        renders.append(time.monotonic())
        return real_render(self, *a, **kw)

    def poll(self):  # a device a little slower to read than the other source's
        polls.append(time.monotonic())
        time.sleep(0.03)
        return real_poll(self)

    monkeypatch.setattr(Renderer, "render", render)
    monkeypatch.setattr(SimulatorSource, "poll", poll)
    procfs = tmp_path / "proc"
    (procfs / "2").mkdir(parents=True)
    daemon = Daemon(Settings(simulate="demo", poll_interval=0.5, state_dir=tmp_path / "state",
                             sysfs=_xe_card(tmp_path / "sys"), procfs=procfs,
                             collectors={"fdinfo": True, **{c: False for c in OTHERS}}))
    await daemon.start()
    try:
        assert {rt.state.name for rt in daemon.runtimes} == {"simulator", "fdinfo"}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(polls) < 10:
            await asyncio.sleep(0.05)
        assert all(st.stats.up for st in daemon.store.sources.values()), daemon.store.sources
    finally:
        await daemon.stop()
    rounds = len(polls)
    assert rounds >= 10
    # one render per round (and the start's), where each source's poll used to bring its own
    assert len(renders) <= rounds + 2, (len(renders), rounds)
