"""dcgm-exporter's event-valued fields, turned into readings a mapping file can map.

Two default fields of dcgm-exporter are not a value per series but an event or a set of flags:

- ``DCGM_FI_DEV_XID_ERRORS`` (DCGM 4.6 and later: ``DCGM_FI_DEV_XID_ERROR``) holds the code of the
  last XID the GPU reported, 0 before the first.  Each change to a new non-zero code, and a
  non-zero code at first sight, is one event: the reading ``<field>.count{xid="<code>"}`` is the
  number of events per code this source has seen (the canonical ``gpu_xid_errors_total{xid}``).
  The same code twice in a row cannot be told from no new XID (DCGM's value does not change).
- ``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS`` (``DCGM_FI_DEV_CLOCKS_EVENT_REASONS`` from DCGM 3.2) is
  NVML's ``nvmlClocksEventReason*`` bitmask: one reading ``<field>.<bit name>`` of 0 or 1 per bit,
  named as the NVML source names them (``gpu_throttle_active{reason}``).

A DCGM blank is no value (no reading); a value that is not a whole number in range becomes a NaN reading, which ``PollResult.add``
counts as ``malformed_value``.  State is per target and GPU identity, bounded.
"""

from __future__ import annotations

import math

XID_FIELDS = frozenset({"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR"})
REASON_FIELDS = frozenset({"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"})
FIELDS = XID_FIELDS | REASON_FIELDS
# nvml.h nvmlClocksEventReason* (the names of mappings/nvml.yaml's clocks_event_reasons.*)
REASON_BITS = (
    (0x1, "GpuIdle"), (0x2, "ApplicationsClocksSetting"), (0x4, "SwPowerCap"), (0x8, "HwSlowdown"),
    (0x10, "SyncBoost"), (0x20, "SwThermalSlowdown"), (0x40, "HwThermalSlowdown"),
    (0x80, "HwPowerBrakeSlowdown"), (0x100, "DisplayClockSetting"),
)
MAX_GPUS = 4096  # GPU identities remembered per source (targets come from the config)
MAX_CODES = 64  # distinct XID codes counted per GPU (NVIDIA documents about 150 in all)

_BLANK = 2.0 ** 63
Reading = tuple[str, str, float, tuple[tuple[str, str], ...]]  # (ref, field, value, labels)


class EventFields:
    """Expands the event-valued readings of one poll of one target (``expand``); keeps the last
    XID code and the counts per code of each GPU between polls."""

    def __init__(self) -> None:
        # (target, GPU ref, field) -> (last code, {code: events})
        self._xid: dict[tuple[str, str, str], tuple[int, dict[int, int]]] = {}

    def expand(self, target: str, readings: list[Reading]) -> list[Reading]:
        out: list[Reading] = []
        for reading in readings:
            ref, fld, value, _dims = reading
            if fld not in FIELDS:
                out.append(reading)
                continue
            if value == _BLANK:  # DCGM's INT64 blanks (2^63 - 16 .. 2^63 - 13) as a float: no value
                continue
            code = _whole(value)
            if code is None:
                out.append((ref, f"{fld}.count" if fld in XID_FIELDS else f"{fld}.{REASON_BITS[0][1]}",
                            math.nan, ()))
            elif fld in XID_FIELDS:
                out.extend(self._xids(target, ref, fld, code))
            else:
                out.extend((ref, f"{fld}.{name}", 1.0 if code & bit else 0.0, ()) for bit, name in REASON_BITS)
        return out

    def _xids(self, target: str, ref: str, fld: str, code: int) -> list[Reading]:
        key = (target, ref, fld)
        last, counts = self._xid.get(key, (0, {}))
        if code and code != last and (code in counts or len(counts) < MAX_CODES):
            counts[code] = counts.get(code, 0) + 1
        if key in self._xid or len(self._xid) < MAX_GPUS:
            self._xid[key] = (code, counts)
        return [(ref, f"{fld}.count", float(n), (("xid", str(c)),)) for c, n in sorted(counts.items())]


def _whole(value: float) -> int | None:
    """A bitmask or XID code: a whole number from 0 to 2^63 (DCGM's INT64), else None."""
    if not math.isfinite(value) or value < 0 or value >= 2.0 ** 63 or value != int(value):
        return None
    return int(value)
