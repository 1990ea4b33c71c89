"""The canonical schema (mappings/canonical.yaml): metric names, types, units, help, labels."""

from __future__ import annotations

import math
import re
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..yamlfile import ConfigError, load_model

# \A...\Z, not ^...$: "$" also matches before a trailing newline, and a name "gpu\n" breaks
# every line of the exposition it appears in
NAME_RE = re.compile(r"\A[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
LABEL_RE = re.compile(r"\A[a-zA-Z_][a-zA-Z0-9_]*\Z")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
_OPERAND_RE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?$')
_MATCHER_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"([^"]*)"\s*')


@lru_cache(maxsize=4096)  # the simulator parses its scenario's keys at every poll
def parse_operand(text: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """``metric{label="v",...}`` -> (metric, ((label, v), ...))."""
    m = _OPERAND_RE.match(text.strip())
    if not m:
        raise ValueError(f"operand {text!r} is not metric or metric{{label=\"value\"}}")
    matchers: list[tuple[str, str]] = []
    if m.group("labels"):
        for part in m.group("labels").split(","):
            mm = _MATCHER_RE.fullmatch(part)
            if not mm:
                raise ValueError(f"operand {text!r}: bad label matcher {part!r}")
            matchers.append((mm.group(1), mm.group(2)))
    return m.group("name"), tuple(sorted(matchers))


class Derive(BaseModel):
    """``ratio: [a, b]`` (a / b x scale), ``product: [a, b]`` (a x b x scale), or ``of: a`` (a x
    scale): a unit variant of ``a``, the same quantity in another unit, declared once here for
    every source that maps ``a`` (its labels are ``a``'s unless given; OTel carries ``a`` only)."""

    model_config = ConfigDict(extra="forbid")
    ratio: list[str] | None = Field(default=None, min_length=2, max_length=2)
    product: list[str] | None = Field(default=None, min_length=2, max_length=2)
    of: str | None = Field(default=None, min_length=1)
    scale: float = 1.0

    @model_validator(mode="after")
    def _one_op(self) -> Derive:
        if sum(op is not None for op in (self.ratio, self.product, self.of)) != 1:
            raise ValueError("give exactly one of ratio, product or of")
        if not math.isfinite(self.scale) or (self.of is not None and self.scale == 0):
            raise ValueError("scale must be a finite number (not 0 for a unit variant)")
        if self.of is not None and "{" in self.of:
            raise ValueError("of: a unit variant scales a whole metric (no label selector)")
        for operand in self.operands_text:
            parse_operand(operand)
        return self

    @property
    def op(self) -> str:
        return "ratio" if self.ratio is not None else "product" if self.product is not None else "scale"

    @property
    def operands_text(self) -> list[str]:
        if self.of is not None:
            return [self.of]
        return list(self.ratio if self.ratio is not None else self.product or [])

    @property
    def operands(self) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
        return [parse_operand(o) for o in self.operands_text]


class MetricDef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["gauge", "counter", "info", "histogram"]
    unit: str = ""
    help: str = Field(min_length=1)
    labels: list[str] = []
    optional_labels: list[str] = []
    derive: Derive | None = None
    # histogram: the bucket upper bounds sources are expected to use (documentation and checks)
    buckets: list[float] = []
    # smallest valid value (e.g. 0 for a clock): mapped values below it are skipped and counted
    min: float | None = None
    # fed to the indicators but never served (co-tenancy evidence collected count-only: the
    # per-client values a count is made of carry pids, which a default install does not export)
    internal: bool = False
    # refreshed by fast polls between full polls (an input of the contention indicators)
    fast: bool = False
    # kept by the exposition profile `minimal` (exporter/render/seriesfilter.py)
    minimal: bool = False

    @field_validator("labels", "optional_labels")
    @classmethod
    def _label_names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not LABEL_RE.match(name) or name.startswith("__"):
                raise ValueError(f"invalid label name {name!r}")
        return v

    @cached_property
    def allowed_labels(self) -> frozenset[str]:
        return frozenset(self.labels) | frozenset(self.optional_labels)

    @property
    def variant_of(self) -> str | None:
        """The metric this one is a unit variant of (``derive: {of: ...}``), if it is one."""
        return self.derive.of if self.derive is not None else None


class Schema(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int
    device_labels: list[str]
    instance_labels: list[str] = []
    metrics: dict[str, MetricDef]

    @cached_property
    def fast_metrics(self) -> frozenset[str]:
        """The metrics a fast poll refreshes (``fast: true``)."""
        return frozenset(name for name, m in self.metrics.items() if m.fast)

    @cached_property
    def minimal_metrics(self) -> frozenset[str]:
        """The metrics the exposition profile ``minimal`` keeps (``minimal: true``)."""
        return frozenset(name for name, m in self.metrics.items() if m.minimal)

    @model_validator(mode="after")
    def _check(self) -> Schema:
        for name, m in self.metrics.items():
            if not NAME_RE.match(name):
                raise ValueError(f"metrics.{name}: invalid metric name")
            if m.type == "counter" and not name.endswith("_total"):
                raise ValueError(f"metrics.{name}: counter names must end in _total")
            if m.type != "counter" and name.endswith("_total"):
                raise ValueError(f"metrics.{name}: only counters may end in _total")
            if m.type == "histogram":
                if name.endswith(HISTOGRAM_SUFFIXES):
                    raise ValueError(f"metrics.{name}: a histogram's name has no _bucket/_sum/_count")
                if "le" in m.allowed_labels:
                    raise ValueError(f"metrics.{name}: le is the histogram's own bucket label")
                if m.derive is not None and m.derive.of is None:
                    raise ValueError(f"metrics.{name}: a histogram is derived only as a unit variant (of)")
            elif m.buckets:
                raise ValueError(f"metrics.{name}: buckets apply to histograms only")
            clash = set(self.device_labels) & m.allowed_labels
            if clash:
                raise ValueError(f"metrics.{name}: labels {sorted(clash)} are device labels")
            if m.derive:
                for op_name, matchers in m.derive.operands:
                    if op_name not in self.metrics:
                        raise ValueError(f"metrics.{name}.derive: unknown metric {op_name!r}")
                    target = self.metrics[op_name]
                    for label, _ in matchers:
                        if label not in target.allowed_labels:
                            raise ValueError(
                                f"metrics.{name}.derive: {op_name} has no label {label!r}")
            if m.variant_of is not None:
                self._check_variant(name, m)
        self.derived()  # raises on a cycle
        return self

    def _check_variant(self, name: str, m: MetricDef) -> None:
        """A unit variant is its metric in another unit: same type, same labels (taken from the
        metric when the variant lists none), a unit of its own."""
        of = self.metrics[m.variant_of]  # type: ignore[index]
        where = f"metrics.{name}.derive.of"
        if of.type != m.type or m.type not in ("gauge", "counter", "histogram"):
            raise ValueError(f"{where}: a unit variant has its metric's type ({m.variant_of} is a {of.type}, "
                             f"{name} a {m.type}; gauges, counters and histograms only)")
        scaled = [b * m.derive.scale for b in of.buckets]  # type: ignore[union-attr]
        if m.type == "histogram" and (len(m.buckets) != len(scaled) or not all(
                math.isclose(a, b, rel_tol=1e-9) for a, b in zip(m.buckets, scaled, strict=True))):
            raise ValueError(f"{where}: a histogram's unit variant has its metric's buckets x scale ({scaled})")
        if of.derive is not None and of.derive.of is not None:
            raise ValueError(f"{where}: {m.variant_of} is a variant itself: name the metric it varies")
        if not {"labels", "optional_labels"} & m.model_fields_set:
            m.labels, m.optional_labels = list(of.labels), list(of.optional_labels)
            m.__dict__.pop("allowed_labels", None)
        elif (set(m.labels), set(m.optional_labels)) != (set(of.labels), set(of.optional_labels)):
            raise ValueError(f"{where}: a unit variant has its metric's labels ({m.variant_of}: labels "
                             f"{of.labels}, optional_labels {of.optional_labels}); leave them out to inherit")
        if m.unit == of.unit:
            raise ValueError(f"{where}: a unit variant has a unit of its own ({m.variant_of} is in {of.unit!r})")

    def derived(self) -> list[tuple[str, MetricDef]]:
        """Derived metrics in dependency order (operands that are derived come first)."""
        cached = self.__dict__.get("_derived_order")
        if cached is not None:
            return cached
        order: list[tuple[str, MetricDef]] = []
        done: set[str] = set()

        def visit(name: str, path: tuple[str, ...]) -> None:
            if name in done:
                return
            if name in path:
                raise ValueError(f"metrics.{name}.derive: cycle {' -> '.join(path + (name,))}")
            mdef = self.metrics[name]
            if mdef.derive is None:
                return
            for op_name, _ in mdef.derive.operands:
                visit(op_name, path + (name,))
            done.add(name)
            order.append((name, mdef))

        for name in self.metrics:
            visit(name, ())
        self.__dict__["_derived_order"] = order
        return order


def default_mappings_dir() -> Path:
    """mappings/ of the checkout this package was imported from, or else the copy shipped inside
    the wheel (package ``exporter.mappings``).

    The checkout comes first: an editable install maps ``exporter.mappings`` to the checkout it
    was installed from, so a second checkout run with the same venv (its own ``exporter/`` first
    on the path) would otherwise read the first one's mapping files."""
    root = Path(__file__).resolve().parent.parent.parent  # exporter/map/schema.py -> the checkout
    if (root / "mappings" / "canonical.yaml").is_file() and (root / "pyproject.toml").is_file():
        return root / "mappings"
    try:
        from importlib.resources import files

        shipped = Path(str(files("exporter.mappings")))
        if (shipped / "canonical.yaml").is_file():
            return shipped
    except (ModuleNotFoundError, TypeError):
        pass
    return Path(__file__).resolve().parent.parent / "mappings"


def load_schema(path: Path | None = None) -> Schema:
    path = path or default_mappings_dir() / "canonical.yaml"
    schema = load_model(path, Schema)
    if not schema.metrics:
        raise ConfigError(f"{path}: metrics: no metrics defined")
    return schema
