"""Nsight Compute CSV: ``ncu --csv`` with ``--page details`` (long) or ``--page raw`` (wide).

Columns are found by header name (old and new headers differ, ``--nvtx`` adds columns); the
non-CSV preamble (``==PROF==`` lines, application output) is skipped; values may carry
thousands separators and ``n/a``; units are normalised (Mbyte -> byte, us -> ns, Ghz -> hz).
Details-page rows carry display labels ("L2 Hit Rate"); known labels are translated to metric
ids, metric ids (``--metrics`` / ``--print-metric-name name``) are kept as they are.
"""

from __future__ import annotations

import csv
import io
import re

from .model import KernelRecord, Profile, ProfileRejected, clean_kernel_name, normalize_unit, parse_number

# details label -> metric id (Volta+ names; NVIDIA's section files).  "Memory Throughput" is a
# percent in SpeedOfLight and a rate in MemoryWorkloadAnalysis: the unit decides.
LABELS: dict[str, str] = {
    "duration": "gpu__time_duration.sum",
    "dram throughput": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sol fb": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "memory throughput%": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "memory throughputbyte/second": "dram__bytes.sum.per_second",
    "l2 hit rate": "lts__t_sector_hit_rate.pct",
    "l1/tex hit rate": "l1tex__t_sector_hit_rate.pct",
    "l1 hit rate": "l1tex__t_sector_hit_rate.pct",
    "achieved occupancy": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "theoretical occupancy": "sm__maximum_warps_per_active_cycle_pct",
    "compute (sm) throughput": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "l2 cache throughput": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "l1/tex cache throughput": "l1tex__throughput.avg.pct_of_peak_sustained_active",
    "dram frequency": "dram__cycles_elapsed.avg.per_second",
    "sm frequency": "smsp__cycles_elapsed.avg.per_second",
    "elapsed cycles": "sm__cycles_elapsed.max",
}

# warp stall reasons that wait on the memory system (L1TEX/LSU/MIO queues, scoreboards fed by
# memory, store drain, memory barriers, constant-cache misses)
MEMORY_STALLS = ("long_scoreboard", "short_scoreboard", "lg_throttle", "mio_throttle", "tex_throttle",
                 "drain", "membar", "imc_miss")
_STALL_RES = (
    re.compile(r"^smsp__average_warps_issue_stalled_(?P<r>[a-z_]+?)_per_issue_active\.ratio$"),
    re.compile(r"^smsp__warp_cycles_per_issue_stall_(?P<r>[a-z_]+)$"),
    re.compile(r"^smsp__average_warp_latency_issue_stalled_(?P<r>[a-z_]+?)(?:\.ratio|\.pct|\.sum)?$"),
)
_ID_COLUMNS = {"id", "process id", "process name", "host name", "kernel name", "kernel time", "context",
               "stream", "block size", "grid size", "device", "cc", "section name", "metric name",
               "metric unit", "metric value", "rule name", "rule type", "rule description",
               "estimated speedup type", "estimated speedup"}


def sniff(head: str) -> bool:
    return bool(re.search(r'^"?ID"?,"?Process ID"?,', head, re.M))


def memory_stall_percent(counters: dict[str, float]) -> float | None:
    """Memory-related stall reasons as a percent of all stall reasons (``selected`` is not a stall)."""
    by_reason: dict[str, float] = {}
    for pattern in _STALL_RES:
        for name, v in counters.items():
            m = pattern.match(name)
            if m and m.group("r") not in by_reason:
                by_reason[m.group("r")] = v
        if by_reason:
            break
    total = sum(v for r, v in by_reason.items() if r != "selected")
    if total <= 0:
        return None
    return 100.0 * sum(by_reason.get(r, 0.0) for r in MEMORY_STALLS) / total


def parse(path: str, text: str) -> Profile:
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if re.match(r'^"?ID"?,', line)), None)
    if start is None:
        raise ProfileRejected("ncu csv: no header line starting with \"ID\"")
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header = [h.strip() for h in rows[0]]
    col = {h.lower(): i for i, h in enumerate(header)}
    for need in ("id", "kernel name"):
        if need not in col:
            raise ProfileRejected(f"ncu csv: header has no {need!r} column")
    prof = Profile(tool="ncu", variant="", path=path)
    if "metric name" in col and "metric value" in col:
        prof.variant = "ncu csv --page details"
        _details(prof, rows[1:], col)
    else:
        prof.variant = "ncu csv --page raw"
        _raw(prof, rows[1:], header, col)
    if not prof.kernels:
        raise ProfileRejected(f"{prof.variant}: no kernel rows with metric values")
    for k in prof.kernels:
        dur = k.counters.get("gpu__time_duration.sum", k.counters.get("gpu__time_duration"))
        k.duration_ns = dur
        stall = memory_stall_percent(k.counters)
        if stall is not None:
            k.counters["derived__memory_stall_pct"] = stall
        if "lts__t_sector_hit_rate.pct" not in k.counters and "lts__request_total_sectors_hitrate_pct" in k.counters:
            k.counters["lts__t_sector_hit_rate.pct"] = k.counters["lts__request_total_sectors_hitrate_pct"]
    return prof


def _cell(row: list[str], col: dict[str, int], name: str) -> str:
    i = col.get(name)
    return row[i].strip() if i is not None and i < len(row) else ""


def _launch(prof: Profile, by_id: dict[str, KernelRecord], row: list[str], col: dict[str, int]) -> KernelRecord:
    lid = _cell(row, col, "id")
    rec = by_id.get(lid)
    if rec is None:
        dev = _cell(row, col, "device") or "0"
        info = prof.device(dev, "nvidia")
        cc = _cell(row, col, "cc")
        if cc and not info.model:
            info.model = f"compute capability {cc}"
        rec = by_id[lid] = KernelRecord(name=clean_kernel_name(_cell(row, col, "kernel name")), device=dev,
                                        stream=_cell(row, col, "stream"))
        prof.kernels.append(rec)
    return rec


def _details(prof: Profile, rows: list[list[str]], col: dict[str, int]) -> None:
    by_id: dict[str, KernelRecord] = {}
    need = max(col["metric value"], col["kernel name"], col["id"])
    skipped = 0
    for row in rows:
        if not row or not any(c.strip() for c in row):
            continue
        if len(row) <= need or not _cell(row, col, "id").isdigit():
            skipped += 1
            continue
        name = _cell(row, col, "metric name")
        if not name:
            continue  # a rule row (Rule Name/Type/Description)
        value = parse_number(_cell(row, col, "metric value"))
        if value is None:
            continue  # n/a, or text such as "PolicySpread"
        value, unit = normalize_unit(value, _cell(row, col, "metric unit"))
        rec = _launch(prof, by_id, row, col)
        if "__" in name:
            rec.counters[name] = value
            continue
        low = name.lower()
        metric = LABELS.get(low) or LABELS.get(low + unit.lower())
        rec.counters[metric or f"label:{name}"] = value
    if skipped:
        prof.warnings.append(f"{skipped} rows skipped: too few columns or a non-numeric ID (shifted columns)")


def _raw(prof: Profile, rows: list[list[str]], header: list[str], col: dict[str, int]) -> None:
    if not rows:
        return
    units = rows[0]
    data = rows[1:]
    if len(units) != len(header) or _cell(units, col, "id") != "":
        # no units row: the first row is data already
        data, units = rows, [""] * len(header)
    by_id: dict[str, KernelRecord] = {}
    skipped = 0
    for row in data:
        if not row or not any(c.strip() for c in row):
            continue
        if len(row) != len(header) or not _cell(row, col, "id").isdigit():
            skipped += 1
            continue
        rec = _launch(prof, by_id, row, col)
        for i, name in enumerate(header):
            if name.lower() in _ID_COLUMNS or name.startswith("device__attribute"):
                continue
            v = parse_number(row[i])
            if v is None:
                continue
            v, _ = normalize_unit(v, units[i] if i < len(units) else "")
            rec.counters[name] = v
    if skipped:
        prof.warnings.append(f"{skipped} rows skipped: column count differs from the header (shifted columns)")
