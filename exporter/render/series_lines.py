"""Exposition lines of the canonical series, kept from one render cycle to the next.

The renderer's input is ``Frames``: per GPU (``DeviceId``), its series by ``SeriesId`` (name and
the labels beyond the GPU's identity).  This is the one place a GPU's identity becomes its
``vendor``/``gpu``/``uuid`` labels.  Series repeat every poll, so everything about a series
except its value is worked out once and kept: its family (or that the filter or schema drops
it), its escaped ``name{label="value",...} `` prefix with the identity, device and static labels
added, its histogram sort key, and its last value with the line that value gave.  A cycle then
costs one dictionary lookup per series, and a new line only where the value changed.

Bounded: entries of series not seen in the last render are dropped once they outnumber the
live ones, and everything is dropped when the schema, the filter or the static labels change.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from operator import itemgetter
from typing import Any

from ..map.schema import Schema
from ..model import DeviceId, Extra, Frames, Labels, Sample, SeriesId, identity_labels
from .seriesfilter import SeriesFilter
from .textformat import format_value, series_prefix

MAX_ENTRIES = 500_000  # cleared when exceeded (label churn within one cycle)

# entry fields (a list: mutated in place every cycle); _OUT is its family's list of lines
_FAMILY, _PREFIX, _ORDER, _ADDED, _VALUE, _LINE, _SEEN, _USED, _OUT = range(9)
_NAN = math.nan  # never equal: the first value always formats
_copysign = math.copysign
_float_repr = float.__repr__
_by_order = itemgetter(0)

# what pod attribution adds to one GPU's series: fixed labels, or a labeler of the series' extra
DeviceLabels = Labels | Callable[[Extra], Labels]
Order = Callable[[Sample], tuple]


class SeriesLines:
    """Per GPU and series: family, prefix, sort key, last value and line (see the module doc)."""

    def __init__(self, schema: Schema, histogram_parts: dict[str, str], order: Order) -> None:
        self.schema = schema
        self._parts = histogram_parts  # x_bucket / x_sum / x_count -> x
        self._order = order  # the sort key of a histogram sample
        self._entries: dict[DeviceId, dict[SeriesId, list[Any]]] = {}
        self._size = 0  # entries over all GPUs
        self._out: dict[str, list] = {}  # family -> this cycle's lines (emptied every cycle)
        self._filter: SeriesFilter | None = None
        self._static: Labels = ()
        self._generation = 0

    def __len__(self) -> int:
        return self._size

    def clear(self) -> None:
        self._entries = {}
        self._size = 0
        self._out = {}

    def collect(self, first: Frames, sources: Iterable[Frames], extra: Iterable[Frames],
                static_labels: Labels, per_device: Mapping[DeviceId, DeviceLabels] | None,
                series_filter: SeriesFilter | None) -> tuple[dict[str, list], int]:
        """Lines per family of ``first``, then every source's frames (a series already served by
        an earlier source is skipped), then ``extra`` (a series a source already serves is
        skipped too: one exposition never carries a series twice; histogram families sorted by
        bucket); and how many lines in all.  The lists are reused: join them before the next
        call."""
        if series_filter is not None:
            static_labels = series_filter.extra(static_labels)
        if series_filter is not self._filter or static_labels != self._static:
            self.clear()
            self._filter, self._static = series_filter, static_labels
        self._generation = gen = self._generation + 1
        entries = self._entries
        for out in self._out.values():
            out.clear()
        new = self._new
        allow = series_filter is not None and series_filter.allow is not None

        def run(frames: Frames, dedup: bool) -> None:
            for dev_id, frame in frames.items():
                added: Labels = ()
                labeler = None
                if per_device:
                    dev = per_device.get(dev_id)
                    if dev:
                        if callable(dev):  # pod attribution: the labels depend on the series
                            labeler = dev
                        else:
                            if allow:
                                dev = series_filter.extra(dev)  # type: ignore[union-attr]
                            if dev:
                                added = dev
                mine = entries.get(dev_id)
                if mine is None:
                    mine = entries[dev_id] = {}
                get = mine.get
                for sid, value in frame.items():
                    if labeler is not None:
                        added = labeler(sid[1]) or ()
                        if added and allow:
                            added = series_filter.extra(added)  # type: ignore[union-attr]
                    e = get(sid)
                    if e is None or (e[_ADDED] is not added and e[_ADDED] != added):
                        if self._size >= MAX_ENTRIES:
                            entries.clear()
                            mine = entries[dev_id] = {}
                            get = mine.get
                            self._size = 0
                        if e is None:
                            self._size += 1
                        e = mine[sid] = new(dev_id, sid, added, static_labels, series_filter)
                    e[_USED] = gen
                    family = e[_FAMILY]
                    if family is None:
                        continue
                    if dedup:
                        if e[_SEEN] == gen:
                            continue
                        e[_SEEN] = gen
                    last = e[_VALUE]
                    if value == last and (value or _copysign(1.0, value) == _copysign(1.0, last)):
                        line = e[_LINE]
                    else:
                        if value.__class__ is float and value - value == 0.0:  # finite
                            text = _float_repr(value)
                        else:
                            text = format_value(value)
                        line = e[_LINE] = e[_PREFIX] + text + "\n"
                        e[_VALUE] = value
                    order = e[_ORDER]
                    e[_OUT].append(line if order is None else (order, line))

        run(first, False)
        for frames in sources:  # unique within one source, maybe not across them
            if frames:
                run(frames, True)
        for frames in extra:  # the indicators' own families: a source's series wins
            run(frames, True)
        lines: dict[str, list] = {}
        count = 0
        for family, out in self._out.items():
            if out:
                count += len(out)
                if out[0].__class__ is tuple:
                    out.sort(key=_by_order)
                    out = [line for _, line in out]
                lines[family] = out
        if self._size > 2 * count + 1024:  # series gone since earlier cycles: forget them
            kept = {}
            for dev_id, mine in entries.items():
                live = {k: e for k, e in mine.items() if e[_USED] == gen}
                if live:
                    kept[dev_id] = live
            self._entries = kept
            self._size = sum(map(len, kept.values()))
        return lines, count

    def _new(self, dev_id: DeviceId, sid: SeriesId, added: Labels, static_labels: Labels,
             series_filter: SeriesFilter | None) -> list[Any]:
        name, extra = sid
        labels = identity_labels(dev_id) + extra
        family = self._parts.get(name, name)
        e: list[Any] = [None, "", None, added, _NAN, "", 0, 0, None]
        if series_filter is not None and not (series_filter.family(family)
                                              and series_filter.labels_ok(family, labels)):
            return e
        mdef = self.schema.metrics.get(family)
        if mdef is None or mdef.internal:
            return e
        labels = extend_labels(labels, added + static_labels if added else static_labels)
        e[_FAMILY] = family
        out = self._out.get(family)
        if out is None:
            out = self._out[family] = []
        e[_OUT] = out
        e[_PREFIX] = series_prefix(name, labels)
        if mdef.type == "histogram":
            e[_ORDER] = self._order(Sample(name, labels, 0.0))
        return e


def extend_labels(labels: Labels, extra: Labels) -> Labels:
    """``labels`` plus the enrichment and static labels it does not carry already: a name twice
    on one sample makes Prometheus refuse the whole scrape (a cloud ``region`` label beside a
    process's memory ``region``), so the series' own value wins."""
    if not extra:
        return labels
    own = {k for k, _ in labels}
    if any(k in own for k, _ in extra):
        extra = tuple(kv for kv in extra if kv[0] not in own)
    return labels + extra

