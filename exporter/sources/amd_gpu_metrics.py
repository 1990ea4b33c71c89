"""Parser for the amdgpu ``gpu_metrics`` binary table (sysfs ``/sys/class/drm/cardN/device/gpu_metrics``).

Pure functions, no I/O: ``parse_gpu_metrics(bytes)`` decodes a table into its raw field values, and
``table_readings(table)`` turns a decoded table into ``(raw field name, value, labels)`` triples for
a source to emit.

Layouts are the kernel structs of ``drivers/gpu/drm/amd/include/kgd_pp_interface.h`` (little-endian,
natural C alignment), transcribed in ``../shared/fixtures/amd/gpu_metrics_struct_layouts.txt``; offsets
are computed here from the field order and checked against that file by the tests.

Rules the format imposes (see ``shared/reference/amd.md`` section 4):
- dispatch on ``(format_revision, content_revision)`` AND ``structure_size``: two incompatible
  ``gpu_metrics_v1_6`` structs exist (384 and 1664 bytes), told apart only by the size;
- the table must be complete: fewer bytes than ``structure_size`` is an error, extra trailing bytes
  (a capture that copied ``st_size`` = 4096 bytes) are ignored;
- an all-ones value (0xFFFF, 0xFFFFFFFF, ...) means "not supported": ``table_readings`` drops it;
- units differ between dGPU (format 1) and APU (format 2, 3) tables; fields whose unit differs get a
  distinct raw name (``_centi``: centi-degrees C or centi-percent, ``_mw``: milliwatts, ``_apu``: unit
  varies by ASIC, left unmapped) so the mapping YAML can scale each correctly.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .amd_gpu_metrics_layouts import (  # noqa: F401 - the layouts stay importable from here
    _PRIMS,
    HEADER,
    LAYOUTS,
    V1_0,
    V1_1,
    V1_2,
    V1_3,
    V1_4,
    V1_5,
    V1_6_NEW,
    V1_6_OLD,
    V1_7,
    V1_8,
    V2_0,
    V2_1,
    V2_2,
    V2_3,
    V2_4,
    V3_0,
    XCP_V1_0,
    XCP_V1_1,
    XCP_V1_2,
    Layout,
)

# ------------------------------------------------------------------------------------------------
# Decoding


class GpuMetricsError(ValueError):
    """The bytes are not a gpu_metrics table this parser knows (a counted parse_error, not a crash)."""


@dataclass(frozen=True)
class GpuMetricsTable:
    structure_size: int
    format_revision: int
    content_revision: int
    layout: Layout
    fields: dict[str, object]  # raw decoded values, all-ones sentinels included; arrays are lists

    @property
    def version(self) -> str:
        return f"{self.format_revision}.{self.content_revision}"


def parse_gpu_metrics(data: bytes) -> GpuMetricsTable:
    """Decode one table.  Raises ``GpuMetricsError`` for anything short, unknown or inconsistent."""
    layout, frev, crev = _layout_of(data)
    size = layout.size
    decoded = layout.decode(data)
    decoded.pop("common_header")
    return GpuMetricsTable(size, frev, crev, layout, decoded)


# ------------------------------------------------------------------------------------------------
# Readings: what a source emits from a decoded table.

PREFIX = "gpu_metrics."

# ASIC-independent throttler bits of indep_throttle_status (amdgpu_smu.h SMU_THROTTLER_*_BIT).
INDEP_THROTTLE_BITS: dict[int, str] = {
    0: "ppt0", 1: "ppt1", 2: "ppt2", 3: "ppt3", 4: "spl", 5: "fppt", 6: "sppt", 7: "sppt_apu",
    16: "tdc_gfx", 17: "tdc_soc", 18: "tdc_mem", 19: "tdc_vdd", 20: "tdc_cvip", 21: "edc_cpu",
    22: "edc_gfx", 23: "apcc",
    32: "temp_gpu", 33: "temp_core", 34: "temp_mem", 35: "temp_edge", 36: "temp_hotspot",
    37: "temp_soc", 38: "temp_vr_gfx", 39: "temp_vr_soc", 40: "temp_vr_mem0", 41: "temp_vr_mem1",
    42: "temp_liquid0", 43: "temp_liquid1", 44: "vrhot0", 45: "vrhot1", 46: "prochot_cpu",
    47: "prochot_gfx",
    56: "ppm", 57: "fit",
}
# The header groups the bits in 16-bit classes: power 0-15, current 16-31, temperature 32-47, other 48-63.
INDEP_THROTTLE_CLASSES = (("power", 0), ("current", 16), ("temperature", 32), ("other", 48))

# Index label name of array fields (default "index").
_ARRAY_LABEL = {
    "temperature_hbm": "hbm", "xgmi_read_data_acc": "link", "xgmi_write_data_acc": "link",
    "xgmi_link_status": "link", "current_gfxclk": "xcc", "temperature_core": "core",
    "average_core_power": "core", "current_coreclk": "core", "average_core_c0_activity": "core",
    "average_temperature_core": "core", "temperature_l3": "l3", "current_l3clk": "l3",
    "average_temperature_l3": "l3", "gfx_busy_inst": "xcc", "gfx_busy_acc": "xcc",
    "gfx_below_host_limit_acc": "xcc", "gfx_below_host_limit_ppt_acc": "xcc",
    "gfx_below_host_limit_thm_acc": "xcc", "gfx_low_utilization_acc": "xcc",
    "gfx_below_host_limit_total_acc": "xcc",
}
_SKIP = {"padding", "padding1"}


def raw_name(table: GpuMetricsTable, fname: str) -> str:
    """Raw field name for one table field; the suffix tells the unit where it differs from dGPU tables."""
    frev, crev = table.format_revision, table.content_revision
    if frev in (2, 3):  # APU tables
        if "temperature" in fname:
            return f"{PREFIX}{fname}_centi"  # centi-degrees C (8175 = 81.75 C)
        if fname == "average_socket_power" and frev == 2:
            return f"{PREFIX}{fname}_apu"  # W on some ASICs (Raphael v2.1), mW on others (v2.2 fixture)
        if fname.endswith("_power") or fname.endswith("power_limit"):
            return f"{PREFIX}{fname}_mw"
        if fname in ("average_gfx_activity", "average_mm_activity") and frev == 2:
            # v2.4 documents centi-percent; v2.0-2.3 differ by ASIC (plain percent in the v2.2 fixture)
            return f"{PREFIX}{fname}_centi" if crev >= 4 else f"{PREFIX}{fname}_apu"
    elif fname == "energy_accumulator" and crev <= 3:
        return f"{PREFIX}{fname}_unspecified"  # v1.0-1.3 state no unit; v1.4+ use 2^-16 J (15.259 uJ)
    return PREFIX + fname


def _all_ones(value: int, bits: int) -> bool:
    return value == (1 << bits) - 1


def _indep_throttle(name: str, value: int) -> list[tuple[str, float, tuple[tuple[str, str], ...]]]:
    out: list[tuple[str, float, tuple[tuple[str, str], ...]]] = []
    for bit, bit_name in INDEP_THROTTLE_BITS.items():
        out.append((f"{name}.{bit_name}", float((value >> bit) & 1), ()))
    for class_name, shift in INDEP_THROTTLE_CLASSES:
        out.append((f"{name}.class_{class_name}", float(((value >> shift) & 0xFFFF) != 0), ()))
    return out


def _emit_array(out: list, name: str, values: list[int], bits: int, label: str,
                extra: tuple[tuple[str, str], ...] = ()) -> None:
    for i, v in enumerate(values):
        if not _all_ones(v, bits):
            out.append((name, float(v), extra + ((label, str(i)),)))


Reading = tuple[str, float, tuple[tuple[str, str], ...]]


class _Plan:
    """Precompiled readings of one layout under one (format, content) revision.

    Built once per layout from the same rules as the generic walk (``raw_name``, all-ones
    sentinels, array index labels, xcp partitions, throttle bits); applied to the flat tuple of
    one ``Layout.packer.unpack_from`` with no per-field name or format work.
    """

    def __init__(self, layout: Layout, frev: int, crev: int, wanted: frozenset[str] | None = None):
        self.layout = layout
        self.steps: list[tuple] = []
        probe = GpuMetricsTable(layout.size, frev, crev, layout, {})
        index = {}
        i = 0
        for fname, ftype, count in layout.fields:
            index[fname] = i
            i += ftype.nvalues * count if isinstance(ftype, Layout) else count
        for fname, ftype, count in layout.fields:
            at = index[fname]
            if fname in _SKIP or fname == "common_header":
                continue
            if isinstance(ftype, Layout):  # xcp_stats: (kind, at, parts, stride, num_partition index, subs)
                np_at = index.get("num_partition")
                if np_at is None:
                    continue
                subs = []
                j = 0
                for sub, stype, scount in ftype.fields:
                    ones = (1 << (_PRIMS[stype][1] * 8)) - 1  # type: ignore[index]
                    label = _ARRAY_LABEL.get(sub, "instance")
                    sub_name = f"{PREFIX}xcp.{sub}"
                    if wanted is None or sub_name in wanted:
                        subs.append((j, scount, sub_name, ones, label))
                    j += scount
                if subs:
                    self.steps.append(("xcp", at, count, ftype.nvalues, np_at, tuple(subs)))
                continue
            ones = (1 << layout.bits(fname)) - 1
            name = raw_name(probe, fname)
            if fname == "indep_throttle_status":
                bits = tuple((bit, f"{name}.{bit_name}") for bit, bit_name in INDEP_THROTTLE_BITS.items()
                             if wanted is None or f"{name}.{bit_name}" in wanted)
                classes = tuple((f"{name}.class_{cls}", shift) for cls, shift in INDEP_THROTTLE_CLASSES
                                if wanted is None or f"{name}.class_{cls}" in wanted)
                if bits or classes:
                    self.steps.append(("indep", at, name, ones, bits, classes))
                continue
            if wanted is not None and name not in wanted:
                continue  # no mapping rule reads it: neither unpacked into a reading nor emitted
            if count > 1:
                label = _ARRAY_LABEL.get(fname, "instance")
                labels = tuple(((label, str(k)),) for k in range(count))
                self.steps.append(("array", at, count, name, ones, labels))
            else:
                self.steps.append(("scalar", at, name, ones))
        self.fields = frozenset(index)

    def apply(self, values: tuple) -> list[Reading]:
        out: list[Reading] = []
        append = out.append
        for step in self.steps:
            kind = step[0]
            if kind == "scalar":
                v = values[step[1]]
                if v != step[3]:
                    append((step[2], float(v), ()))
            elif kind == "array":
                _, at, count, name, ones, labels = step
                for k in range(count):
                    v = values[at + k]
                    if v != ones:
                        append((name, float(v), labels[k]))
            elif kind == "indep":
                _, at, name, ones, bits, classes = step
                v = values[at]
                if v == ones:
                    continue
                for bit, bit_name in bits:
                    append((bit_name, float((v >> bit) & 1), ()))
                for cls_name, shift in classes:
                    append((cls_name, float(((v >> shift) & 0xFFFF) != 0), ()))
            else:  # xcp
                _, at, parts, stride, np_at, subs = step
                num_partition = values[np_at]
                if num_partition == 0xFFFF:
                    continue
                for p in range(min(num_partition, parts)):
                    base = at + p * stride
                    xcp = ("xcp", str(p))
                    for j, scount, name, ones, label in subs:
                        for k in range(scount):
                            v = values[base + j + k]
                            if v != ones:
                                append((name, float(v), (xcp, (label, str(k)))))
        return out


_PLANS: dict[tuple, _Plan] = {}
_MAX_PLANS = 256  # layouts x revisions x a few field selections; a bound, not a working size


def _plan(layout: Layout, frev: int, crev: int, wanted: frozenset[str] | None = None) -> _Plan:
    key = (layout.size, frev, crev, wanted)
    plan = _PLANS.get(key)
    if plan is None or plan.layout is not layout:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[key] = _Plan(layout, frev, crev, wanted)
    return plan


_KNOWN_HEADERS: dict[bytes, tuple[Layout, int, int]] = {}  # the 4 header bytes of a known layout


def _layout_of(data: bytes) -> tuple[Layout, int, int]:
    known = _KNOWN_HEADERS.get(data[:4])
    if known is not None and len(data) >= known[0].size:
        return known
    if len(data) < HEADER.size:
        raise GpuMetricsError(f"gpu_metrics: {len(data)} bytes, shorter than the 4-byte header")
    size, frev, crev = _HEADER_STRUCT.unpack_from(data, 0)
    candidates = LAYOUTS.get((frev, crev))
    if candidates is None:
        raise GpuMetricsError(f"gpu_metrics: unknown format {frev}.{crev} (structure_size {size})")
    layout = next((lay for lay in candidates if lay.size == size), None)
    if layout is None:
        known = ", ".join(str(lay.size) for lay in candidates)
        raise GpuMetricsError(f"gpu_metrics v{frev}.{crev}: structure_size {size} is not a known layout ({known})")
    if len(data) < size:
        raise GpuMetricsError(f"gpu_metrics v{frev}.{crev}: truncated, {len(data)} of {size} bytes")
    _KNOWN_HEADERS[bytes(data[:4])] = (layout, frev, crev)  # bounded: one entry per known layout
    return layout, frev, crev


_HEADER_STRUCT = struct.Struct("<HBB")

def readings(data: bytes, wanted: frozenset[str] | None = None) -> list[Reading]:
    """``table_readings(parse_gpu_metrics(data))`` in one precompiled unpack, without the dict.

    ``wanted``: emit only these raw names (the fields a mapping file maps, or those a fast poll
    reads; None emits every field).  Raises
    ``GpuMetricsError`` exactly where ``parse_gpu_metrics`` does, whatever is selected.
    """
    layout, frev, crev = _layout_of(data)
    plan = _plan(layout, frev, crev, wanted)
    return plan.apply(layout.packer.unpack_from(data, 0))


def table_readings(table: GpuMetricsTable) -> list[Reading]:
    """``(raw name, value, labels)`` for every supported (not all-ones) field of a decoded table.

    Arrays carry their index as a label (``link``, ``xcc``, ``hbm``, ``core``, ...); per-partition
    ``xcp_stats`` entries are emitted as ``gpu_metrics.xcp.<field>`` with ``xcp`` and ``xcc`` labels
    for the first ``num_partition`` partitions.  ``indep_throttle_status`` becomes one 0/1 reading per
    defined bit (``gpu_metrics.indep_throttle_status.<bit name>``) plus one per 16-bit class
    (``...class_power|class_current|class_temperature|class_other``: 1 when any bit of it is set).
    """
    return _table_readings_walk(table)


def _table_readings_walk(table: GpuMetricsTable) -> list[Reading]:
    """The generic walk over decoded fields (the reference ``readings`` is tested against)."""
    out: list[tuple[str, float, tuple[tuple[str, str], ...]]] = []
    layout = table.layout
    num_partition = table.fields.get("num_partition")
    for fname, ftype, count in layout.fields:
        if fname in _SKIP or fname == "common_header":
            continue
        value = table.fields[fname]
        if isinstance(ftype, Layout):  # xcp_stats
            if not isinstance(num_partition, int) or _all_ones(num_partition, 16):
                continue
            for p, part in enumerate(value[: min(num_partition, count)]):  # type: ignore[index]
                for sub, stype, _ in ftype.fields:
                    bits = _PRIMS[stype][1] * 8  # type: ignore[index]
                    sub_label = _ARRAY_LABEL.get(sub, "instance")
                    _emit_array(out, f"{PREFIX}xcp.{sub}", part[sub], bits, sub_label, (("xcp", str(p)),))
            continue
        bits = layout.bits(fname)
        name = raw_name(table, fname)
        if count > 1:
            _emit_array(out, name, value, bits, _ARRAY_LABEL.get(fname, "instance"))  # type: ignore[arg-type]
            continue
        assert isinstance(value, int)
        if _all_ones(value, bits):
            continue
        if fname == "indep_throttle_status":
            out.extend(_indep_throttle(name, value))
            continue
        out.append((name, float(value), ()))
    return out
