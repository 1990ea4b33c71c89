"""One rendered cycle (the text-format bytes /metrics serves) -> OpenTelemetry points.

The push reads what the scrape reads: the cached exposition of the cycle, parsed back.  Each
distinct series line prefix (``name{labels}``) is parsed once with prometheus_client's text
parser and its target (OTel name, attributes, scale) is kept while the series exists, so a push
costs a split, a dict look-up and a float() per line.  Nothing here imports OpenTelemetry: the
result is plain data that ``sdk`` turns into the SDK's data model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

from ..map.schema import HISTOGRAM_SUFFIXES, Schema
from .naming import HW_STATES, OtelMapping, Resolved, fill

Attrs = tuple[tuple[str, object], ...]


class AttrSet(tuple):
    """A point's attributes ((name, value), ... sorted), interned by the converter: one object
    per distinct set, hashed and compared by identity (a push hashes each set several times, and
    a tuple of eight pairs does not cache its hash)."""

    __slots__ = ()
    __hash__ = object.__hash__
    __eq__ = object.__eq__
    __ne__ = object.__ne__
SELF_PREFIX = "unified_gpu_exporter_"
# gpu_info labels that are identity, not series labels
INFO_LABELS = ("model", "driver", "serial", "pci_bus_id")
# the series a GPU's identity is read from (every GPU has one of them, a lost one device_up)
IDENTITY_PREFIXES = ("gpu_info{", SELF_PREFIX + "device_up{")
ROTATE = 20  # pushes between prunings of the per-prefix caches


@dataclass
class MetricOut:
    name: str
    instrument: str
    unit: str
    description: str
    points: dict[Attrs, float] = field(default_factory=dict)
    # histograms: attrs -> [bounds -> cumulative count, sum, count]
    hist: dict[Attrs, list] = field(default_factory=dict)


@dataclass
class Converted:
    metrics: dict[str, MetricOut]
    at: float                  # unix time of the rendered cycle
    series: int                # exposition samples read
    exported: int              # points produced
    start: dict[tuple[str, Attrs], float]  # start time of each sum point


class _Target(NamedTuple):
    metric: str       # OTel name
    rule: Resolved
    base: str         # canonical metric
    attrs: Attrs
    scale: float
    part: str         # "" | "_bucket" | "_sum" | "_count"
    le: float


def parse_prefix(prefix: str) -> tuple[str, dict[str, str]]:
    """Sample name and labels of one series prefix, by prometheus_client's text parser."""
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(prefix + " 0\n"):
        for s in fam.samples:
            return s.name, dict(s.labels)
    raise ValueError(f"not a sample: {prefix[:200]!r}")


class Converter:
    def __init__(self, mapping: OtelMapping, schema: Schema):
        self.mapping, self.schema = mapping, schema
        parts = {n + sfx: (n, sfx) for n, m in schema.metrics.items() if m.type == "histogram"
                 for sfx in HISTOGRAM_SUFFIXES}
        self._family = parts
        self._status_prefixes = tuple(sorted({r.when.metric + "{" for r in mapping.status}))
        self._parsed: dict[str, tuple[str, dict[str, str]] | None] = {}
        self._seen_parsed = self._parsed
        self._pushes = 0
        self._targets: dict[str, _Target | None] = {}
        self._identity_key: object = None
        self._strip: frozenset[str] = frozenset()
        self._interned: dict[Attrs, AttrSet] = {}
        self._start: dict[tuple[str, Attrs], float] = {}
        self._last: dict[tuple[str, Attrs], float] = {}
        self.parse_errors = 0

    # ------------------------------------------------------------------ per cycle
    def _parse(self, prefix: str) -> tuple[str, dict[str, str]] | None:
        p = self._parsed.get(prefix, False)
        if p is False:
            try:
                p = parse_prefix(prefix)
            except ValueError:
                self.parse_errors += 1
                p = None
            self._parsed[prefix] = p
        self._seen_parsed[prefix] = p
        return p

    def convert(self, text: bytes, at: float, strip_labels: frozenset[str] = frozenset()) -> Converted:
        """Points of one cycle; ``strip_labels``: labels every series carries because the
        exporter adds them (static labels, cloud identity), which go on the resource instead."""
        self._pushes += 1
        # the caches keep every prefix seen; every ROTATE pushes they keep only this push's ones
        rotate = self._pushes % ROTATE == 0
        self._seen_parsed = {} if rotate else self._parsed
        lines: list[tuple[str, str]] = []
        info: dict[tuple[str, str, str], dict[str, str]] = {}
        for line in text.decode("utf-8", "replace").split("\n"):
            if not line or line[0] == "#":
                continue
            end = line.rfind("}")
            if end >= 0:
                prefix, rest = line[:end + 1], line[end + 1:].split()
                if not rest:
                    continue
                value = rest[0]
            else:
                parts = line.split()
                if len(parts) < 2:
                    continue
                prefix, value = parts[0], parts[1]
            lines.append((prefix, value))
            if prefix.startswith(IDENTITY_PREFIXES):
                p = self._parse(prefix)
                if p is not None:
                    name, labels = p
                    dev = (labels.get("vendor", ""), labels.get("gpu", ""), labels.get("uuid", ""))
                    got = info.setdefault(dev, {})
                    if name == "gpu_info":
                        got.update({k: labels.get(k, "") for k in INFO_LABELS})
        key = (tuple(sorted((d, tuple(sorted(v.items()))) for d, v in info.items())), strip_labels)
        if key != self._identity_key:  # identity or stripped labels changed: recompute targets
            self._identity_key, self._targets, self._strip = key, {}, strip_labels
        identities = {dev: self._identity(dev, extra) for dev, extra in info.items()}
        out = self._points(lines, identities, at, rotate)
        self._parsed = self._seen_parsed
        return out

    def _points(self, lines, identities, at: float, rotate: bool) -> Converted:
        out: dict[str, MetricOut] = {}
        old_targets = self._targets
        targets = {} if rotate else old_targets
        hits: dict[tuple[str, str, str], int] = {}
        status = self.mapping.status
        status_prefixes = self._status_prefixes
        exported = 0
        for prefix, value_text in lines:
            try:
                value = float(value_text)
            except ValueError:
                self.parse_errors += 1
                continue
            if prefix.startswith(status_prefixes):
                p = self._parse(prefix)
                if p is not None:
                    self._status_hit(hits, status, p[0], p[1], value)
            t = old_targets.get(prefix, False)
            if t is False:
                p = self._parse(prefix)
                t = None if p is None else self._target(p[0], p[1], identities)
                targets[prefix] = t
            elif rotate:
                targets[prefix] = t
            if t is None:
                continue
            m = out.get(t.metric)
            if m is None:
                m = out[t.metric] = self._metric_out(t)
            if t.part:
                h = m.hist.setdefault(t.attrs, [{}, 0.0, 0.0])
                if t.part == "_bucket":
                    h[0][t.le] = value
                elif t.part == "_sum":
                    h[1] = value * t.scale
                else:
                    h[2] = value
                    exported += 1
                continue
            if t.attrs not in m.points:
                exported += 1
            m.points.setdefault(t.attrs, value * t.scale)  # a duplicate attribute set: the first wins
        self._targets = targets
        exported += self._status_points(out, identities, hits)
        if rotate:  # the interned sets still in use, and no others
            self._interned = {tuple(a): a for m in out.values() for a in (m.hist or m.points)}
        return Converted(out, at, len(lines), exported, self._starts(out, at))

    # ------------------------------------------------------------------ targets
    def _metric_out(self, t: _Target) -> MetricOut:
        desc = " ".join(self.schema.metrics[t.base].help.split()).split(". ")[0].rstrip(".") + "."
        return MetricOut(t.metric, t.rule.instrument, t.rule.unit, desc)

    def _identity(self, dev: tuple[str, str, str], extra: dict[str, str]) -> dict[str, str]:
        vendor, gpu, uuid = dev
        labels = {"vendor": vendor, "gpu": gpu, "uuid": uuid, **extra}
        ident = {k: fill(v, labels) for k, v in self.mapping.identity.items()}
        if not ident.get("hw.id"):
            ident["hw.id"] = fill(self.mapping.id_fallback, labels)
        return {k: v for k, v in ident.items() if v}

    def _target(self, name: str, labels: dict[str, str], identities) -> _Target | None:
        base, part = self._family.get(name, (name, ""))
        rules = self.mapping.rules(base, self.schema)
        if not rules:
            return None
        rule = next((r for r in rules if r.matches(labels)), None)
        if rule is None:
            return None
        mdef = self.schema.metrics[base]
        dev = (labels.get("vendor", ""), labels.get("gpu", ""), labels.get("uuid", ""))
        ident = identities.get(dev) or self._identity(dev, {})
        if rule.component is not None:
            c = rule.component
            attrs: dict[str, object] = {
                "hw.id": f"{ident['hw.id']}/{c.type}/{labels.get(c.id_label, '0')}", "hw.type": c.type,
                "hw.parent": ident["hw.id"]}
            if "hw.name" in ident:
                attrs["hw.name"] = f"{ident['hw.name']} {c.type} {labels.get(c.id_label, '0')}"
        else:
            attrs = dict(ident)
        ns, ints = self.mapping.namespace, self.mapping.int_attributes
        device_labels = self.schema.device_labels
        le = math.inf
        for label, v in labels.items():
            if label in device_labels:
                continue
            if label == "le" and part == "_bucket":
                le = float(v)
                continue
            if label in self._strip and label not in mdef.allowed_labels:
                continue  # an exporter-wide label: on the resource
            attr = rule.attribute(label, ns)
            if not attr:
                continue
            v = rule.values.get(label, {}).get(v, v)
            attrs[attr] = _int(v) if attr in ints else v
        for attr, template in rule.set.items():
            attrs[attr] = fill(template, labels)
        return _Target(rule.name, rule, base, self._intern(tuple(sorted(attrs.items()))), rule.scale, part,
                       le * rule.scale if part == "_bucket" else le)

    def _intern(self, attrs: Attrs) -> AttrSet:
        a = self._interned.get(attrs)
        if a is None:
            a = self._interned[attrs] = AttrSet(attrs)
        return a

    # ------------------------------------------------------------------ hw.status
    @staticmethod
    def _status_hit(hits, status, name: str, labels: dict[str, str], value: float) -> None:
        dev = (labels.get("vendor", ""), labels.get("gpu", ""), labels.get("uuid", ""))
        for i, r in enumerate(status):
            w = r.when
            if w.metric == name and all(labels.get(k) == v for k, v in w.labels.items()) and w.matches(value):
                if i < hits.get(dev, len(status)):
                    hits[dev] = i
                return

    def _status_points(self, out: dict[str, MetricOut], identities, hits) -> int:
        if not identities:
            return 0
        m = out["hw.status"] = MetricOut("hw.status", "updowncounter", "1",
                                         "Operational status: 1 for the GPU's state, 0 for the others.")
        status = self.mapping.status
        for dev, ident in identities.items():
            state = status[hits[dev]].state if dev in hits else "ok"
            for s in HW_STATES:
                m.points[self._intern(tuple(sorted({**ident, "hw.state": s}.items())))] = 1.0 if s == state else 0.0
        return len(m.points)

    # ------------------------------------------------------------------ start times
    def _starts(self, out: dict[str, MetricOut], at: float) -> dict[tuple[str, Attrs], float]:
        """Start time of every sum and histogram point: when the push first saw it, or the
        cycle a counter went down (a reset)."""
        start, last = {}, {}
        for m in out.values():
            if m.instrument == "gauge":
                continue
            series = m.points.items() if not m.hist else ((a, h[2]) for a, h in m.hist.items())
            for attrs, value in series:
                k = (m.name, attrs)
                prev = self._last.get(k)
                reset = prev is not None and m.instrument != "updowncounter" and value < prev
                start[k] = at if reset or k not in self._start else self._start[k]
                last[k] = value
        self._start, self._last = start, last
        return start


def _int(v: str) -> object:
    try:
        return int(v)
    except ValueError:
        return v
