"""The YAML configuration file (``--config.file``), validated with pydantic.

Command-line flags override the file.  Durations are numbers of seconds or strings such as
``250ms``, ``1s``, ``2m``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from .indicators.config import IndicatorConfig
from .yamlfile import load_model

_DUR_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a duration like 1s or 250ms")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        m = _DUR_RE.match(value)
        if m:
            return float(m.group(1)) * _UNITS[m.group(2)]
    raise ValueError(f"invalid duration {value!r}: use seconds or a string like 250ms, 1s, 2m")


MIN_DURATION = 0.01      # 10 ms: below it a poll loop only burns CPU
MAX_DURATION = 86400.0   # a day: .inf would freeze values while sources look up


def _duration_range(value: float) -> float:
    if not math.isfinite(value) or not MIN_DURATION <= value <= MAX_DURATION:
        raise ValueError(f"duration {value!r} out of range: use {MIN_DURATION:g}s to {MAX_DURATION:g}s")
    return value


Duration = Annotated[float, BeforeValidator(parse_duration), Field(gt=0), AfterValidator(_duration_range)]


class CollectorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool | None = None     # None: on by default where the backend is found
    interval: Duration | None = None  # default: the global poll interval
    timeout: Duration | None = None   # default: max(interval, 2 s) ... see effective_timeout
    options: dict[str, Any] = {}


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    poll_interval: Duration = 1.0
    # fast sampling of the cheap signals that feed the contention indicators (sources that
    # offer poll_fast) and the indicator evaluation itself
    fast_interval: Duration = 0.25
    collectors: dict[str, CollectorConfig] = {}
    # static labels added to every canonical series (e.g. node, cluster)
    labels: dict[str, str] = {}
    mappings_dir: Path | None = None
    indicators: IndicatorConfig = IndicatorConfig()
    simulate: dict[str, Any] = {}
    enrich: dict[str, Any] = {}

    @model_validator(mode="after")
    def _labels(self) -> Config:
        from .schema import LABEL_RE

        reserved = {"vendor", "gpu", "uuid"}
        for name in self.labels:
            if not LABEL_RE.match(name) or name in reserved:
                raise ValueError(f"labels: {name!r} is not a valid extra label name")
        return self

    def collector(self, name: str) -> CollectorConfig:
        return self.collectors.get(name) or CollectorConfig()


def load_config(path: Path | None) -> Config:
    if path is None:
        return Config()
    return load_model(path, Config)
