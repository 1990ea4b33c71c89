"""AMD rocprof v1 ``results.csv``, rocprofv2 / Omniperf ``pmc_perf.csv``, rocprofv3 ``kernel_trace``
and ``counter_collection`` CSV.

Headers are matched case-insensitively by name (columns changed between ROCm releases:
Stream_Id, LDS_Block_Size/Scratch_Size vs Private/Group_Segment_Size, ``Agent_Id`` as ``1`` or
``"Agent 1"``).  Derived per dispatch, with rocprofiler-sdk's counter definitions:

- ``L2CacheHit`` (%) = TCC_HIT / (TCC_HIT + TCC_MISS) on CDNA, GL2C_* on RDNA, where the file
  does not carry it (it is not defined for gfx94x);
- ``FETCH_SIZE`` / ``WRITE_SIZE`` (KB) from TCC_EA0_* (gfx94x: non-32B reads weigh 128 B) or
  TCC_EA_* (gfx90a: 64 B); v1 ``FetchSize``/``WriteSize`` are the same quantities;
- ``dram_bytes_per_second`` = (FETCH_SIZE + WRITE_SIZE) x 1024 / duration, and its percent of
  ``hbm_bw`` when an Omniperf ``sysinfo.csv`` lies beside the file.

Launch delay: v1 ``BeginNs - DispatchNs`` (dispatch packet to start, the seed's enqueue-to-
execution latency); v3 kernel_trace joined on Correlation_Id with the ``hip_api_trace`` /
``hip_runtime_trace`` file of the same run (HTA definition).
"""

from __future__ import annotations

import csv
import io
import re
from collections import defaultdict
from pathlib import Path

from .model import (
    CompanionFile,
    KernelRecord,
    Profile,
    ProfileRejected,
    clean_kernel_name,
    parse_number,
    queue_length_max,
)
from .siblings import Siblings, is_sysinfo_for, trace_companions

_IDENTITY = {
    "index", "kernelname", "kernel_name", "gpu-id", "gpu_id", "queue-id", "queue_id", "queue-index", "pid",
    "tid", "grd", "wgr", "lds", "scr", "arch_vgpr", "accum_vgpr", "sgpr", "wave_size", "sig", "obj", "vgpr",
    "fbar", "dispatchns", "beginns", "endns", "completens", "durationns", "dispatch_id", "grid_size",
    "workgroup_size", "lds_per_workgroup", "scratch_per_workitem", "start_timestamp", "end_timestamp",
    "correlation_id", "process_id", "thread_id", "kernel_id", "agent_id", "stream_id", "kind",
    "lds_block_size", "scratch_size", "vgpr_count", "accum_vgpr_count", "sgpr_count", "counter_name",
    "counter_value", "private_segment_size", "group_segment_size", "guid",
}
_DUP_RE = re.compile(r"^(wave_size|correlation_id)_\d+$", re.I)


def sniff(head: str) -> str | None:
    """The rocprof variant of a CSV head, or None."""
    first = head.lstrip("\ufeff").splitlines()[0].lower().replace('"', "") if head.strip() else ""
    cols = set(first.split(","))
    if {"kernelname", "beginns"} <= cols or {"kernelname", "dispatchns"} <= cols:
        return "rocprof v1 results.csv"
    if {"counter_name", "counter_value"} <= cols:
        return "rocprofv3 counter_collection.csv"
    if "kind" in cols and "kernel_name" in cols and "start_timestamp" in cols:
        return "rocprofv3 kernel_trace.csv"
    if {"dispatch_id", "kernel_name"} <= cols:
        return "rocprofv2 / omniperf pmc_perf.csv"
    if {"domain", "function", "correlation_id"} <= cols:
        return "companion:rocprofv3 hip api trace (read with its kernel_trace.csv)"
    if {"kind", "direction", "source_agent_id"} <= cols:
        return "companion:rocprofv3 memory_copy_trace (not a kernel artifact)"
    if {"node_id", "agent_type"} <= cols:
        return "companion:rocprofv3 agent_info (device description only)"
    if {"workload_name", "gpu_arch", "hbm_bw"} <= cols:
        return "companion:omniperf sysinfo.csv (read with its pmc_perf.csv)"
    return None


def _rows(text: str) -> list[dict[str, str]]:
    reader = csv.reader(io.StringIO(text.lstrip("\ufeff")))
    try:
        header = [h.strip().lower() for h in next(reader)]
    except StopIteration:
        return []
    out = []
    for row in reader:
        if not row or not any(c.strip() for c in row):
            continue
        out.append({"__len__": str(len(row)), **{header[i]: row[i] for i in range(min(len(row), len(header)))}})
    out.insert(0, {"__header__": ",".join(header)})
    return out


def _agent(value: str) -> str:
    m = re.search(r"(\d+)\s*$", value or "")
    return m.group(1) if m else (value.strip() or "0")


def _companion(path: str, siblings: Siblings | None) -> str | None:
    """The trace file of the same run: ``<pid>_kernel_trace.csv`` -> ``<pid>_hip_api_trace.csv``."""
    if siblings is None:
        return None
    return next((c for c in trace_companions(Path(path).name) if siblings.exists(c)), None)


def parse(path: str, text: str, siblings: Siblings | None = None) -> Profile:
    """``siblings``: the files beside the artifact (hip_api_trace, Omniperf sysinfo.csv); none
    are read without it."""
    variant = sniff(text[:8192])
    if variant is None:
        raise ProfileRejected("rocprof csv: header matches no known rocprof variant")
    if variant.startswith("companion:"):
        raise CompanionFile(variant.removeprefix("companion:"))
    rows = _rows(text)
    header = rows[0]["__header__"].split(",")
    rows = rows[1:]
    ncols = len(header)
    bad = [r for r in rows if int(r["__len__"]) != ncols]
    rows = [r for r in rows if int(r["__len__"]) == ncols]
    prof = Profile(tool="rocprof", variant=variant, path=path)
    if bad:
        prof.warnings.append(f"{len(bad)} rows skipped: column count differs from the header (shifted columns)")
    if variant.startswith("rocprof v1"):
        _v1(prof, rows)
    elif variant.startswith("rocprofv3 counter"):
        _v3_counters(prof, rows)
    elif variant.startswith("rocprofv3 kernel"):
        _v3_trace(prof, rows, siblings)
    else:
        _v2(prof, rows)
    if not prof.kernels:
        raise ProfileRejected(f"{variant}: no dispatch rows")
    sysinfo = _sysinfo(path, variant, siblings)
    for k in prof.kernels:
        _derive(k, sysinfo)
    for d in prof.devices.values():
        if sysinfo.get("gpu_model"):
            d.model = sysinfo["gpu_model"]
    return prof


def _counters(row: dict[str, str]) -> dict[str, float]:
    out = {}
    for k, v in row.items():
        if k.startswith("__") or k in _IDENTITY or _DUP_RE.match(k):
            continue
        x = parse_number(v)
        if x is not None:
            out[k] = x
    return out


def _timed(prof: Profile, name: str, dev: str, start: float | None, end: float | None, **kw) -> KernelRecord:
    dur = end - start if start is not None and end is not None and end > start else None
    rec = KernelRecord(name=clean_kernel_name(name), device=dev, start_ns=start if dur else None,
                       duration_ns=dur, **kw)
    prof.device(dev, "amd")
    prof.kernels.append(rec)
    return rec


def _v1(prof: Profile, rows: list[dict[str, str]]) -> None:
    for r in rows:
        begin, end = parse_number(r.get("beginns")), parse_number(r.get("endns"))
        rec = _timed(prof, r.get("kernelname", ""), r.get("gpu-id", "0").strip() or "0", begin, end,
                     stream=r.get("queue-id", ""), counters=_counters(r))
        disp = parse_number(r.get("dispatchns"))
        if disp is not None and begin is not None:
            rec.launch_delay_ns = max(0.0, begin - disp)


def _v2(prof: Profile, rows: list[dict[str, str]]) -> None:
    for r in rows:
        _timed(prof, r.get("kernel_name", ""), r.get("gpu_id", "0").strip() or "0",
               parse_number(r.get("start_timestamp")), parse_number(r.get("end_timestamp")),
               stream=r.get("queue_id", ""), counters=_counters(r))


def _v3_counters(prof: Profile, rows: list[dict[str, str]]) -> None:
    by_dispatch: dict[tuple[str, str], KernelRecord] = {}
    for r in rows:
        key = (r.get("agent_id", ""), r.get("dispatch_id", "") or r.get("correlation_id", ""))
        rec = by_dispatch.get(key)
        if rec is None:
            rec = by_dispatch[key] = _timed(
                prof, r.get("kernel_name", ""), _agent(r.get("agent_id", "")),
                parse_number(r.get("start_timestamp")), parse_number(r.get("end_timestamp")),
                stream=r.get("queue_id", ""))
        v = parse_number(r.get("counter_value"))
        name = (r.get("counter_name") or "").strip().lower()
        if v is not None and name:
            rec.counters[name] = rec.counters.get(name, 0.0) + v  # per-dimension rows are summed


def _v3_trace(prof: Profile, rows: list[dict[str, str]], siblings: Siblings | None) -> None:
    api: dict[str, tuple[float, float]] = {}
    side = _companion(prof.path, siblings)
    if side is not None and siblings is not None:
        try:
            for r in _rows(siblings.read_text(side) or "")[1:]:
                s, e = parse_number(r.get("start_timestamp")), parse_number(r.get("end_timestamp"))
                if s is not None and e is not None and "launch" in (r.get("function") or "").lower():
                    api[(r.get("correlation_id") or "").strip()] = (s, e)
        except OSError as exc:
            prof.warnings.append(f"{side}: not read: {exc}")
    queues: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
    for r in rows:
        start, end = parse_number(r.get("start_timestamp")), parse_number(r.get("end_timestamp"))
        stream = (r.get("stream_id") or r.get("queue_id") or "").strip()
        rec = _timed(prof, r.get("kernel_name", ""), _agent(r.get("agent_id", "")), start, end, stream=stream)
        call = api.get((r.get("correlation_id") or "").strip())
        if call is not None and start is not None:
            rec.launch_delay_ns = max(0.0, start - call[1])
            queues[(rec.device, stream)] += [(call[0], 1), (start, -1)]
    if side is None:
        prof.warnings.append("no hip_api_trace/hip_runtime_trace beside the file: no launch delay")
    for (dev, _), ev in queues.items():
        prof.queue_length_max[dev] = max(prof.queue_length_max.get(dev, 0), queue_length_max(ev))


def _sysinfo(path: str, variant: str, siblings: Siblings | None) -> dict[str, str]:
    """Omniperf's ``sysinfo.csv`` of the same workload (same directory, same name prefix)."""
    if not variant.startswith("rocprofv2") or siblings is None:
        return {}
    name = Path(path).name
    for cand in siblings.names():
        if is_sysinfo_for(name, cand):
            try:
                rows = _rows(siblings.read_text(cand) or "")
            except OSError:
                return {}
            return rows[1] if len(rows) > 1 else {}
    return {}


def _first(c: dict[str, float], *names: str) -> float | None:
    for n in names:
        if n in c:
            return c[n]
    return None


def _derive(k: KernelRecord, sysinfo: dict[str, str]) -> None:
    c = {name.upper(): v for name, v in k.counters.items()}
    out = k.counters
    if "l2cachehit" not in out:
        hit = _first(c, "TCC_HIT_SUM", "TCC_HIT", "GL2C_HIT_SUM", "GL2C_HIT")
        miss = _first(c, "TCC_MISS_SUM", "TCC_MISS", "GL2C_MISS_SUM", "GL2C_MISS")
        if hit is not None and miss is not None and hit + miss > 0:
            out["l2cachehit"] = 100.0 * hit / (hit + miss)
    fetch = _first(c, "FETCH_SIZE", "FETCHSIZE")
    if fetch is None:
        for prefix, wide in (("TCC_EA0_", 128.0), ("TCC_EA_", 64.0)):
            rd, rd32 = _first(c, prefix + "RDREQ_SUM"), _first(c, prefix + "RDREQ_32B_SUM")
            if rd is not None and rd32 is not None:
                fetch = (rd32 * 32 + (rd - rd32) * wide) / 1024
                break
    write = _first(c, "WRITE_SIZE", "WRITESIZE")
    if write is None:
        for prefix in ("TCC_EA0_", "TCC_EA_"):
            wr, wr64 = _first(c, prefix + "WRREQ_SUM"), _first(c, prefix + "WRREQ_64B_SUM")
            if wr is not None and wr64 is not None:
                write = ((wr - wr64) * 32 + wr64 * 64) / 1024
                break
    if fetch is not None:
        out["fetch_size_kb"] = fetch
    if write is not None:
        out["write_size_kb"] = write
    if fetch is not None and write is not None and k.duration_ns:
        bps = (fetch + write) * 1024 / (k.duration_ns * 1e-9)
        out["dram_bytes_per_second"] = bps
        peak = parse_number(sysinfo.get("hbm_bw"))  # GB/s in Omniperf's sysinfo
        if peak:
            out["dram_bw_pct_of_peak"] = 100.0 * bps / 1e9 / peak
