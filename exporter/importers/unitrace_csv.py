"""Intel unitrace metric-query CSV (``unitrace -q``), possibly after the ``-d`` text tables.

Each kernel instance is a block: a ``Kernel,...`` header of ``NAME[unit]`` columns and one data
row.  Kernel names may contain commas, so rows are split from the right.
"""

from __future__ import annotations

import re

from .model import KernelRecord, Profile, ProfileRejected, clean_kernel_name, parse_number

_UNIT_RE = re.compile(r"^(?P<name>[^\[]+?)\s*(?:\[(?P<unit>[^\]]*)\])?$")


def sniff(head: str) -> bool:
    return bool(re.search(r"^Kernel,\s*(Device|GlobalInstanceId)", head, re.M)) or "=== Device Timing Summary ===" in head


def parse(path: str, text: str) -> Profile:
    prof = Profile(tool="unitrace", variant="unitrace metric query csv", path=path)
    header: list[str] | None = None
    skipped = 0
    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        if re.match(r"^Kernel,\s*(Device|GlobalInstanceId)", s):
            header = [h.strip() for h in s.rstrip(",").split(",")]
            continue
        if header is None or s.startswith(("=", "Total")):
            continue
        parts = s.rstrip(",").rsplit(",", len(header) - 1)
        if len(parts) != len(header):
            skipped += 1
            continue
        names = [(_UNIT_RE.match(h) or _UNIT_RE.match("x")).group("name") for h in header]
        row = dict(zip(names, (p.strip() for p in parts), strict=True))
        dev = row.get("Device", row.get("SubDeviceId", "0")) or "0"
        if parse_number(dev) is None:
            skipped += 1
            continue
        counters = {n: v for n, v in ((n, parse_number(row[n])) for n in names[1:]) if v is not None}
        dur = counters.get("GpuTime")
        rec = KernelRecord(name=clean_kernel_name(parts[0]), device=dev, duration_ns=dur,
                           start_ns=counters.get("QueryBeginTime"), counters=counters)
        rd, wr = counters.get("GPU_MEMORY_BYTE_READ"), counters.get("GPU_MEMORY_BYTE_WRITE")
        if rd is not None and wr is not None and dur:
            counters["dram_bytes_per_second"] = (rd + wr) / (dur * 1e-9)
        hit, miss = counters.get("L3_HIT"), counters.get("L3_MISS")
        if hit is not None and miss is not None and hit + miss > 0:
            counters["l3_hit_pct"] = 100.0 * hit / (hit + miss)
        prof.device(dev, "intel")
        prof.kernels.append(rec)
    if header is None:
        raise ProfileRejected("unitrace: no metric-query CSV block (Kernel,Device,... header); "
                              "capture with `unitrace -q` (device-timing tables alone are not imported)")
    if skipped:
        prof.warnings.append(f"{skipped} rows skipped: column count differs from the header (shifted columns)")
    if not prof.kernels:
        raise ProfileRejected("unitrace: metric header without data rows")
    return prof
