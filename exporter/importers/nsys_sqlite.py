"""Nsight Systems SQLite export (``nsys export --type sqlite``).

Gated on ``META_DATA_EXPORT.EXPORT_SCHEMA_VERSION`` (major 3 supported; tested 3.24.14 and
3.25.0).  Tables are created lazily, so each one is optional except the kernel table.  Launch
delay and per-stream queue length follow Holistic Trace Analysis: the kernel joins its launch
call on (correlationId, process); delay = kernel.start - (api.start + api.dur) floored at 0;
queue length = +1 at each launch call, -1 at each kernel start, per stream.
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict

from .model import KernelRecord, Profile, ProfileRejected, Range, clean_kernel_name, queue_length_max

SUPPORTED_MAJOR = 3
TESTED_MINOR = 25


def _tables(db: sqlite3.Connection) -> set[str]:
    return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type IN ('table','view')")}


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in db.execute(f'PRAGMA table_info("{table}")')}


def parse(path: str, db_path: str) -> Profile:
    try:
        db = sqlite3.connect(f"file:{db_path}?mode=ro&immutable=1", uri=True)
    except sqlite3.Error as exc:
        raise ProfileRejected(f"nsys sqlite: cannot open: {exc}") from None
    try:
        return _parse(path, db)
    except sqlite3.Error as exc:
        raise ProfileRejected(f"nsys sqlite: unreadable database ({type(exc).__name__}: {exc}); "
                              "truncated or corrupt file?") from None
    finally:
        db.close()


def _parse(path: str, db: sqlite3.Connection) -> Profile:
    tables = _tables(db)
    if "META_DATA_EXPORT" not in tables:
        if "StringTable" in tables:
            raise ProfileRejected("nvprof SQLite (StringTable, _id_ columns) is not an nsys export; "
                                  "not supported")
        if "rocpd_kernel_dispatch" in tables or any(t.startswith("rocpd_") for t in tables):
            raise ProfileRejected("rocpd SQLite (rocprofv3 default output) is not supported yet: "
                                  "convert it with `rocpd convert -f csv` and import the CSV files")
        raise ProfileRejected("SQLite file without META_DATA_EXPORT: not an nsys export")
    meta = dict(db.execute("SELECT name, value FROM META_DATA_EXPORT").fetchall())
    version = str(meta.get("EXPORT_SCHEMA_VERSION", ""))
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        raise ProfileRejected(f"nsys sqlite: unreadable EXPORT_SCHEMA_VERSION {version!r}") from None
    if major != SUPPORTED_MAJOR:
        raise ProfileRejected(f"nsys sqlite schema {version}: only major version {SUPPORTED_MAJOR} "
                              "is supported (a major change breaks scripts, per NVIDIA)")
    prof = Profile(tool="nsys", variant=f"nsys sqlite schema {version}", path=path)
    if minor > TESTED_MINOR:
        prof.warnings.append(f"schema {version} is newer than the tested 3.{TESTED_MINOR}; "
                             "columns may have been renamed")
    strings = dict(db.execute("SELECT id, value FROM StringIds").fetchall()) if "StringIds" in tables else {}
    _devices(db, tables, prof)
    if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables:
        raise ProfileRejected(f"{prof.variant}: no CUPTI_ACTIVITY_KIND_KERNEL table (no kernels captured)")
    kcols = _columns(db, "CUPTI_ACTIVITY_KIND_KERNEL")
    name_col = next((c for c in ("shortName", "demangledName", "name") if c in kcols), None)
    pid_expr = "globalPid / 16777216 % 16777216" if "globalPid" in kcols else "-1"
    corr = "correlationId" if "correlationId" in kcols else "NULL"
    rows = db.execute(
        f"SELECT start, end, deviceId, streamId, {corr}, {pid_expr}, {name_col or 'NULL'} "
        "FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start").fetchall()
    launches: dict[tuple[int, int], tuple[int, int]] = {}
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        rcols = _columns(db, "CUPTI_ACTIVITY_KIND_RUNTIME")
        rpid = "globalTid / 16777216 % 16777216" if "globalTid" in rcols else "-1"
        for start, end, cid, pid in db.execute(
                f"SELECT start, end, correlationId, {rpid} FROM CUPTI_ACTIVITY_KIND_RUNTIME "
                "WHERE correlationId IS NOT NULL"):
            launches[(pid, cid)] = (start, end)
    queues: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
    joined = 0
    for start, end, dev, stream, cid, pid, name_id in rows:
        if start is None or end is None:
            continue
        name = strings.get(name_id, str(name_id)) if name_id is not None else "unknown"
        rec = KernelRecord(name=clean_kernel_name(str(name)), device=str(dev), start_ns=float(start),
                           duration_ns=float(end - start) if end >= start else None, stream=str(stream))
        api = launches.get((pid, cid)) if cid is not None else None
        if api is not None:
            joined += 1
            rec.launch_delay_ns = float(max(0, start - api[1]))
            q = queues[(rec.device, rec.stream)]
            q.append((float(api[0]), 1))
            q.append((float(start), -1))
        prof.device(rec.device, "nvidia")
        prof.kernels.append(rec)
    if not prof.kernels:
        raise ProfileRejected(f"{prof.variant}: the kernel table is empty")
    if joined < len(prof.kernels):
        prof.warnings.append(f"{len(prof.kernels) - joined} of {len(prof.kernels)} kernels have no launch "
                             "call in the capture (launched before it started): no launch delay for them")
    for (dev, _), events in queues.items():
        prof.queue_length_max[dev] = max(prof.queue_length_max.get(dev, 0), queue_length_max(events))
    _ranges(db, tables, strings, prof)
    if "TARGET_INFO_SESSION_START_TIME" in tables:
        row = db.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
        if row and row[0]:
            prof.wall_zero_ns = int(row[0])  # event times are relative to the session start
    return prof


def _devices(db: sqlite3.Connection, tables: set[str], prof: Profile) -> None:
    if "TARGET_INFO_GPU" in tables:
        cols = _columns(db, "TARGET_INFO_GPU")
        want = [c for c in ("id", "name", "busLocation", "uuid") if c in cols]
        if "id" in want:
            for row in db.execute(f"SELECT {', '.join(want)} FROM TARGET_INFO_GPU"):
                r = dict(zip(want, row, strict=True))
                d = prof.device(str(r["id"]), "nvidia")
                d.model = str(r.get("name") or "")
                d.pci_bus_id = str(r.get("busLocation") or "")
                uuid = str(r.get("uuid") or "")
                d.uuid = uuid if not uuid or uuid.upper().startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
    elif "TARGET_INFO_CUDA_GPU" in tables:  # nsys 2021.1.0 .. 2021.3.0
        cols = _columns(db, "TARGET_INFO_CUDA_GPU")
        if {"deviceId", "name"} <= cols:
            for dev, name in db.execute("SELECT deviceId, name FROM TARGET_INFO_CUDA_GPU"):
                prof.device(str(dev), "nvidia").model = str(name or "")


def _ranges(db: sqlite3.Connection, tables: set[str], strings: dict, prof: Profile) -> None:
    if "NVTX_EVENTS" not in tables:
        return
    cols = _columns(db, "NVTX_EVENTS")
    if not {"start", "end", "eventType"} <= cols:
        return
    text = "text" if "text" in cols else "NULL"
    text_id = "textId" if "textId" in cols else "NULL"
    for start, end, txt, tid in db.execute(
            f"SELECT start, end, {text}, {text_id} FROM NVTX_EVENTS "
            "WHERE eventType IN (59, 60) AND end IS NOT NULL ORDER BY start LIMIT 100000"):
        name = txt if txt is not None else strings.get(tid, "")
        prof.ranges.append(Range(str(name), float(start), float(end - start)))
