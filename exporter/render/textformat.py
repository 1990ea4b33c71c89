"""Text exposition (0.0.4) and OpenMetrics 1.0 writer with a per-series prefix cache.

Label sets hardly change between poll cycles, so the escaped ``name{label="value",...} `` prefix
of every series is built once and reused; a cycle then only formats numbers.  The output is
checked against prometheus-client's own writers (tests/test_textformat.py parses both and compares
every sample) and with ``promtool check metrics``.  prometheus-client stays the reference; this
exists because its generic writers escape every label of every sample on every call, which made
rendering the largest cost of the daemon (bench/: 25-40 us per series).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..model import Labels, Sample

MAX_CACHED = 500_000  # prefixes; cleared when exceeded (label churn, e.g. per-process series)


@dataclass(slots=True)
class Family:
    name: str            # family name: counters without _total, histograms without suffixes
    type: str            # gauge | counter | histogram
    help: str
    unit: str = ""
    samples: list[Sample] = field(default_factory=list)  # (name, labels, value); plain tuples do


_SURROGATE = re.compile("[\ud800-\udfff]")


class Counts:
    """Label values that were not valid UTF-8 and were repaired while rendering (self-metric)."""

    invalid_utf8 = 0


def valid_utf8(v: str) -> str:
    """``v`` unchanged when it encodes as UTF-8; else with each bad code point (a lone surrogate,
    e.g. from a JSON ``"\\ud800"`` escape) replaced by U+FFFD.  Counted in ``Counts``."""
    if v.isascii():
        return v
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        Counts.invalid_utf8 += 1
        return _SURROGATE.sub("\ufffd", v)
    return v


def _escape_value(v: str) -> str:
    v = valid_utf8(v)
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str, openmetrics: bool) -> str:
    text = valid_utf8(text).replace("\\", "\\\\").replace("\n", "\\n")
    return text.replace('"', '\\"') if openmetrics else text


def series_prefix(name: str, labels: Labels) -> str:
    """``name{label="value",...} `` with escaped values, labels sorted like prometheus-client
    sorts them (so the text is stable whatever the order)."""
    if labels:
        return name + "{" + ",".join(f'{k}="{_escape_value(v)}"' for k, v in sorted(labels)) + "} "
    return name + " "


def format_value(v: float) -> str:
    if v == math.inf:
        return "+Inf"
    if v == -math.inf:
        return "-Inf"
    if v != v:
        return "NaN"
    return repr(float(v))


class PrefixCache:
    """Escaped series prefixes, kept for the series of the last two generations only.

    ``rotate()`` (once per exposition) starts a generation: prefixes used since are kept, those
    of series gone for a whole generation are dropped, so label churn (new GPU identities every
    poll, per-process series) never accumulates."""

    def __init__(self) -> None:
        self._prefix: dict[tuple[str, Labels], str] = {}
        self._previous: dict[tuple[str, Labels], str] = {}

    def rotate(self) -> None:
        self._previous, self._prefix = self._prefix, {}

    def prefix(self, name: str, labels: Labels) -> str:
        key = (name, labels)
        p = self._prefix.get(key)
        if p is None:
            p = self._previous.get(key)
            if p is None:
                if len(self._prefix) >= MAX_CACHED:
                    self._prefix.clear()
                p = series_prefix(name, labels)
            self._prefix[key] = p
        return p

    def __len__(self) -> int:
        return len(self._prefix) + len(self._previous)


_HEADERS: dict[tuple[str, str, str, str, bool], str] = {}  # built once per family, like the prefixes
MAX_HEADERS = 10_000


def header(fam: Family, openmetrics: bool) -> str:
    """The ``# HELP`` / ``# TYPE`` (and OpenMetrics ``# UNIT``) lines of a family (cached: the
    families hardly change between expositions, and their help texts are long)."""
    key = (fam.name, fam.type, fam.help, fam.unit, openmetrics)
    text = _HEADERS.get(key)
    if text is None:
        if len(_HEADERS) >= MAX_HEADERS:
            _HEADERS.clear()
        text = _HEADERS[key] = _header(fam, openmetrics)
    return text


def _header(fam: Family, openmetrics: bool) -> str:
    if openmetrics:
        head = fam.name
        text = f"# HELP {head} {_escape_help(fam.help, True)}\n# TYPE {head} {fam.type}\n"
        return text + f"# UNIT {head} {fam.unit}\n" if fam.unit else text
    # the classic format names a counter family with its _total suffix
    head = fam.name + "_total" if fam.type == "counter" else fam.name
    return f"# HELP {head} {_escape_help(fam.help, False)}\n# TYPE {head} {fam.type}\n"


def body(fam: Family, cache: PrefixCache) -> str:
    """The sample lines of a family (the same in both formats)."""
    prefix = cache.prefix
    return "".join([prefix(name, labels) + format_value(value) + "\n" for name, labels, value in fam.samples])


def encode(text: str) -> bytes:
    # every piece went through valid_utf8 (label values, help); names are checked ASCII at load.
    # "replace" keeps one bad string from failing the whole exposition all the same
    return text.encode("utf-8", "replace")


def write(sections: list[tuple[Family, str]], openmetrics: bool) -> bytes:
    """The exposition of (family, its sample lines) in order: each family's header, then its
    lines (the same in both formats); OpenMetrics ends with ``# EOF``."""
    out = [header(fam, openmetrics) + lines for fam, lines in sections]
    if openmetrics:
        out.append("# EOF\n")
    return encode("".join(out))
