"""The parent's side of the import worker's protocol: the limits it is given (``ImportLimits``)
and its answer, every field checked before anything is built from it (``decode``).

The answer describes a hostile file and comes from a process that parsed it: it is read like
any other untrusted input.  JSON nesting, numbers (no NaN, no infinity, no integer too large
for a float), strings (bounded), counts (devices, readings, label sets, error kinds) and names
(the tool, each device's vendor, mapping and key as ``convert`` makes them, label names, and,
with ``allowed``, only the raw fields the mappings map) are all checked; anything else rejects
the file as ``crash``.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass

from ..model import Device, PollResult, Reading
from .convert import device_key, mapping_name
from .detect import MAX_BYTES, MAX_EVENTS
from .model import CompanionFile, Profile, ProfileRejected

MAX_TEXT = 4096
MAX_ERROR_KINDS = 64
MIN_MEMORY_BYTES = 64 << 20  # import_memory_bytes: below this a worker cannot even start Python and parse
TOOLS = frozenset({"kineto", "ncu", "nsys", "rocprof", "unitrace"})
VENDORS = frozenset({"nvidia", "amd", "intel"})
LABELS = frozenset({"trace_id", "kernel", "quantile", "le"})  # what ``convert`` gives a reading


@dataclass(frozen=True)
class ImportLimits:
    """What one artifact may cost (``collectors.profiles.options``)."""

    max_bytes: int = MAX_BYTES              # max_file_bytes: read, after decompression
    max_events: int = MAX_EVENTS            # max_events_per_import
    max_devices: int = 16                   # max_devices_per_import
    max_series: int = 20000                 # max_series_per_import
    memory_bytes: int = 768 << 20           # import_memory_bytes: the child's address space
    cpu_seconds: int = 60                   # import_cpu_seconds
    timeout: float = 120.0                  # import_timeout: wall clock

    @property
    def answer_bytes(self) -> int:
        return (1 << 20) + 1024 * self.max_series


@dataclass
class Imported:
    """One parsed artifact: its description (a ``Profile`` without kernels and ranges when it was
    parsed in a child), its devices and readings, and the ``import`` command's summary."""

    profile: Profile
    devices: list[Device]
    sample: PollResult
    summary: dict | None = None


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} in the import worker's answer")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999
        raise ValueError(f"{text[:40]} in the import worker's answer")
    return value


def decode(data: bytes, lim: ImportLimits, allowed: dict | None = None) -> Imported:
    """The child's answer, every field checked (it describes a hostile file)."""
    try:
        doc = json.loads(data, parse_constant=_no_constant, parse_float=_finite)
        return _build(doc, lim, allowed)
    except ProfileRejected:
        raise
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError, OverflowError) as exc:
        raise ProfileRejected(f"the import worker's answer is not valid ({type(exc).__name__}: "
                              f"{str(exc)[:200]})", "crash") from None


def _s(value: object, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise TypeError("a string expected")
    return value


def _list(value: object, limit: int, what: str) -> list:
    if not isinstance(value, list):
        raise TypeError(f"{what}: a list expected")
    if len(value) > limit:
        raise ProfileRejected(f"the import worker's answer has {len(value)} {what}, above the per-import "
                              "caps", "crash")
    return value


def _number(value: object) -> float:
    if type(value) not in (int, float):
        raise TypeError("a number expected")
    out = float(value)  # OverflowError for an integer beyond a float
    if not math.isfinite(out):
        raise ValueError("a non-finite number")
    return out


def _index(value: object, size: int) -> int:
    if type(value) is not int or not 0 <= value < size:
        raise IndexError("an index out of range")
    return value


def _device(d: dict, tool: str) -> Device:
    f = {k: _s(d[k], 512) for k in ("key", "vendor", "index", "mapping", "uuid", "model", "pci_bus_id")}
    if f["vendor"] not in VENDORS:
        raise ValueError(f"vendor {f['vendor'][:40]!r}")
    if f["mapping"] != mapping_name(tool, f["vendor"]):
        raise ValueError(f"mapping {f['mapping'][:60]!r} for a {tool} {f['vendor']} device")
    if f["key"] != device_key(tool, f["uuid"], f["pci_bus_id"], f["index"]):
        raise ValueError(f"device key {f['key'][:60]!r}")
    return Device(**f)


def _build(doc: dict, lim: ImportLimits, allowed: dict | None) -> Imported:
    if not doc["ok"]:
        kind = _s(doc.get("kind", ""), 32)
        reason = _s(doc["reason"])
        raise CompanionFile(reason) if doc.get("companion") is True else ProfileRejected(reason, kind)
    p = doc["profile"]
    wall = p["wall_zero_ns"]
    if wall is not None and type(wall) is not int:
        raise TypeError("wall_zero_ns")
    tool = _s(p["tool"], 32)
    if tool not in TOOLS:
        raise ValueError(f"tool {tool!r}")
    prof = Profile(tool=tool, variant=_s(p["variant"], 200), path=_s(p["path"]),
                   trace_id=_s(p["trace_id"], 64), trace_id_from=_s(p["trace_id_from"], 32), wall_zero_ns=wall,
                   warnings=[_s(w) for w in _list(p["warnings"], 1000, "warnings")[:50]])
    devices = [_device(d, tool) for d in _list(doc["devices"], lim.max_devices, "devices")]
    readings = _list(doc["readings"], lim.max_series, "readings")
    labels = []
    for ls in _list(doc["labels"], lim.max_series, "label sets"):
        pairs = tuple((_s(k, 128), _s(v, 1024)) for k, v in _list(ls, len(LABELS), "labels"))
        if any(k not in LABELS for k, _ in pairs):
            raise ValueError("a label name convert never gives")
        labels.append(pairs)
    sample = PollResult(devices=devices)
    for dev, field, value, li in readings:
        device = devices[_index(dev, len(devices))]
        name = _s(field, 256)
        fields = allowed.get(device.mapping) if allowed is not None else None
        if fields is not None and name not in fields:  # as convert filters: only what is mapped
            raise ValueError(f"field {name[:60]!r}: not one {device.mapping} maps")
        sample.readings.append(Reading(device.key, name, _number(value), labels[_index(li, len(labels))]))
    errors = doc["errors"]
    if not isinstance(errors, dict) or len(errors) > MAX_ERROR_KINDS:
        raise ValueError("errors")
    if any(type(v) is not int or not 0 <= v < 1 << 53 for v in errors.values()):
        raise ValueError("an error count")
    sample.errors = Counter({_s(k, 64): v for k, v in errors.items()})
    summ = doc["summary"]
    if summ is not None and not isinstance(summ, dict):
        raise TypeError("summary")
    return Imported(prof, devices, sample, summ)
