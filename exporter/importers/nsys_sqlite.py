"""Nsight Systems SQLite export (``nsys export --type sqlite``).

Gated on ``META_DATA_EXPORT.EXPORT_SCHEMA_VERSION`` (major 3 supported; tested 3.24.14 and
3.25.0).  Tables are created lazily, so each one is optional except the kernel table.  Launch
delay and per-stream queue length follow Holistic Trace Analysis: the kernel joins its launch
call on (correlationId, process); delay = kernel.start - (api.start + api.dur) floored at 0;
queue length = +1 at each launch call, -1 at each kernel start, per stream.

The file is hostile until proven otherwise (a 4 KB export whose tables are views over an
infinite recursive CTE would grow memory or a temp file without end), so the database is a
private copy (``detect``) opened read-only and immutable, and:

- schema: a view, a trigger, a virtual table or a generated column is refused before any
  query (an nsys export has none), and an authorizer allows only reading tables, the
  ``table_info`` pragma, ``count()`` and no other function, recursive CTE or attached database;
- time: a progress handler aborts a query past ``time_limit`` seconds from the start of the
  import (or as soon as ``cancel()`` is true: the daemon is stopping);
- memory: page cache ``CACHE_KIB``, no mmap, temp storage in memory, so sorts count against
  SQLite's process-wide hard heap limit (``heap_limit``: the import runs in a child process of
  its own, ``isolate``), and a value, SQL text, column count and expression depth limit;
- rows: every table is read through its cursor (never fetched whole), at most ``max_rows`` rows
  each (the kernel table is counted before it is read); launch calls are read only for the
  kernels' correlation ids.
"""

from __future__ import annotations

import sqlite3
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator

from .model import KernelRecord, Profile, ProfileRejected, Range, clean_kernel_name, queue_length_max

SUPPORTED_MAJOR = 3
TESTED_MINOR = 25
TIME_LIMIT_S = 120.0
HEAP_LIMIT_BYTES = 1 << 30
MAX_ROWS = 1_000_000  # per table (max_events_per_import)
MAX_GPU_ROWS = 4096  # rows of a GPU table: a node has a few dozen GPUs at most
CACHE_KIB = 64 * 1024
_LIMITS = ((sqlite3.SQLITE_LIMIT_LENGTH, 16 << 20), (sqlite3.SQLITE_LIMIT_SQL_LENGTH, 100_000),
           (sqlite3.SQLITE_LIMIT_COLUMN, 500), (sqlite3.SQLITE_LIMIT_EXPR_DEPTH, 100),
           (sqlite3.SQLITE_LIMIT_COMPOUND_SELECT, 10), (sqlite3.SQLITE_LIMIT_ATTACHED, 0),
           (sqlite3.SQLITE_LIMIT_TRIGGER_DEPTH, 1), (sqlite3.SQLITE_LIMIT_FUNCTION_ARG, 8))
_PRAGMAS_ALLOWED = {"table_info", "table_xinfo"}


def _authorize(action: int, arg1: str | None, arg2: str | None, dbname: str | None, _src: str | None) -> int:
    if action in (sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ):
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() in _PRAGMAS_ALLOWED:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() == "count":  # the kernel table's size
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY  # functions, recursive CTEs, writes, ATTACH, other pragmas


def _tables(db: sqlite3.Connection) -> set[str]:
    return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    cols = set()
    for row in db.execute(f'PRAGMA table_xinfo("{table}")'):
        if row[6] in (2, 3):  # hidden: 2 = virtual generated, 3 = stored generated
            raise ProfileRejected(f"nsys sqlite: {table}.{row[1]} is a generated column: not an nsys export")
        cols.add(row[1])
    return cols


def _check_schema(db: sqlite3.Connection) -> None:
    """Refuse whatever would run code on a read: views, triggers, virtual tables."""
    for kind, name, sql in db.execute("SELECT type, name, sql FROM sqlite_master"):
        if kind in ("view", "trigger"):
            raise ProfileRejected(f"nsys sqlite: the file defines a {kind} ({name!r}): not an nsys export; "
                                  "views and triggers are never run")
        if kind == "table" and str(sql or "").lstrip().upper().startswith("CREATE VIRTUAL"):
            raise ProfileRejected(f"nsys sqlite: {name!r} is a virtual table: not an nsys export")


def _capped(rows: Iterable, limit: int, what: str) -> Iterator:
    """The rows of a cursor, one at a time; ProfileRejected past ``limit`` of them."""
    for n, row in enumerate(rows, 1):
        if n > limit:
            raise ProfileRejected(f"nsys sqlite: {what} has more than {limit} rows, above "
                                  "max_events_per_import", "events")
        yield row


def _open(db_path: str, cancel: Callable[[], bool] | None, time_limit: float,
          heap_limit: int) -> sqlite3.Connection:
    db = sqlite3.connect(f"file:{db_path}?mode=ro&immutable=1", uri=True)
    try:
        for pragma in (f"hard_heap_limit = {int(heap_limit)}", f"cache_size = -{CACHE_KIB}", "mmap_size = 0",
                       "temp_store = MEMORY", "trusted_schema = OFF", "query_only = ON"):
            db.execute(f"PRAGMA {pragma}")
        for limit, value in _LIMITS:
            db.setlimit(limit, value)
        _check_schema(db)
        deadline = time.monotonic() + time_limit

        def progress() -> int:
            return int(time.monotonic() > deadline or (cancel is not None and cancel()))
        db.set_progress_handler(progress, 1000)
        db.set_authorizer(_authorize)
    except BaseException:
        db.close()
        raise
    return db


def parse(path: str, db_path: str, cancel: Callable[[], bool] | None = None, *,
          time_limit: float | None = None, heap_limit: int | None = None, max_rows: int = MAX_ROWS) -> Profile:
    """``db_path``: a private copy of the artifact (never the producer's file)."""
    time_limit = TIME_LIMIT_S if time_limit is None else time_limit
    try:
        db = _open(db_path, cancel, time_limit, HEAP_LIMIT_BYTES if heap_limit is None else heap_limit)
    except sqlite3.Error as exc:
        raise ProfileRejected(f"nsys sqlite: cannot open: {exc}") from None
    try:
        return _parse(path, db, max_rows)
    except sqlite3.OperationalError as exc:
        if "interrupted" in str(exc):
            raise ProfileRejected(f"nsys sqlite: stopped after the time limit of {time_limit:g} s "
                                  "(or at shutdown)", "time") from None
        if "out of memory" in str(exc):
            raise ProfileRejected("nsys sqlite: out of memory (the import memory limit)", "memory") from None
        if "not authorized" in str(exc):
            raise ProfileRejected(f"nsys sqlite: refused ({exc}): the schema is not an nsys export") from None
        raise ProfileRejected(f"nsys sqlite: unreadable database ({type(exc).__name__}: {exc}); "
                              "truncated or corrupt file?") from None
    except sqlite3.Error as exc:
        raise ProfileRejected(f"nsys sqlite: unreadable database ({type(exc).__name__}: {exc}); "
                              "truncated or corrupt file?") from None
    finally:
        db.close()


def _parse(path: str, db: sqlite3.Connection, max_rows: int) -> Profile:
    tables = _tables(db)
    if "META_DATA_EXPORT" not in tables:
        if "StringTable" in tables:
            raise ProfileRejected("nvprof SQLite (StringTable, _id_ columns) is not an nsys export; "
                                  "not supported")
        if "rocpd_kernel_dispatch" in tables or any(t.startswith("rocpd_") for t in tables):
            raise ProfileRejected("rocpd SQLite (rocprofv3 default output) is not supported yet: "
                                  "convert it with `rocpd convert -f csv` and import the CSV files")
        raise ProfileRejected("SQLite file without META_DATA_EXPORT: not an nsys export")
    meta = dict(_capped(db.execute("SELECT name, value FROM META_DATA_EXPORT"), 10_000, "META_DATA_EXPORT"))
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
    strings = (dict(_capped(db.execute("SELECT id, value FROM StringIds"), max_rows, "StringIds"))
               if "StringIds" in tables else {})
    _devices(db, tables, prof)
    if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables:
        raise ProfileRejected(f"{prof.variant}: no CUPTI_ACTIVITY_KIND_KERNEL table (no kernels captured)")
    kcols = _columns(db, "CUPTI_ACTIVITY_KIND_KERNEL")
    name_col = next((c for c in ("shortName", "demangledName", "name") if c in kcols), None)
    pid_expr = "globalPid / 16777216 % 16777216" if "globalPid" in kcols else "-1"
    corr = "correlationId" if "correlationId" in kcols else "NULL"
    (count,) = db.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    if count > max_rows:
        raise ProfileRejected(f"{prof.variant}: {count} kernels, above max_events_per_import ({max_rows})",
                              "events")
    launches: dict[tuple[int, int], tuple[int, int]] = {}
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables and corr != "NULL":
        rcols = _columns(db, "CUPTI_ACTIVITY_KIND_RUNTIME")
        rpid = "globalTid / 16777216 % 16777216" if "globalTid" in rcols else "-1"
        for start, end, cid, pid in _capped(db.execute(  # only the kernels' launch calls
                f"SELECT start, end, correlationId, {rpid} FROM CUPTI_ACTIVITY_KIND_RUNTIME "
                "WHERE correlationId IN (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL)"),
                max_rows, "CUPTI_ACTIVITY_KIND_RUNTIME"):
            launches[(pid, cid)] = (start, end)
    rows = _capped(db.execute(
        f"SELECT start, end, deviceId, streamId, {corr}, {pid_expr}, {name_col or 'NULL'} "
        "FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start"), max_rows, "CUPTI_ACTIVITY_KIND_KERNEL")
    queues: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
    joined = 0
    names: dict[object, str] = {}  # one string per kernel name and device, not one per row
    texts: dict[object, str] = {}
    for start, end, dev, stream, cid, pid, name_id in rows:
        if start is None or end is None:
            continue
        name = names.get(name_id)
        if name is None:
            raw = strings.get(name_id, str(name_id)) if name_id is not None else "unknown"
            name = names[name_id] = clean_kernel_name(str(raw))
        device = texts.get(dev) or texts.setdefault(dev, str(dev))
        rec = KernelRecord(name=name, device=device, start_ns=float(start),
                           duration_ns=float(end - start) if end >= start else None,
                           stream=texts.get(("s", stream)) or texts.setdefault(("s", stream), str(stream)))
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
            for row in _capped(db.execute(f"SELECT {', '.join(want)} FROM TARGET_INFO_GPU"), MAX_GPU_ROWS,
                               "TARGET_INFO_GPU"):
                r = dict(zip(want, row, strict=True))
                d = prof.device(str(r["id"]), "nvidia")
                d.model = str(r.get("name") or "")
                d.pci_bus_id = str(r.get("busLocation") or "")
                uuid = str(r.get("uuid") or "")
                d.uuid = uuid if not uuid or uuid.upper().startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
    elif "TARGET_INFO_CUDA_GPU" in tables:  # nsys 2021.1.0 .. 2021.3.0
        cols = _columns(db, "TARGET_INFO_CUDA_GPU")
        if {"deviceId", "name"} <= cols:
            for dev, name in _capped(db.execute("SELECT deviceId, name FROM TARGET_INFO_CUDA_GPU"), MAX_GPU_ROWS,
                                     "TARGET_INFO_CUDA_GPU"):
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
