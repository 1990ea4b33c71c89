"""A fixed-size ring buffer of ``(monotonic time, value)`` samples covering a time window.

Capacity is fixed when the window is created (window length / poll interval, with slack for
jitter, capped), so memory does not grow with uptime.  Samples older than the window are dropped
when read; when polls come faster than planned the oldest samples fall off the ring instead.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence


def capacity_for(window_seconds: float, poll_interval: float, max_samples: int) -> int:
    """Ring size that holds ``window_seconds`` of samples at ``poll_interval`` plus 25 % jitter slack."""
    if poll_interval <= 0:
        return max_samples
    return max(2, min(max_samples, math.ceil(window_seconds / poll_interval * 1.25) + 1))


def quantile_sorted(ordered: Sequence[float], q: float) -> float:
    """Quantile of already sorted values, linear interpolation between closest ranks.

    Rank ``(n - 1) * q`` as numpy's default and Prometheus' ``quantile_over_time``.
    """
    n = len(ordered)
    if n == 0:
        raise ValueError("quantile of no values")
    h = (n - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, n - 1)
    return ordered[lo] + (h - lo) * (ordered[hi] - ordered[lo])


class RingWindow:
    """Samples of one series over the last ``seconds``, in time order."""

    __slots__ = ("_t", "_v", "capacity", "seconds")

    def __init__(self, seconds: float, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.seconds = seconds
        self.capacity = capacity
        self._t: deque[float] = deque(maxlen=capacity)
        self._v: deque[float] = deque(maxlen=capacity)

    def push(self, t: float, value: float) -> None:
        """Append a sample (t must not go backwards; an older sample is ignored)."""
        if self._t and t < self._t[-1]:
            return
        self._t.append(t)
        self._v.append(value)

    def prune(self, now: float) -> None:
        """Drop samples older than ``now - seconds``."""
        cutoff = now - self.seconds
        t, v = self._t, self._v
        while t and t[0] < cutoff:
            t.popleft()
            v.popleft()

    def values(self, now: float) -> deque[float]:
        """The values inside the window ending at ``now`` (a live view: do not keep it)."""
        self.prune(now)
        return self._v

    def __len__(self) -> int:
        return len(self._v)

    def first(self) -> tuple[float, float] | None:
        return (self._t[0], self._v[0]) if self._t else None

    def last(self) -> tuple[float, float] | None:
        return (self._t[-1], self._v[-1]) if self._t else None

    def clear(self) -> None:
        self._t.clear()
        self._v.clear()

    def mean(self, now: float) -> float | None:
        vals = self.values(now)
        return math.fsum(vals) / len(vals) if vals else None

    def cov(self, now: float) -> float | None:
        """Coefficient of variation: population stddev / mean (0 for an all-zero window)."""
        vals = self.values(now)
        if not vals:
            return None
        return coefficient_of_variation(vals)

    def quantile(self, now: float, q: float) -> float | None:
        vals = self.values(now)
        return quantile_sorted(sorted(vals), q) if vals else None


def coefficient_of_variation(values: Sequence[float]) -> float:
    """Population stddev / mean; 0 when the mean is 0 (an idle, all-zero signal)."""
    n = len(values)
    m = math.fsum(values) / n
    if m == 0:
        return 0.0
    var = math.fsum((x - m) * (x - m) for x in values) / n
    return math.sqrt(var) / abs(m)
