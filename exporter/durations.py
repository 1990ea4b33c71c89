"""The one duration grammar of every configuration file and flag (config file, web config, CLI).

Prometheus style: one or more ``<number><unit>`` parts, largest unit first, each unit at most
once: ``1m30s``, ``1h``, ``1d``, ``250ms``, ``2w``.  Units: ``y`` (365 d), ``w``, ``d``, ``h``,
``m``, ``s``, ``ms``.  Unlike Prometheus, a part may have a decimal fraction (``1.5s``,
``0.5m``), and a bare number is seconds (``2``, ``0.25``, or a YAML number).
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field

UNITS: dict[str, float] = {"y": 365 * 86400.0, "w": 7 * 86400.0, "d": 86400.0, "h": 3600.0,
                           "m": 60.0, "s": 1.0, "ms": 0.001}
_ORDER = list(UNITS)
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|y|w|d|h|m|s)")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
HINT = "use a duration such as 250ms, 1.5s, 1m30s, 2h or 1d"
MAX_SECONDS = 100 * 365 * 86400.0


def parse_duration(value: Any) -> float:
    """A duration (string or number of seconds) -> seconds.  Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}: {HINT}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = _parse_text(value.strip())
    else:
        raise ValueError(f"invalid duration {value!r}: {HINT}")
    if not math.isfinite(seconds) or seconds < 0 or seconds > MAX_SECONDS:
        raise ValueError(f"invalid duration {value!r}: out of range, must be between 0 and 100y")
    return seconds


def _parse_text(text: str) -> float:
    if _NUMBER.fullmatch(text):
        return float(text)
    pos, total, last = 0, 0.0, -1
    for m in _PART.finditer(text):
        if m.start() != pos:
            break
        rank = _ORDER.index(m.group(2))
        if rank <= last:  # units largest first, each once (Prometheus' rule)
            raise ValueError(f"invalid duration {text!r}: units must go from largest to smallest, "
                             f"each once ({HINT})")
        last = rank
        total += float(m.group(1)) * UNITS[m.group(2)]
        pos = m.end()
    if not text or pos != len(text):
        raise ValueError(f"invalid duration {text!r}: {HINT}")
    return total


MIN_DURATION = 0.01      # 10 ms: below it a poll loop only burns CPU
MAX_DURATION = 86400.0   # a day: .inf would freeze values while sources look up


def check_interval(value: float) -> float:
    """An interval setting (config, flags): finite, from MIN_DURATION to MAX_DURATION."""
    if not math.isfinite(value) or not MIN_DURATION <= value <= MAX_DURATION:
        raise ValueError(f"duration {value!r} out of range: use {MIN_DURATION:g}s to {MAX_DURATION:g}s")
    return value


Duration = Annotated[float, BeforeValidator(parse_duration), Field(gt=0), AfterValidator(check_interval)]
