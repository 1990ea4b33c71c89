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
