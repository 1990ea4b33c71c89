"""A fast poll is skipped while the last full poll's values are younger than one fast interval
(with the defaults, one fast poll per full poll); the indicators still step every fast interval."""

from __future__ import annotations

import asyncio
import time

from exporter.run.daemon import Daemon, Settings
from exporter.simulate import SimulatorSource

OTHERS = ("nvml", "dcgm", "amdsmi", "intel", "levelzero", "fdinfo", "upstream", "profiles")


async def test_fast_polls_come_only_where_the_full_poll_is_older_than_one_fast_interval(tmp_path, monkeypatch):
    calls: list[tuple[str, float]] = []
    real_poll, real_fast = SimulatorSource.poll, SimulatorSource.poll_fast

    def poll(self):
        out = real_poll(self)
        calls.append(("full", time.monotonic()))  # when its values were taken (the end)
        return out

    def poll_fast(self):
        calls.append(("fast", time.monotonic()))
        return real_fast(self)

    monkeypatch.setattr(SimulatorSource, "poll", poll)
    monkeypatch.setattr(SimulatorSource, "poll_fast", poll_fast)
    interval, fast = 0.4, 0.1
    daemon = Daemon(Settings(simulate="demo", poll_interval=interval, fast_interval=fast,
                             state_dir=tmp_path / "state", collectors={c: False for c in OTHERS}))
    await daemon.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sum(k == "fast" for k, _ in calls) < 6:
            await asyncio.sleep(0.05)
    finally:
        await daemon.stop()
    fasts = [t for k, t in calls if k == "fast"]
    assert len(fasts) >= 6, calls
    for t in fasts:
        last_full = max(tf for k, tf in calls if k == "full" and tf <= t)
        # the runner stamps its poll a moment after the source returns: allow that moment
        assert t - last_full >= fast - 0.02, (t - last_full, calls)
    # and they do fill the gaps: fewer fast polls than fast ticks, more than none per full poll
    fulls = sum(k == "full" for k, _ in calls)
    assert len(fasts) >= fulls - 2
