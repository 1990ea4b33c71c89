"""SortedWindow (exporter/indicators/window.py): its sorted list is ``sorted(values)`` element for
element after any sequence of pushes, prunes, overflows and clears, so the medians and the
variability statistics read from it are the ones a sort per read gives."""

from __future__ import annotations

import math
import random

import pytest

from exporter.indicators.config import VariabilityConfig
from exporter.indicators.robust import median
from exporter.indicators.variability import window_stats, window_summary
from exporter.indicators.window import SortedWindow

POOL = [0.0, -0.0, 1.0, 1, 2.5, -3.0, 1e300, -1e-300, 7.0, 7.0]


@pytest.mark.parametrize("seed", range(6))
def test_the_sorted_list_is_sorted_values_element_for_element(seed):
    rng = random.Random(seed)
    w = SortedWindow(seconds=5.0, capacity=rng.choice([3, 8, 40]))
    t = 0.0
    with_nan = seed % 2 == 1
    for _ in range(3000):
        t += rng.choice([0.1, 0.25, 1.0, 3.0])
        r = rng.random()
        if r < 0.01:
            w.clear()
        elif r < 0.03:
            w.push(t - 10.0, 1.0)  # older than the newest sample: ignored
        else:
            v = math.nan if with_nan and r < 0.08 else rng.choice(POOL + [rng.uniform(-5, 5)])
            w.push(t, v)
        got = w.ordered(t)
        want = sorted(w.values(t))
        # repr tells 0.0 from -0.0 (equal, exported differently) and nan from a number
        assert repr(got) == repr(want)
        if want:
            assert repr(w.median(t)) == repr(median(want))
        else:
            with pytest.raises(ValueError):
                w.median(t)


def test_window_summary_matches_window_stats():
    rng = random.Random(3)
    for cfg in (VariabilityConfig(), VariabilityConfig(cov_clean=0.0),
                VariabilityConfig(cov_clean=0.0, tail_to_body_ratio=1e9)):
        for trial in range(600):
            n = rng.randint(5, 300)
            kind = trial % 5
            if kind == 0:
                v = [rng.gauss(50, 5) for _ in range(n)]
            elif kind == 1:
                v = [rng.choice([10.0, 25.0, -0.0, 0.0]) for _ in range(n)]
            elif kind == 2:
                v = [rng.expovariate(1) * 1e12 for _ in range(n)]
            elif kind == 3:
                v = [rng.gauss(50, 0.5) for _ in range(n)]
            else:
                v = [0.0] * n
            full = window_stats(v, cfg)
            short = window_summary(v, cfg, sorted(v) if trial % 2 else None)
            if full is None:
                assert short is None
                continue
            assert short is not None
            assert repr((full.cov, tuple(full.quantiles.items()), full.heavy_tail)) == repr(tuple(short))
