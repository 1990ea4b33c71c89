"""A fixed-size ring buffer of ``(monotonic time, value)`` samples covering a time window.

Capacity is fixed when the window is created (window length / poll interval, with slack for
jitter, capped), so memory does not grow with uptime.  Samples older than the window are dropped
when read; when polls come faster than planned the oldest samples fall off the ring instead.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
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


class SortedWindow(RingWindow):
    """A ``RingWindow`` that also keeps its values sorted, for medians and quantiles without a
    sort per read.

    The sorted list equals ``sorted(values)`` element for element: equal values (``0.0`` and
    ``-0.0`` too) stay in time order, as a stable sort leaves them, because a new value goes
    after its equals and the oldest value, the one to leave, is the first of its equals.  NaN
    has no place in an order: while the window holds one, ``ordered`` sorts the values as
    ``sorted`` does (whatever that gives)."""

    __slots__ = ("_nan", "_sorted")

    def __init__(self, seconds: float, capacity: int) -> None:
        super().__init__(seconds, capacity)
        self._sorted: list[float] = []
        self._nan = 0

    def push(self, t: float, value: float) -> None:
        tt, vv = self._t, self._v
        if tt and t < tt[-1]:
            return
        if len(vv) == self.capacity:  # the deque drops its oldest sample
            self._remove(vv[0])
        tt.append(t)
        vv.append(value)
        if value != value:
            self._nan += 1
        else:
            insort(self._sorted, value)

    def _remove(self, value: float) -> None:
        if value != value:
            self._nan -= 1
        else:
            s = self._sorted
            del s[bisect_left(s, value)]

    def prune(self, now: float) -> None:
        cutoff = now - self.seconds
        t, v = self._t, self._v
        while t and t[0] < cutoff:
            t.popleft()
            self._remove(v.popleft())

    def clear(self) -> None:
        super().clear()
        self._sorted.clear()
        self._nan = 0

    def ordered(self, now: float) -> list[float]:
        """``sorted(self.values(now))`` (a live view without NaN: do not keep or change it)."""
        self.prune(now)
        return self._sorted if not self._nan else sorted(self._v)

    def median(self, now: float) -> float:
        """``robust.median(self.values(now))``."""
        ordered = self.ordered(now)
        n = len(ordered)
        if n == 0:
            raise ValueError("median of no values")
        mid = n // 2
        return ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])
