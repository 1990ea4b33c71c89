"""What every profiler parser returns: one ``Profile`` per artifact, tool-neutral.

Times are nanoseconds in the artifact's own clock; counters are in base units (bytes, ns, Hz,
bytes/second, percent) under the tool's own counter names.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, is_dataclass

from ..render.textformat import valid_utf8

DEFERRED = ("stopped", "environment", "killed")  # kinds that are no fault of the file: tried again


class ProfileRejected(Exception):
    """The file is not a supported profiler artifact; ``str(exc)`` is the precise reason.

    ``kind`` names a limit the file hit ("" for anything else): ``size`` (``max_file_bytes``),
    ``memory``, ``time``, ``events``, ``devices``, ``series``, ``output``, ``crash``; the profiles
    source counts each as ``profile_rejected_<kind>``.  Three kinds are no fault of the file
    (``deferred``): ``stopped`` (the exporter is stopping), ``environment`` (no worker could
    be started, no room for a private copy, ...) and ``killed`` (its worker was killed from
    outside, once per file): the file stays where it is, to be tried again, and is counted as
    ``profile_deferred_<kind>``."""

    def __init__(self, message: str, kind: str = "") -> None:
        super().__init__(message)
        self.kind = kind

    @property
    def deferred(self) -> bool:
        return self.kind in DEFERRED


class CompanionFile(ProfileRejected):
    """A file that only complements another artifact (rocprofv3 hip_api_trace, Omniperf sysinfo).

    Not an error: it is read when its main artifact is imported.
    """


@dataclass(slots=True)
class DeviceInfo:
    """A GPU as the artifact names it: ``index`` is the tool's device id."""

    index: str
    vendor: str  # nvidia | amd | intel
    model: str = ""
    uuid: str = ""
    pci_bus_id: str = ""


@dataclass(slots=True)
class KernelRecord:
    """One kernel execution (launch / dispatch), or one counter range."""

    name: str
    device: str
    duration_ns: float | None = None
    start_ns: float | None = None
    launch_delay_ns: float | None = None  # HTA: kernel.start - (api.start + api.dur), floored at 0
    stream: str = ""
    counters: dict[str, float] = field(default_factory=dict)
    counters_only: bool = False  # a counter range that duplicates a timed kernel record


@dataclass(slots=True)
class Range:
    """An NVTX / rocTX / user-annotation range: the logical steps used for timeline alignment."""

    name: str
    start_ns: float
    duration_ns: float


@dataclass
class Profile:
    tool: str          # ncu | nsys | rocprof | kineto | unitrace
    variant: str       # e.g. "ncu csv --page details", "nsys sqlite schema 3.24.14"
    path: str
    devices: dict[str, DeviceInfo] = field(default_factory=dict)
    kernels: list[KernelRecord] = field(default_factory=list)
    ranges: list[Range] = field(default_factory=list)
    queue_length_max: dict[str, int] = field(default_factory=dict)  # device -> max per-stream queue
    wall_zero_ns: int | None = None   # unix ns of the artifact's time 0, when the artifact says
    trace_id: str = ""
    trace_id_from: str = ""           # explicit | sidecar | range | filename
    warnings: list[str] = field(default_factory=list)

    def device(self, index: str, vendor: str) -> DeviceInfo:
        d = self.devices.get(index)
        if d is None:
            d = self.devices[index] = DeviceInfo(index=index, vendor=vendor)
        return d

    @property
    def t0_ns(self) -> float | None:
        """The artifact's common zero: the first kernel start or range start it contains."""
        starts = [k.start_ns for k in self.kernels if k.start_ns is not None]
        starts += [r.start_ns for r in self.ranges]
        return min(starts) if starts else None


# ------------------------------------------------------------------ shared parsing helpers
_THOUSANDS_RE = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d*)?$")
_NA = {"", "n/a", "na", "nan", "-", "none", "null", "inf", "-inf", "+inf"}


def parse_number(text: object) -> float | None:
    """'1,234.5' / '13,485' / '2.33' / '8.1097E+14' / '1.234,5' -> float; 'n/a' -> None."""
    if isinstance(text, bool):
        return float(text)
    if isinstance(text, int | float):
        v = float(text)
        return v if math.isfinite(v) else None
    if not isinstance(text, str):
        return None
    s = text.strip().strip('"').replace("\u202f", "").replace("\xa0", "").replace(" ", "")
    if s.lower() in _NA:
        return None
    if "," in s:
        if _THOUSANDS_RE.match(s):
            s = s.replace(",", "")
        elif "." in s and s.rfind(",") > s.rfind("."):   # 1.234,5 (European locale)
            s = s.replace(".", "").replace(",", ".")
        elif "." not in s and s.count(",") == 1:          # 2,5
            s = s.replace(",", ".")
        else:
            return None
    try:
        v = float(s)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


# unit -> (base unit, factor); ncu prints SI prefixes (Kbyte = 1000 byte)
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}
_TIME = {"ns": 1.0, "nsecond": 1.0, "nsec": 1.0, "us": 1e3, "usecond": 1e3, "usec": 1e3,
         "ms": 1e6, "msecond": 1e6, "msec": 1e6, "s": 1e9, "second": 1e9, "sec": 1e9}


def normalize_unit(value: float, unit: str) -> tuple[float, str]:
    """Scale ``value`` in ``unit`` to base units: byte, byte/second, ns, hz. Other units pass through."""
    u = unit.strip().strip('"')
    low = u.lower()
    if low in _TIME:
        return value * _TIME[low], "ns"
    m = re.fullmatch(r"([kmgtp]?)(byte|b)(?:/(s|second|sec))?", low)
    if m and not (m.group(2) == "b" and not m.group(1) and not m.group(3)):
        factor = _PREFIX[m.group(1)]
        return value * factor, "byte/second" if m.group(3) else "byte"
    m = re.fullmatch(r"([kmgt]?)hz", low)
    if m:
        return value * _PREFIX[m.group(1)], "hz"
    return value, u


_KERNEL_SUFFIX_RE = re.compile(r"\s*(\[clone \.kd\]|\(\.kd\)|\.kd)\s*$")


def clean_kernel_name(name: str) -> str:
    return _KERNEL_SUFFIX_RE.sub("", name.strip()) or "unknown"


def quantile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default, PromQL quantile_over_time)."""
    if not sorted_values:
        return math.nan
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def queue_length_max(events: list[tuple[float, int]]) -> int:
    """HTA queue length: +1 at each launch call, -1 at each kernel start, per stream; the maximum."""
    cur = best = 0
    # at equal times the kernel start (-1) is applied before a new launch (+1)
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
        cur += delta
        best = max(best, cur)
    return best


def clean_profile(prof: Profile) -> Profile:
    """Make every string of a parsed profile valid UTF-8 (e.g. a JSON ``"\\ud800"`` kernel name),
    so nothing imported can fail the exposition later."""
    seen: set[int] = set()

    def fix(obj: object) -> object:
        if isinstance(obj, str):
            return valid_utf8(obj)
        if id(obj) in seen:
            return obj
        seen.add(id(obj))
        if isinstance(obj, list):
            for i, v in enumerate(obj):
                obj[i] = fix(v)
        elif isinstance(obj, dict):
            for k in list(obj):
                v = fix(obj.pop(k))
                obj[fix(k)] = v
        elif is_dataclass(obj) and not isinstance(obj, type):
            for f in fields(obj):
                v = getattr(obj, f.name)
                nv = fix(v)
                if nv is not v:
                    setattr(obj, f.name, nv)
        return obj

    fix(prof)
    return prof
