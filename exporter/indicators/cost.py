"""Price table lookup and the cost of contended time (``slowdown_cost``).

An entry matches a GPU when each of its non-empty fields matches: ``vendor`` and ``cloud``
case-insensitively, ``model`` as a case-insensitive glob (``*H100*``).  The most specific match
(most non-empty fields) wins; among equally specific ones, the first listed.
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase

from .config import PriceEntry


def entry_matches(entry: PriceEntry, vendor: str, model: str, cloud: str) -> bool:
    if entry.vendor and entry.vendor.lower() != vendor.lower():
        return False
    if entry.cloud and entry.cloud.lower() != cloud.lower():
        return False
    return not entry.model or fnmatchcase(model.lower(), entry.model.lower())


def match_price(prices: Iterable[PriceEntry], vendor: str, model: str, cloud: str) -> float | None:
    """Dollars per hour of a GPU, or None when no entry matches."""
    best: PriceEntry | None = None
    best_rank = -1
    for entry in prices:
        if not entry_matches(entry, vendor, model, cloud):
            continue
        rank = bool(entry.vendor) + bool(entry.model) + bool(entry.cloud)
        if rank > best_rank:
            best, best_rank = entry, rank
    return best.dollars_per_hour if best is not None else None


def slowdown_cost(dollars_per_hour: float, slowdown: float, seconds: float,
                  surcharge_dollars: float = 0.0, surcharge_step: float = 0.10) -> float:
    """Cost of ``seconds`` of contended time at ``slowdown`` (fraction of throughput lost).

    The seed: (baseline time - actual time) x price.  Work that takes ``T`` seconds at the lost
    throughput takes ``T x (1 - slowdown)`` without contention, so each contended second wastes
    ``slowdown`` seconds of the GPU's price.  The surcharge adds ``surcharge_dollars`` per full
    ``surcharge_step`` of loss (the seed's $0.20 per 10 %) per hour of contended time.
    """
    slowdown = min(max(slowdown, 0.0), 1.0)
    steps = int(slowdown / surcharge_step + 1e-9) if surcharge_dollars > 0 else 0
    return (dollars_per_hour * slowdown + surcharge_dollars * steps) * seconds / 3600.0
