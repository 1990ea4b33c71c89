"""The indicator engine as these tests drive it: a GPU's series written as text.

The engine reads and writes frames (``{(name, extra labels): value}`` per GPU).  The tests write
a GPU's series as ``{"name": v, 'name{label="x"}': v, (name, extra): v}`` and read the output as
``[(name, {label: value}, value), ...]`` (every device's, in order): ``TextEngine`` converts both
ways around the real engine, nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from exporter.indicators import IndicatorEngine
from exporter.model import DeviceId, Frame, Frames

_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def parse_key(key: str) -> tuple[str, dict[str, str]]:
    """Split ``name{a="x",b="y"}`` into ``("name", {"a": "x", "b": "y"})`` (Prometheus escaping)."""
    brace = key.find("{")
    if brace < 0:
        return key, {}
    name = key[:brace]
    body = key[brace + 1:key.rfind("}")] if key.endswith("}") else key[brace + 1:]
    labels = {m.group(1): m.group(2).replace('\\"', '"').replace("\\\\", "\\")
              for m in _LABEL.finditer(body)}
    return name, labels


def frame(series: Mapping) -> Frame:
    """One GPU's series as the engine's frame: keys "name", 'name{a="x"}' or (name, extra)."""
    out: Frame = {}
    for key, value in series.items():
        if isinstance(key, tuple):
            out[(key[0], tuple(sorted(key[1])))] = value
        else:
            name, labels = parse_key(key)
            out[(name, tuple(sorted(labels.items())))] = value
    return out


def engine_inputs(series: Mapping) -> dict:
    """Mapped series (``{(name, label pairs incl. identity): value}``) as the feed hands them to
    the engine, in this module's text form: the identity labels aside."""
    out = {}
    for (name, labels), value in series.items():
        extra = tuple(sorted((k, v) for k, v in labels if k not in ("vendor", "gpu", "uuid")))
        out[(name, extra) if extra else name] = value
    return out


def flat_output(frames: Frames) -> list[tuple[str, dict[str, str], float]]:
    """The engine's output as (name, its own labels, value), device after device."""
    return [(name, dict(extra), value) for f in frames.values() for (name, extra), value in f.items()]


class TextEngine(IndicatorEngine):
    """``IndicatorEngine`` with ``update`` taking and returning the tests' text form."""

    def update(self, now: float, devices: Mapping[DeviceId, Mapping],  # type: ignore[override]
               client_intervals: Mapping[DeviceId, float] | None = None) -> list:
        return flat_output(super().update(now, {d: frame(s) for d, s in devices.items()}, client_intervals))
