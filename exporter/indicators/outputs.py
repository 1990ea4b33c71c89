"""The engine's output vocabulary: a device's indicator series as a frame, ``{(name, extra): value}``.

``extra`` is the indicator's own labels, sorted by name (``model.Extra``); the renderer adds the
GPU's identity.  Label sets come from a fixed vocabulary (states, reasons, causes, metrics), so
each is made once and shared.
"""

from __future__ import annotations

from ..model import Extra, Frame, SeriesId
from .contention import BASIS_SERIES
from .rootcause import CAUSES
from .state import STATES

_MAX_LABEL_SETS = 1024  # shared label tuples kept (a fixed vocabulary: states, reasons, causes, ...)

NO_LABELS: Extra = ()
BY_BASIS: dict[str, Extra] = {b: (("basis", b),) for b in BASIS_SERIES}
BY_CAUSE: dict[str, Extra] = {c: (("cause", c),) for c in (*CAUSES, "none", "unknown")}
# gpu_memory_state: its series, per current state
STATE_OUT: dict[str, tuple[tuple[SeriesId, float], ...]] = {
    current: tuple((("gpu_memory_state", (("state", name),)), 1.0 if name == current else 0.0) for name in STATES)
    for current in STATES}


def state_series(state: str) -> tuple[tuple[SeriesId, float], ...]:
    """The gpu_memory_state series (one per state, 1 for ``state``)."""
    got = STATE_OUT.get(state)
    if got is None:
        got = tuple((("gpu_memory_state", (("state", name),)), 1.0 if name == state else 0.0) for name in STATES)
    return got


class LabelSets(dict):
    """One shared sorted label tuple per set of (name, value) pairs, made on first use."""

    def one(self, name: str, value: str) -> Extra:
        key = (name, value)
        labels = self.get(key)
        if labels is None:
            if len(self) >= _MAX_LABEL_SETS:
                self.clear()
            labels = self[key] = ((name, value),)
        return labels

    def many(self, *pairs: tuple[str, str]) -> Extra:
        labels = self.get(pairs)
        if labels is None:
            if len(self) >= _MAX_LABEL_SETS:
                self.clear()
            labels = self[pairs] = tuple(sorted(dict(pairs).items()))
        return labels

    def two(self, name1: str, value1: str, name2: str, value2: str) -> Extra:
        key = (name1, value1, name2, value2)
        labels = self.get(key)
        if labels is None:
            if len(self) >= _MAX_LABEL_SETS:
                self.clear()
            pairs = ((name1, value1), (name2, value2))
            labels = self[key] = pairs if name1 <= name2 else pairs[::-1]
        return labels


__all__ = ["BY_BASIS", "BY_CAUSE", "NO_LABELS", "Frame", "LabelSets", "state_series"]
