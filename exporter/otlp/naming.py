"""mappings/otel.yaml: which OpenTelemetry name, unit and attributes each canonical series gets.

The file is declarative (its header explains the fields); this module validates it with pydantic
and against the canonical schema (every served metric has an entry, rule labels exist on the
metric, one OTel name has one instrument and one unit), and resolves each metric's rules with
their defaults filled in.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from ..map.schema import Schema, default_mappings_dir
from ..yamlfile import ConfigError, load_model

Instrument = Literal["gauge", "counter", "updowncounter", "histogram"]
ATTR_RE = re.compile(r"\A[a-z][a-z0-9_]*(\.[a-z0-9_]+)*\Z")
SEMVER_RE = re.compile(r"\A\d+\.\d+\.\d+\Z")
HW_STATES = ("ok", "degraded", "failed", "predicted_failure")
_PLACEHOLDER = re.compile(r"\{([a-zA-Z_][a-zA-Z0-9_]*)\}")


def placeholders(template: str) -> list[str]:
    return _PLACEHOLDER.findall(template)


def fill(template: str, labels: dict[str, str]) -> str:
    """``{label}`` placeholders replaced by the label's value (empty when absent)."""
    return _PLACEHOLDER.sub(lambda m: labels.get(m.group(1), ""), template)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Unit(_Strict):
    unit: str
    scale: float = 1.0


class Component(_Strict):
    type: Literal["temperature", "fan", "voltage"]
    id_label: str


class Rule(_Strict):
    name: str
    instrument: Instrument | None = None
    unit: str | None = None
    scale: float | None = None
    when: dict[str, list[str]] = {}
    without: list[str] = []
    attributes: dict[str, str] = {}
    values: dict[str, dict[str, str]] = {}
    set: dict[str, str] = {}
    component: Component | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not ATTR_RE.match(v):
            raise ValueError(f"{v!r} is not an OTel name (lower case, dot-separated)")
        return v

    @field_validator("attributes", "set")
    @classmethod
    def _attrs(cls, v: dict[str, str], info) -> dict[str, str]:  # noqa: ANN001
        names = v.values() if info.field_name == "attributes" else v.keys()
        for a in names:
            if a and not ATTR_RE.match(a):
                raise ValueError(f"{a!r} is not an attribute name")
        return v


class Skip(_Strict):
    skip: str = Field(min_length=1)


class StatusWhen(_Strict):
    metric: str
    labels: dict[str, str] = {}
    equals: float | None = None
    above: float | None = None

    @model_validator(mode="after")
    def _one(self) -> StatusWhen:
        if (self.equals is None) == (self.above is None):
            raise ValueError("give exactly one of equals or above")
        return self

    def matches(self, value: float) -> bool:
        return value == self.equals if self.equals is not None else value > self.above  # type: ignore[operator]


class StatusRule(_Strict):
    state: Literal["degraded", "failed", "predicted_failure"]
    when: StatusWhen


class Resolved(_Strict):
    """One rule with every default filled in (what the converter runs)."""

    name: str
    instrument: Instrument
    unit: str
    scale: float
    when: dict[str, frozenset[str]]
    without: frozenset[str]
    attributes: dict[str, str]   # label -> attribute ("" = left off), defaults merged in
    values: dict[str, dict[str, str]]
    set: dict[str, str]
    component: Component | None

    def matches(self, labels: dict[str, str]) -> bool:
        return all(labels.get(k) in v for k, v in self.when.items()) and self.without.isdisjoint(labels)

    def attribute(self, label: str, namespace: str) -> str:
        a = self.attributes.get(label)
        if a is not None:
            return a
        if label.startswith("label_"):  # pod labels copied by pod attribution
            return "k8s.pod.label." + label[len("label_"):]
        return namespace + label


class OtelMapping(_Strict):
    semconv: str
    namespace: str
    id_fallback: str
    identity: dict[str, str]
    labels: dict[str, str] = {}
    values: dict[str, dict[str, str]] = {}
    int_attributes: list[str] = []
    units: dict[str, Unit]
    status: list[StatusRule] = []
    metrics: dict[str, Rule | list[Rule] | Skip]
    _resolved: dict[str, list[Resolved]] = PrivateAttr(default_factory=dict)

    @field_validator("semconv")
    @classmethod
    def _semver(cls, v: str) -> str:
        if not SEMVER_RE.match(v):
            raise ValueError(f"{v!r} is not a version x.y.z")
        return v

    @property
    def schema_url(self) -> str:
        return f"https://opentelemetry.io/schemas/{self.semconv}"

    def entry(self, metric: str, schema: Schema) -> Rule | list[Rule] | Skip | None:
        """The metric's entry in the file, or, for a unit variant of a metric (``derive: {of:
        ...}`` in canonical.yaml) the file does not name, a skip: OTel names a quantity once and
        its points carry their unit, so the variant's metric is pushed and the variant is not."""
        entry = self.metrics.get(metric)
        mdef = schema.metrics.get(metric)
        if entry is None and mdef is not None and mdef.variant_of is not None:
            return Skip(skip=f"a unit variant of `{mdef.variant_of}` (canonical.yaml `derive.of`): "
                             "pushed once, as that metric")
        return entry

    def rules(self, metric: str, schema: Schema) -> list[Resolved]:
        """The metric's rules with defaults (empty for a skipped or unknown metric)."""
        cache = self._resolved
        if metric not in cache:
            cache[metric] = self._resolve(metric, schema)
        return cache[metric]

    def _resolve(self, metric: str, schema: Schema) -> list[Resolved]:
        entry = self.entry(metric, schema)
        mdef = schema.metrics.get(metric)
        if entry is None or isinstance(entry, Skip) or mdef is None:
            return []
        unit = self.units.get(mdef.unit, Unit(unit="1"))
        default_instrument = {"counter": "counter", "histogram": "histogram"}.get(mdef.type, "gauge")
        out = []
        for r in entry if isinstance(entry, list) else [entry]:
            out.append(Resolved(
                name=r.name, instrument=r.instrument or default_instrument,
                unit=r.unit if r.unit is not None else unit.unit,
                scale=r.scale if r.scale is not None else unit.scale,
                when={k: frozenset(v) for k, v in r.when.items()}, without=frozenset(r.without),
                attributes={**self.labels, **r.attributes},
                values={**self.values, **r.values}, set=dict(r.set), component=r.component))
        return out


def check(mapping: OtelMapping, schema: Schema, path: Path | str = "otel.yaml") -> None:
    """Raise ConfigError listing every disagreement between the mapping and the schema."""
    errors: list[str] = []
    served = {n for n, m in schema.metrics.items() if not m.internal}
    variants = {n for n in served if schema.metrics[n].variant_of is not None}
    for name in sorted(served - set(mapping.metrics) - variants):
        errors.append(f"metrics: {name} (canonical.yaml) has no entry")
    for name in sorted(set(mapping.metrics) - served):
        errors.append(f"metrics.{name}: not a served canonical metric")
    for unit in sorted({schema.metrics[n].unit for n in served - variants} - set(mapping.units)):
        errors.append(f"units: canonical unit {unit!r} has no entry")
    seen: dict[str, tuple[str, str, str]] = {}
    for metric in sorted(served & set(mapping.metrics)):
        mdef = schema.metrics[metric]
        known = set(schema.device_labels) | mdef.allowed_labels
        rules = mapping.rules(metric, schema)
        for i, r in enumerate(rules):
            where = f"metrics.{metric}" + (f"[{i}]" if len(rules) > 1 else "")
            if not r.name.startswith(("hw.", mapping.namespace)):
                errors.append(f"{where}: {r.name} is neither a convention (hw.*) nor ours ({mapping.namespace}*)")
            raw = mapping.metrics[metric]
            own = raw[i] if isinstance(raw, list) else raw
            assert isinstance(own, Rule)
            used = set(own.when) | set(own.without) | set(own.attributes) | set(own.values) | {
                p for v in own.set.values() for p in placeholders(v)}
            if own.component:
                used.add(own.component.id_label)
            for label in sorted(used - known):
                errors.append(f"{where}: {metric} has no label {label!r}")
            expected = {"counter": {"counter"}, "histogram": {"histogram"}}.get(mdef.type, {"gauge", "updowncounter"})
            if r.instrument not in expected:
                errors.append(f"{where}: a canonical {mdef.type} cannot be a {r.instrument}")
            if i < len(rules) - 1 and not (r.when or r.without):
                errors.append(f"{where}: only the last rule may have no `when` or `without`")
            parts = set(mdef.optional_labels) - r.without - ({r.component.id_label} if r.component else set())
            if r.name.startswith("hw.") and parts:
                errors.append(f"{where}: {r.name} is a convention metric, for the whole GPU: leave the series of "
                              f"a part out (without: {sorted(parts)}) and name those in a later rule of ours")
            prev = seen.setdefault(r.name, (r.instrument, r.unit, metric))
            if prev[:2] != (r.instrument, r.unit):
                errors.append(f"{where}: {r.name} is a {r.instrument} in {r.unit} here but a {prev[0]} "
                              f"in {prev[1]} for {prev[2]}")
    for i, s in enumerate(mapping.status):
        if s.when.metric not in schema.metrics and not s.when.metric.startswith("unified_gpu_exporter_"):
            errors.append(f"status[{i}]: unknown metric {s.when.metric}")
    if errors:
        raise ConfigError(f"{path}: " + f"\n{path}: ".join(errors))


def load_mapping(schema: Schema, mappings_dir: Path | None = None) -> OtelMapping:
    path = (mappings_dir or default_mappings_dir()) / "otel.yaml"
    if not path.is_file():  # a custom --mappings.dir without it: the shipped one
        path = default_mappings_dir() / "otel.yaml"
    mapping = load_model(path, OtelMapping)
    check(mapping, schema, path)
    return mapping
