"""``Ticker``: the one piece of sleep arithmetic every periodic loop of the daemon uses."""

from __future__ import annotations

import asyncio
import time


class Ticker:
    """Deadlines ``interval`` seconds apart on the monotonic clock.

    ``await tick()`` sleeps until the next deadline.  Ticks missed because the work took longer
    than the interval (or the process was suspended) are skipped, never run back to back.

    ``spacing=True`` sleeps the whole interval after each pass instead (the fast and indicator
    loops): their work is best effort, and under CPU pressure a fixed gap after a slow pass
    leaves the CPU to scrapes and reloads rather than catching up with a cadence.
    """

    def __init__(self, interval: float, *, spacing: bool = False):
        self.interval = interval
        self.spacing = spacing
        self.next_at = time.monotonic()

    def restart(self) -> None:
        """Count the next interval from now (after an irregular wait)."""
        self.next_at = time.monotonic()

    async def __call__(self) -> None:
        if self.spacing:
            await asyncio.sleep(self.interval)
            return
        self.next_at += self.interval
        now = time.monotonic()
        if self.next_at < now:  # missed ticks (slow work, suspended process): skip, don't burst
            self.next_at = now + self.interval - ((now - self.next_at) % self.interval)
        await asyncio.sleep(self.next_at - now)


class StepClock:
    """When the indicator loop steps next, and whether the fast polls run at all.

    While a GPU is near contention (``IndicatorFeed.wants_fast``: ``fast`` set) the loop steps at
    every fast tick and the fast polls run at theirs.  On a calm node the loop waits for the next
    poll published (``polled``), at most ``IndicatorFeed.calm_wait``, and a fast poll that cannot
    run while calm waits for ``fast`` instead of waking at every tick: an idle node's event loop
    wakes for its polls, not for ticks that do nothing."""

    def __init__(self, fast_interval: float, feed=None) -> None:
        self.fast_interval, self.feed = fast_interval, feed  # feed: the IndicatorFeed (None: none)
        self.tick = Ticker(fast_interval, spacing=True)
        self.published = asyncio.Event()  # a poll's values were published since the loop last waited
        self.fast = asyncio.Event()  # set while the indicators sample at the fast interval
        self.sampled()

    def gap(self) -> float:
        """The indicators' sampling interval now (``IndicatorFeed.sampling_interval``)."""
        return self.feed.sampling_interval(time.monotonic()) if self.feed is not None else self.fast_interval

    def polled(self) -> None:
        self.published.set()

    def sampled(self) -> None:
        """After each step (and at the start): whether the feed samples fast now."""
        if self.feed is not None and self.feed.wants_fast(time.monotonic()):
            self.fast.set()
        else:
            self.fast.clear()

    async def until_step(self, versions: tuple[int, int]) -> None:
        """Until the loop may step: the next fast tick while sampling fast; on a calm node the
        next poll published, at most until ``IndicatorFeed.due`` holds whatever changes
        (``versions``: the store's full-poll and fast-poll versions, as for ``due``)."""
        wait = None if self.feed is None else self.feed.calm_wait(time.monotonic(), versions)
        if wait is None:
            await self.tick()
            return
        self.published.clear()
        try:
            async with asyncio.timeout(max(wait, 0.0) + 0.005):  # the loop's clock is in ms: not early
                await self.published.wait()
        except TimeoutError:
            pass
