"""Price table lookup and the cost of contended time.

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


def contention_cost(dollars_per_hour: float, contended_seconds: float) -> float:
    """Dollars spent during ``contended_seconds`` of contended time."""
    return dollars_per_hour * contended_seconds / 3600.0
