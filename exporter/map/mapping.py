"""Vendor mapping files: validated against the canonical schema, compiled into lookup tables.

This module only loads: a file becomes a ``CompiledMapping`` (raw field name -> compiled
``Rule`` entries) and a directory a ``MappingSet``; the YAML is walked only at load time.
Applying the rules to readings, and the state that outlives one poll (counter offsets across
resets, the previous value for rates), is ``exporter.map.mapper.Mapper``, one per source.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..model import Labels
from ..yamlfile import ConfigError, load_yaml, validation_message
from .schema import LABEL_RE, MetricDef, Schema


class FieldRule(BaseModel):
    model_config = ConfigDict(extra="forbid")
    raw: str = Field(min_length=1)
    metric: str
    scale: float = 1.0
    offset: float = 0.0
    labels: dict[str, str] = {}
    label_map: dict[str, str] = {}
    # rate: per-second rate of a raw counter (a gauge); integrate: a counter accumulated from a
    # raw throughput gauge (value x scale x seconds between polls)
    transform: Literal["none", "rate", "integrate"] = "none"
    wrap: float | None = Field(default=None, gt=0)
    invalid: list[float] = []  # values that are not readings: skipped and counted as malformed
    # a vendor's "no value" sentinels (DCGM's blank INT64/FP64 values, a sensor that reads 0 when
    # absent): skipped like ``invalid`` but not an error (nothing counted)
    blank: list[float] = []
    # a lookup applied to the raw value before scale/offset (e.g. PCIe generation -> GT/s); a raw
    # value not listed is malformed
    values: dict[float, float] = {}
    clamp: tuple[float, float] | None = None
    # [low, high] after scale/offset: a value outside is malformed (skipped and counted), e.g. a
    # negative clock.  Default: the canonical metric's ``min`` (canonical.yaml), if any
    valid: tuple[float, float] | None = None
    # several entries feeding one series in one poll: the first listed wins, or combine them
    combine: Literal["first", "max", "sum"] = "first"
    # for a histogram metric: which part this raw field is (bucket counts carry an `le` label)
    histogram: Literal["bucket", "sum", "count"] | None = None
    # a profiling counter (DCGM DCP, NVML GPM): subject to the file's profiling_guard ("a zero is
    # not always a value"), and a blank (``invalid``) reading of it counts as profiling_unavailable
    profiling: bool = False
    # evidence of the unit, for a rule qualified by a schema (``name{schema="S"}``, the reading of
    # a name whose unit depends on the generation): HELP text the target serves in this unit (a
    # regular expression), and whether a raw value in this unit is always a whole number (DCGM
    # INT64 fields).  Values outside ``valid`` after scale/offset are evidence against it as well.
    unit_help: str | None = Field(default=None, max_length=200)
    integer: bool = False
    # a ratio of two raw fields: the raw value divided by the value of this raw field of the same
    # device (and raw labels) in the same poll, before scale/offset (amdgpu hwmon pwm1 / pwm1_max).
    # A poll without the divisor, or with 0, skips the value and counts it malformed
    divide_by: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _names(self) -> FieldRule:
        for name in list(self.labels) + list(self.label_map.values()):
            if not LABEL_RE.match(name):
                raise ValueError(f"invalid label name {name!r}")
        if self.clamp and self.clamp[0] > self.clamp[1]:
            raise ValueError("clamp: low bound is above high bound")
        for name in ("scale", "offset"):  # .nan or .inf would poison every value of the field
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number")
        if self.clamp and any(math.isnan(b) for b in self.clamp):
            raise ValueError("clamp bounds must be numbers, not .nan")
        if self.valid and (any(math.isnan(b) for b in self.valid) or self.valid[0] > self.valid[1]):
            raise ValueError("valid: [low, high] with low <= high, no .nan")
        if any(math.isnan(v) for v in self.invalid + self.blank):
            raise ValueError("invalid: .nan never matches; NaN values are always skipped")
        if (self.unit_help is not None or self.integer) and 'schema="' not in self.raw:
            raise ValueError("unit_help/integer are evidence between schemas: only for a raw field "
                             'qualified by one (name{schema="S"})')
        if self.divide_by is not None and self.divide_by == self.raw:
            raise ValueError("divide_by: a raw field divided by itself is 1")
        if self.divide_by is not None and 'schema="' in self.raw + self.divide_by:
            raise ValueError("divide_by: not for a raw field qualified by a schema (its unit is weighed "
                             "per scrape; a ratio's is not)")
        if self.unit_help is not None:
            try:
                re.compile(self.unit_help)
            except re.error as exc:
                raise ValueError(f"unit_help is not a regular expression: {exc}") from None
        return self


class ProfilingGuard(BaseModel):
    """When every profiling reading of a GPU is 0 while ``busy_metric`` (fed by the file's
    non-profiling rules, GPU level) is at least ``busy_above``, the profiling readings are not
    values (another profiler holds the counters, the profiling module is not loaded): they are
    skipped and counted as ``profiling_unavailable``, and ``gpu_profiling_available`` reads 0."""

    model_config = ConfigDict(extra="forbid")
    busy_metric: str = "gpu_compute_utilization_percent"
    busy_above: float = Field(10.0, ge=0)


class SchemaRule(BaseModel):
    """One naming generation of an upstream exporter, recognised by any of its markers: a raw
    name (``names``), a raw-name prefix (``prefixes``) or a label name (``labels``) on a series."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")
    description: str = ""
    names: list[str] = []
    prefixes: list[str] = []
    labels: list[str] = []


class MappingFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    vendor: Literal["nvidia", "amd", "intel"]
    description: str = ""
    fields: list[FieldRule]
    profiling_guard: ProfilingGuard = ProfilingGuard()
    # upstream exporters: the naming generations, most recent first; the first whose marker a
    # scrape shows is that target's schema, the last one (no marker needed) the default
    schemas: list[SchemaRule] = []
    # raw names the exporter serves that are deliberately not mapped (not counted as unknown)
    not_mapped: list[str] = []
    # the schema reported for a target whose schema-dependent fields could not be read with one
    # proven unit this scrape (they are skipped and counted as unit_ambiguous)
    schema_ambiguous: str = Field("ambiguous", pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")

    @model_validator(mode="after")
    def _schema_names(self) -> MappingFile:
        names = [s.name for s in self.schemas]
        if len(set(names)) != len(names):
            raise ValueError("schemas: names must be unique")
        return self


@dataclass(slots=True, frozen=True)
class Rule:
    """One compiled mapping entry."""

    order: int
    raw: str
    metric: str
    is_counter: bool
    fixed: Labels
    label_map: tuple[tuple[str, str], ...]
    scale: float
    offset: float
    rate: bool
    wrap: float | None
    invalid: frozenset[float]  # every value skipped (``invalid`` and ``blank``)
    clamp: tuple[float, float] | None
    combine: str
    valid: tuple[float, float] | None
    series: str  # the sample name written: the metric, or metric_bucket/_sum/_count
    values: tuple[tuple[float, float], ...] = ()  # raw value lookup, before scale and offset
    profiling: bool = False  # subject to the file's profiling guard
    integrate: bool = False  # a counter accumulated from a throughput gauge
    unit_help: re.Pattern[str] | None = None  # a help text saying the target serves this unit
    integer: bool = False  # a raw value in this unit is a whole number
    divide_by: str | None = None  # the raw field this one is divided by (same device, same poll)
    blank: frozenset[float] = frozenset()  # the skipped values that are not counted as errors


@dataclass(slots=True)
class CompiledMapping:
    name: str
    path: Path
    vendor: str
    rules: dict[str, tuple[Rule, ...]]
    profiling_guard: ProfilingGuard | None = None  # set when the file has profiling rules
    schemas: tuple[SchemaRule, ...] = ()
    not_mapped: frozenset[str] = frozenset()
    schema_ambiguous: str = "ambiguous"
    # raw fields whose rules are qualified by a schema (the unqualified names), and the label
    # names that mark a schema: what the upstream source weighs per scrape, fixed at load
    schema_dependent: frozenset[str] = frozenset()
    schema_markers: frozenset[str] = frozenset()
    # raw fields some rule divides by (``divide_by``): the mapper keeps their values per poll
    divisors: frozenset[str] = frozenset()


# a ``schema="S"`` selector label of a raw field (``name{schema="S"}``, ``name{a="x",schema="S"}``)
_SCHEMA_SELECTOR = re.compile(r'(?:,|(?<=\{))schema="([^"\\]*)"(?=[,}])')


def _schema_dependent(raws: Collection[str]) -> frozenset[str]:
    """The raw fields among ``raws`` qualified by a schema, with the selector dropped."""
    out = set()
    for raw in raws:
        if 'schema="' in raw:
            base = _SCHEMA_SELECTOR.sub("", raw).replace("{,", "{")
            out.add(base[:-2] if base.endswith("{}") else base)
    return frozenset(out)


def _check_rule(schema: Schema, rule: FieldRule) -> str | None:
    mdef: MetricDef | None = schema.metrics.get(rule.metric)
    if mdef is None:
        return f"unknown canonical metric {rule.metric!r}"
    if mdef.type == "info":
        return f"{rule.metric} is an info metric built from device identity, not mapped"
    produced = set(rule.labels) | set(rule.label_map.values())
    if mdef.type == "histogram":
        if rule.histogram is None:
            return f"{rule.metric} is a histogram: say which part with histogram: bucket|sum|count"
        if rule.transform != "none":
            return "a histogram part is mapped as read (no transform)"
        if (rule.histogram == "bucket") != ("le" in produced):
            return "the bucket part, and only it, needs the le label (label_map: {<raw>: le})"
        produced.discard("le")
    elif rule.histogram is not None:
        return f"histogram: applies to histogram metrics; {rule.metric} is a {mdef.type}"
    extra = produced - mdef.allowed_labels
    if extra:
        return (f"labels {sorted(extra)} are not allowed on {rule.metric} "
                f"(allowed: {sorted(mdef.allowed_labels) or 'none'})")
    missing = set(mdef.labels) - produced
    if missing:
        return f"{rule.metric} requires labels {sorted(missing)}"
    if mdef.type == "counter" and rule.transform == "rate":
        return f"transform: rate makes a gauge, but {rule.metric} is a counter"
    if rule.transform == "integrate" and (mdef.type != "counter" or rule.wrap is not None):
        return f"transform: integrate makes a counter (no wrap), but {rule.metric} is a {mdef.type}"
    if rule.values and (mdef.type != "gauge" or rule.transform != "none"):
        return "values: (a lookup table) applies to gauges mapped as read"
    if rule.wrap is not None and mdef.type != "counter" and rule.transform != "rate":
        return "wrap applies only to raw counters (a counter metric or transform: rate)"
    if rule.profiling and (mdef.type != "gauge" or rule.transform != "none"):
        return "profiling: applies to gauges mapped as read"
    return None


def _check_divide_by(schema: Schema, rule: FieldRule) -> str | None:
    mdef = schema.metrics[rule.metric]
    if mdef.type != "gauge" or rule.transform != "none" or rule.values or rule.profiling:
        return f"divide_by: a ratio of two raw fields is a gauge mapped as read ({rule.metric} is a {mdef.type}" + (
            f", transform: {rule.transform}" if rule.transform != "none" else "") + (
            ", with values:" if rule.values else "") + (", profiling" if rule.profiling else "") + ")"
    return None


def load_mapping(path: Path, schema: Schema, name: str | None = None) -> CompiledMapping:
    data, lines = load_yaml(path)
    try:
        parsed = MappingFile.model_validate(data if data is not None else {})
    except ValidationError as exc:
        raise ConfigError(validation_message(path, lines, exc)) from None
    rules: dict[str, list[Rule]] = {}
    schema_names = {sr.name for sr in parsed.schemas}
    for i, fr in enumerate(parsed.fields):
        if any(n not in schema_names for n in _SCHEMA_SELECTOR.findall(fr.raw)):
            raise ConfigError(f"{path}:{lines.get(('fields', i, 'raw')) or lines.get(('fields', i))}: "
                              f"fields[{i}].raw: {fr.raw!r} names a schema the file does not list "
                              f"({sorted(schema_names)})")
        problem = _check_rule(schema, fr)
        if problem:
            line = lines.get(("fields", i, "metric")) or lines.get(("fields", i))
            raise ConfigError(f"{path}:{line}: fields[{i}].metric: {problem}")
        problem = _check_divide_by(schema, fr) if fr.divide_by is not None else None
        if problem:
            line = lines.get(("fields", i, "divide_by")) or lines.get(("fields", i))
            raise ConfigError(f"{path}:{line}: fields[{i}].divide_by: {problem}")
        mdef = schema.metrics[fr.metric]
        rules.setdefault(fr.raw, []).append(Rule(
            order=i, raw=fr.raw, metric=fr.metric, is_counter=mdef.type == "counter",
            fixed=tuple(sorted(fr.labels.items())), label_map=tuple(fr.label_map.items()),
            scale=fr.scale, offset=fr.offset, rate=fr.transform == "rate", wrap=fr.wrap,
            invalid=frozenset(fr.invalid + fr.blank), blank=frozenset(fr.blank), clamp=fr.clamp, combine=fr.combine,
            valid=fr.valid or ((mdef.min, math.inf) if mdef.min is not None else None),
            series=fr.metric + (f"_{fr.histogram}" if fr.histogram else ""),
            values=tuple(sorted(fr.values.items())), profiling=fr.profiling,
            unit_help=re.compile(fr.unit_help) if fr.unit_help is not None else None,
            integer=fr.integer, integrate=fr.transform == "integrate", divide_by=fr.divide_by))
    guard = parsed.profiling_guard
    if any(fr.profiling for fr in parsed.fields):
        if guard.busy_metric not in schema.metrics:
            line = lines.get(("profiling_guard", "busy_metric")) or lines.get(("profiling_guard",))
            raise ConfigError(f"{path}:{line}: profiling_guard.busy_metric: unknown canonical metric "
                              f"{guard.busy_metric!r}")
    else:
        guard = None
    return CompiledMapping(name or path.stem, path, parsed.vendor,
                           {k: tuple(v) for k, v in rules.items()}, guard, tuple(parsed.schemas),
                           frozenset(parsed.not_mapped), parsed.schema_ambiguous, _schema_dependent(rules),
                           frozenset(lbl for sr in parsed.schemas for lbl in sr.labels),
                           frozenset(fr.divide_by for fr in parsed.fields if fr.divide_by is not None))


class MappingSet:
    """Every mapping file under a directory, by name (``nvml``, ``upstream/dcgm-exporter``)."""

    def __init__(self, schema: Schema, mappings: dict[str, CompiledMapping]):
        self.schema = schema
        self.mappings = mappings
        self._raw_fields: dict[frozenset[str] | None, dict[str, frozenset[str]]] = {}

    @classmethod
    def load_dir(cls, directory: Path, schema: Schema) -> MappingSet:
        found: dict[str, CompiledMapping] = {}
        errors: list[str] = []  # every broken file is reported, not only the first
        for path in sorted(directory.rglob("*.yaml")):
            # canonical.yaml: the schema; otel.yaml: OTel names (exporter/otlp/naming.py)
            if path.name in ("canonical.yaml", "otel.yaml") or "scenarios" in path.relative_to(directory).parts:
                continue
            name = path.relative_to(directory).with_suffix("").as_posix()
            try:
                found[name] = load_mapping(path, schema, name)
            except ConfigError as exc:
                errors.append(str(exc))
        if errors:
            raise ConfigError("\n".join(errors))
        return cls(schema, found)

    def get(self, name: str) -> CompiledMapping | None:
        return self.mappings.get(name)

    def raw_fields(self, metrics: Collection[str] | None = None) -> dict[str, frozenset[str]]:
        """Per mapping file, the raw fields its rules map (only the rules feeding ``metrics``,
        when given), and the raw fields those rules divide by: what a source need read, and what
        a fast poll need map.  Computed once per set of metrics (a loaded set does not change)."""
        key = None if metrics is None else frozenset(metrics)
        table = self._raw_fields.get(key)
        if table is None:
            table = self._raw_fields[key] = {}
            for name, cm in self.mappings.items():
                used = [r for rules in cm.rules.values() for r in rules if key is None or r.metric in key]
                table[name] = frozenset(r.raw for r in used) | {r.divide_by for r in used if r.divide_by}
        return table


__all__ = ["CompiledMapping", "MappingSet", "Rule", "load_mapping"]
