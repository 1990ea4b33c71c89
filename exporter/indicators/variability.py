"""Variability of a window of samples: CoV, quantiles and a bimodal / heavy-tail flag.

The seed: in contention-free runs the coefficient of variation stays below 0.05; silent
contention shows as bimodal or heavy-tailed distributions ("most runs 10 ms, 15 % at 25 ms").
The flag is raised when the window is not clean (CoV >= ``cov_clean``) AND its shape is either
bimodal (Sarle's bimodality coefficient above ``bimodality_coefficient``; a normal gives 1/3, a
uniform 5/9, any two-point mixture 1) or heavy-tailed (the farther tail from the median,
``max(p99 - p50, p50 - p1)``, longer than ``tail_to_body_ratio`` x the inter-quartile range; a
normal gives 1.7).  A wide but well-shaped spread alone does not raise it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from operator import mul
from typing import NamedTuple

from .config import VariabilityConfig
from .window import quantile_sorted

EXPORTED_QUANTILES = (("50", 0.5), ("95", 0.95), ("99", 0.99))  # (percentile label, q)


@dataclass(frozen=True, slots=True)
class VariabilityStats:
    n: int
    mean: float
    cov: float
    quantiles: dict[str, float]  # percentile "50" | "95" | "99" -> value
    bimodality: float  # Sarle's coefficient, 0 for a constant window
    tail_to_body: float  # inf when the inter-quartile range is 0 but a tail exists
    heavy_tail: bool


def bimodality_coefficient(values: Sequence[float], mean: float) -> float:
    """Sarle's bimodality coefficient (skewness^2 + 1) / kurtosis from population moments."""
    n = len(values)
    m2 = m3 = m4 = 0.0
    for x in values:
        d = x - mean
        d2 = d * d
        m2 += d2
        m3 += d2 * d
        m4 += d2 * d2
    m2 /= n
    if m2 <= 0.0:
        return 0.0
    m3 /= n
    m4 /= n
    skew2 = (m3 * m3) / (m2 * m2 * m2)
    kurt = m4 / (m2 * m2)
    return (skew2 + 1.0) / kurt


def tail_to_body(ordered: Sequence[float]) -> float:
    """max(p99 - p50, p50 - p1) / (p75 - p25) of sorted values."""
    p50 = quantile_sorted(ordered, 0.5)
    tail = max(quantile_sorted(ordered, 0.99) - p50, p50 - quantile_sorted(ordered, 0.01))
    iqr = quantile_sorted(ordered, 0.75) - quantile_sorted(ordered, 0.25)
    if iqr <= 0.0:
        return math.inf if tail > 0.0 else 0.0
    return tail / iqr


def window_stats(values: Sequence[float], cfg: VariabilityConfig) -> VariabilityStats | None:
    """Statistics of one window; None with fewer than ``cfg.min_samples`` values."""
    n = len(values)
    if n < cfg.min_samples:
        return None
    ordered = sorted(values)
    mean = math.fsum(ordered) / n
    var = math.fsum((x - mean) * (x - mean) for x in ordered) / n
    cov = math.sqrt(var) / abs(mean) if mean != 0 else 0.0
    quantiles = {label: quantile_sorted(ordered, q) for label, q in EXPORTED_QUANTILES}
    bc = bimodality_coefficient(ordered, mean)
    ttb = tail_to_body(ordered)
    heavy = cov >= cfg.cov_clean and (bc > cfg.bimodality_coefficient or ttb > cfg.tail_to_body_ratio)
    return VariabilityStats(n, mean, cov, quantiles, bc, ttb, heavy)


def window_summary(values: Sequence[float], cfg: VariabilityConfig,
                   ordered: Sequence[float] | None = None) -> WindowSummary | None:
    """What the engine exports of ``window_stats``: CoV, the exported quantiles and the heavy-tail
    flag, the same values, without the shape statistics the flag does not need (a window below
    ``cov_clean`` needs neither; a heavy tail makes the bimodality coefficient moot).
    ``ordered``: ``sorted(values)`` where the caller has it."""
    n = len(values)
    if n < cfg.min_samples:
        return None
    if ordered is None:
        ordered = sorted(values)
    mean = math.fsum(ordered) / n
    d = [x - mean for x in ordered]
    var = math.fsum(map(mul, d, d)) / n  # the same products as window_stats': fsum is exact
    cov = math.sqrt(var) / abs(mean) if mean != 0 else 0.0
    quantiles = tuple((label, quantile_sorted(ordered, q)) for label, q in EXPORTED_QUANTILES)
    heavy = cov >= cfg.cov_clean and (tail_to_body(ordered) > cfg.tail_to_body_ratio
                                      or bimodality_coefficient(ordered, mean) > cfg.bimodality_coefficient)
    return WindowSummary(cov, quantiles, heavy)


class WindowSummary(NamedTuple):
    cov: float
    quantiles: tuple[tuple[str, float], ...]  # (percentile label, value) in EXPORTED_QUANTILES order
    heavy_tail: bool
