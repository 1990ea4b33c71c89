"""Robust baselines: medians of time bins, a fast and a long reference, median / MAD statistics.

Each learned sample stands for ``dt`` seconds of signal.  Samples gather in the current bin until
it covers ``bin_seconds``; the bin's median then enters the fast ring (the last ``fast_bins``
bins).  Every ``long_bin_bins`` fast bins, their median enters the long ring (``long_bins``
entries: with 60 s bins and 60 bins per long bin, a week of hourly medians).  The reference is the
median of a ring; its spread is 1.4826 x the median absolute deviation (the normal-consistent
MAD), so one outlier bin moves neither.  Time is counted in learned seconds only (no wall clock),
so the state survives a restart and a changed poll interval.

``DeviationTracker`` turns a comparison into a flag only after it held ``persistence_seconds``
(and clears it after as long without), the protection against single-sample flags.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

MAD_TO_SIGMA = 1.4826
MAX_BIN_SAMPLES = 4096
EPS = 1e-9  # sums of poll intervals (0.1 x 10 = 0.9999999999999999) still close a span


def median(values: Iterable[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("median of no values")
    mid = n // 2
    return ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def mad_sigma(values: Iterable[float], center: float) -> float:
    """1.4826 x median(|x - center|): the stddev of a normal sample, robust to outliers."""
    return MAD_TO_SIGMA * median(abs(x - center) for x in values)


@dataclass(slots=True)
class RobustBaseline:
    """Binned medians of one signal: fast and long references."""

    bin_seconds: float
    fast_bins: int
    long_bin_bins: int
    long_bins: int
    fast: deque[float] = field(default_factory=deque)
    long: deque[float] = field(default_factory=deque)
    cur: list[float] = field(default_factory=list)
    cur_seconds: float = 0.0
    long_cur: list[float] = field(default_factory=list)
    learned_seconds: float = 0.0
    _stats: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        self.fast = deque(self.fast, maxlen=self.fast_bins)
        self.long = deque(self.long, maxlen=self.long_bins)

    def learn(self, x: float, dt: float) -> None:
        """Learn sample ``x`` that stands for ``dt`` seconds of signal."""
        if not math.isfinite(x) or dt <= 0:
            return
        if len(self.cur) < MAX_BIN_SAMPLES:
            self.cur.append(x)
        self.cur_seconds += dt
        self.learned_seconds += dt
        if self.cur_seconds >= self.bin_seconds - EPS:
            self._close_bin()

    def _close_bin(self) -> None:
        m = median(self.cur)
        self.cur.clear()
        self.cur_seconds = 0.0
        self.fast.append(m)
        self._stats = None
        self.long_cur.append(m)
        if len(self.long_cur) >= self.long_bin_bins:
            self.long.append(median(self.long_cur))
            self.long_cur.clear()

    @property
    def bins(self) -> int:
        return len(self.fast)

    def stats(self) -> tuple[float, float] | None:
        """(median, robust sigma) of the fast reference; None before the first bin."""
        if not self.fast:
            return None
        if self._stats is None:
            center = median(self.fast)
            self._stats = (center, mad_sigma(self.fast, center))
        return self._stats

    def long_peak(self) -> float | None:
        """The protected level: the highest hourly median of the long window.  A slow decline
        enters the hourly medians one step at a time (each hour a little lower), so their median
        follows it; the best hour the GPU sustained does not."""
        return max(self.long) if self.long else None

    def zscore(self, x: float, min_relative_sigma: float) -> float | None:
        st = self.stats()
        if st is None:
            return None
        center, sigma = st
        sigma = max(sigma, min_relative_sigma * abs(center))
        if sigma <= 0:
            return None
        return (x - center) / sigma

    def reset(self) -> None:
        self.fast.clear()
        self.long.clear()
        self.cur.clear()
        self.long_cur.clear()
        self.cur_seconds = 0.0
        self.learned_seconds = 0.0
        self._stats = None

    # -- persistence -------------------------------------------------------------------------

    def to_json(self) -> dict:
        return {"fast": list(self.fast), "long": list(self.long), "long_cur": list(self.long_cur),
                "learned_seconds": self.learned_seconds}

    def restore(self, fast: list[float], long: list[float], long_cur: list[float],
                learned_seconds: float) -> None:
        self.fast = deque(fast[-self.fast_bins:], maxlen=self.fast_bins)
        self.long = deque(long[-self.long_bins:], maxlen=self.long_bins)
        self.long_cur = list(long_cur[-self.long_bin_bins:])
        self.learned_seconds = learned_seconds
        self._stats = None


@dataclass(slots=True)
class DeviationTracker:
    """A condition that must hold ``persistence`` seconds to raise a flag, and be gone as long to clear it."""

    persistence: float
    flagged: bool = False
    _since: float = 0.0  # seconds the condition has (or, when flagged, has not) held

    def update(self, condition: bool, dt: float) -> bool:
        if condition != self.flagged:
            self._since += dt
            if self._since >= self.persistence - EPS:
                self.flagged = condition
                self._since = 0.0
        else:
            self._since = 0.0
        return self.flagged
