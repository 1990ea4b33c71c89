"""Cardinality control at exposition time (config section ``exposition``).

Sources poll and the indicators compute as before; only what ``/metrics`` serves is filtered:

* ``profile``: ``default`` (every metric) or ``minimal`` (the health and utilization core, see
  the metrics marked `minimal: true` in mappings/canonical.yaml; README "Series budget" has the
  numbers per GPU).
* ``include`` / ``exclude``: shell globs on metric family names (``gpu_process_*``,
  ``gpu_kernel_*``).  Include narrows the profile; exclude then removes.  The exporter's own
  ``unified_gpu_exporter_*`` metrics are not subject to the profile or ``include`` (alerts and
  dashboards need them) but can be excluded by name.
* ``label_allowlist``: label names a GPU series may carry beyond its identity (vendor, gpu,
  uuid) and the fixed-set labels its metric requires (sensor, domain, reason, severity, ...).  A
  series with another label outside the list is not served: optional labels (per-link ``link``,
  MIG ``gpu_instance``, ``engine``, ``source`` ...: the per-device series remain where the source
  has them) and the unbounded entity labels ``pid``, ``process``, ``kernel``, ``trace_id``, even
  where the metric requires them (so per-process and per-kernel metrics go entirely).  Static and enrichment labels outside the list (``pod``,
  ``namespace``, ``instance_type`` ...) are removed from every series instead: they are the same
  on every series of a device, so removing them never merges two series.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..map.schema import LABEL_RE, Schema

Labels = tuple[tuple[str, str], ...]
SELF_PREFIX = "unified_gpu_exporter_"
DEVICE_LABELS = frozenset({"vendor", "gpu", "uuid"})
# labels that name unbounded entities: subject to the allow-list even where a metric requires them
UNBOUNDED_LABELS = frozenset({"pid", "process", "kernel", "trace_id"})

# The minimal profile: identity, utilization, memory, the contention verdict and contended
# seconds (the critical GPUMemoryContentionFraction alert), power/thermal and the hardware-health
# signals the alerts in deploy/prometheus/rules/*.health.yml read.  The alerts whose inputs it
# drops are listed in the README's alert table (scripts/gen-alert-docs.py computes them).  Which
# metrics it keeps is declared per metric: `minimal: true` in mappings/canonical.yaml.
PROFILE_NAMES = ("default", "minimal")


class ExpositionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    profile: Literal[PROFILE_NAMES] = Field("default", description=(
        "default: every series; minimal: the series the health alerts need (README \"Series budget\")"))
    include: list[str] = Field([], description="metric name globs: only these are served")
    exclude: list[str] = Field([], description="metric name globs not served (self-metrics included)")
    label_allowlist: list[str] | None = Field(None, description=(
        "labels a GPU series may carry beyond vendor/gpu/uuid and its fixed dimensions; series with other "
        "optional labels are not served (default: no limit)"))

    @field_validator("include", "exclude")
    @classmethod
    def _globs(cls, v: list[str]) -> list[str]:
        for pattern in v:
            if not pattern or not re.fullmatch(r"[a-zA-Z0-9_:*?\[\]!-]+", pattern):
                raise ValueError(f"{pattern!r} is not a metric name glob (letters, digits, _ : * ? [ ])")
        return v

    @field_validator("label_allowlist")
    @classmethod
    def _labels(cls, v: list[str] | None) -> list[str] | None:
        for name in v or []:
            if not LABEL_RE.match(name):
                raise ValueError(f"{name!r} is not a valid label name")
        return v


def profile_metrics(schema: Schema, profile: str) -> frozenset[str] | None:
    """The families exposition profile ``profile`` keeps, as canonical.yaml declares them (None: all)."""
    return schema.minimal_metrics if profile == "minimal" else None


def _match(name: str, patterns: list[str] | tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


class SeriesFilter:
    """Decides per family (cached) and, with an allow-list, per label set."""

    def __init__(self, conf: ExpositionConfig, schema: Schema, self_metrics: tuple[str, ...] = ()):
        self.conf = conf
        self.profile = profile_metrics(schema, conf.profile)
        self.allow = None if conf.label_allowlist is None else frozenset(conf.label_allowlist)
        self._families: dict[str, bool] = {}
        self._required = {name: (frozenset(m.labels) - UNBOUNDED_LABELS) | DEVICE_LABELS | {"le"}
                          for name, m in schema.metrics.items()}
        known = list(schema.metrics) + [SELF_PREFIX + n for n in self_metrics]
        for where, patterns in (("include", conf.include), ("exclude", conf.exclude)):
            for p in patterns:
                if not any(fnmatch.fnmatchcase(n, p) for n in known):
                    raise ValueError(f"exposition.{where}: {p!r} matches no metric")

    @property
    def active(self) -> bool:
        return bool(self.profile or self.conf.include or self.conf.exclude or self.allow is not None)

    def family(self, name: str) -> bool:
        keep = self._families.get(name)
        if keep is None:
            keep = True
            if not name.startswith(SELF_PREFIX):
                if self.profile is not None and name not in self.profile:
                    keep = False
                if self.conf.include and not _match(name, self.conf.include):
                    keep = False
            if keep and self.conf.exclude and _match(name, self.conf.exclude):
                keep = False
            self._families[name] = keep
        return keep

    def labels_ok(self, family: str, labels: Labels) -> bool:
        """False when the series carries an optional label outside the allow-list."""
        if self.allow is None:
            return True
        required = self._required.get(family, DEVICE_LABELS)
        return all(k in required or k in self.allow for k, _ in labels)

    def extra(self, labels: Labels) -> Labels:
        """Static/enrichment labels without the ones the allow-list leaves out."""
        if self.allow is None:
            return labels
        return tuple((k, v) for k, v in labels if k in self.allow)
