"""Derived metrics (``derive:`` in mappings/canonical.yaml), computed per GPU frame after mapping.

A derived metric is computed from other canonical series of the same GPU when no source reports
it itself: ``ratio`` (a / b x scale), ``product`` (a x b x scale), or ``of`` (a x scale: a unit
variant of ``a``, declared once for every source that maps ``a``).  The derived series keeps the
labels its operands share (the selector labels of an operand dropped).  A histogram's unit variant
is its three parts: the buckets' counts with each ``le`` bound scaled, the sum scaled, the count.
"""

from __future__ import annotations

import math

from ..model import Extra, Labels, SeriesId
from .schema import Schema


class Deriver:
    """The schema's derived metrics in dependency order, operands parsed once."""

    def __init__(self, schema: Schema):
        # (name, op, scale, (a name, a selector), (b name, b selector) or None)
        self.derived = []
        for name, mdef in schema.derived():
            if mdef.derive is None:
                continue
            ops = mdef.derive.operands
            if mdef.type == "histogram":  # a unit variant: part by part
                of, scale = ops[0][0], mdef.derive.scale
                self.derived += [(f"{name}_bucket", "le", scale, (f"{of}_bucket", ()), None),
                                 (f"{name}_sum", "scale", scale, (f"{of}_sum", ()), None),
                                 (f"{name}_count", "scale", 1.0, (f"{of}_count", ()), None)]
                continue
            self.derived.append((name, mdef.derive.op, mdef.derive.scale, ops[0], ops[1] if len(ops) > 1 else None))
        self._operand_names = frozenset(n for d in self.derived for op in d[3:] if op for n in (op[0],))

    def __bool__(self) -> bool:
        return bool(self.derived)

    def apply(self, series: dict[SeriesId, float]) -> None:
        """Add the derived metrics of one GPU's frame (their operands are series of the same GPU)."""
        names = self._operand_names
        by_metric: dict[str, list[tuple[Extra, float]]] = {}
        for (name, labels), v in series.items():
            if name in names:
                by_metric.setdefault(name, []).append((labels, v))
        for name, op, scale, (a_name, a_sel), b in self.derived:
            a_vals = _select(by_metric.get(a_name, ()), a_sel)
            if not a_vals:
                continue
            b_vals = _select(by_metric.get(b[0], ()), b[1]) if b is not None else None
            new: list[tuple[Extra, float]] = []
            for k, av in a_vals.items():
                if op == "le":  # a histogram's buckets: the count as is, the bound in the new unit
                    k = _scaled_le(k, scale)  # type: ignore[assignment]
                    if k is None:
                        continue
                if (name, k) in series:
                    continue
                if b_vals is None:  # a unit variant
                    v = av if op == "le" else av * scale
                else:
                    bv = b_vals.get(k)
                    if bv is None or (op == "ratio" and bv == 0):
                        continue
                    v = av / bv * scale if op == "ratio" else av * bv * scale
                if not math.isfinite(v):
                    continue
                series[(name, k)] = v
                new.append((k, v))
            if new and name in names:
                by_metric.setdefault(name, []).extend(new)


def _select(items, selector: Labels) -> dict[Labels, float]:
    """Series whose labels include the selector, keyed by their labels minus the selector."""
    out: dict[Labels, float] = {}
    sel = dict(selector)
    for labels, v in items:
        if sel:
            d = dict(labels)
            if any(d.get(k) != val for k, val in sel.items()):
                continue
            labels = tuple((k, val) for k, val in labels if k not in sel)
        out[labels] = v
    return out


def _scaled_le(labels: Labels, scale: float) -> Labels | None:
    """A bucket's labels with its ``le`` bound times ``scale`` (``+Inf`` stays); None when the
    bound is not a number."""
    out = []
    for k, v in labels:
        if k == "le" and v != "+Inf":
            try:
                v = f"{float(v) * scale:g}"
            except ValueError:
                return None
        out.append((k, v))
    return tuple(out)
