"""Recognise a profiler artifact by its content, parse it, and attach its trace id.

``import_file`` never raises anything but ``ProfileRejected`` (or its ``CompanionFile``
subclass): a parser bug on a hostile file becomes a rejection with the exception named, so the
drop directory and the CLI keep going.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from . import kineto_json, ncu_csv, nsys_sqlite, rocprof_csv, unitrace_csv
from .model import CompanionFile, Profile, ProfileRejected

MAX_BYTES = 512 * 1024 * 1024
SQLITE_MAGIC = b"SQLite format 3\x00"
_TRACE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")
_RANGE_TRACE_RE = re.compile(r"trace[_ -]?id\s*[=:]\s*([A-Za-z0-9][A-Za-z0-9._:-]{0,63})", re.I)
_NAME_TRACE_RE = re.compile(r"(?:trace_id=|traceid-)([A-Za-z0-9][A-Za-z0-9:-]{0,63})")


def valid_trace_id(value: str) -> bool:
    return bool(_TRACE_ID_RE.match(value))


def import_file(path: str | os.PathLike, trace_id: str | None = None, max_bytes: int = MAX_BYTES) -> Profile:
    """Parse one artifact.  Raises ProfileRejected (or CompanionFile) with a precise reason."""
    p = Path(path)
    try:
        prof = _import(p, max_bytes)
    except ProfileRejected:
        raise
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise ProfileRejected(f"unreadable: {type(exc).__name__}: {exc}") from None
    except RecursionError:
        raise ProfileRejected("too deeply nested") from None
    except MemoryError:
        raise ProfileRejected("too large to parse in memory") from None
    except Exception as exc:  # noqa: BLE001 - a parser must never take the importer down
        raise ProfileRejected(f"parser error: {type(exc).__name__}: {exc}") from None
    _attach_trace_id(prof, p, trace_id)
    return prof


def _import(p: Path, max_bytes: int) -> Profile:
    size = p.stat().st_size
    if size == 0:
        raise ProfileRejected("empty file")
    if size > max_bytes:
        raise ProfileRejected(f"file is {size} bytes, above the import limit of {max_bytes}")
    with open(p, "rb") as f:
        head = f.read(16)
    if head[:2] == b"\x1f\x8b":
        with gzip.open(p, "rb") as g:
            inner = g.read(16)
        if inner.startswith(SQLITE_MAGIC):
            with tempfile.TemporaryDirectory(prefix="ugx-import-") as tmp:
                out = Path(tmp) / "export.sqlite"
                _gunzip(p, out, max_bytes * 8)
                return nsys_sqlite.parse(str(p), str(out))
        with gzip.open(p, "rb") as g:
            raw = g.read(max_bytes * 8 + 1)
        if len(raw) > max_bytes * 8:
            raise ProfileRejected("decompressed content above the import limit")
        return _from_bytes(str(p), raw)
    if head.startswith(SQLITE_MAGIC):
        return nsys_sqlite.parse(str(p), str(p))
    if head.startswith(b"SQLite format"):
        raise ProfileRejected("SQLite header damaged")
    return _from_bytes(str(p), p.read_bytes())


def _gunzip(src: Path, dst: Path, limit: int) -> None:
    written = 0
    with gzip.open(src, "rb") as g, open(dst, "wb") as out:
        while chunk := g.read(1 << 20):
            written += len(chunk)
            if written > limit:
                raise ProfileRejected("decompressed content above the import limit")
            out.write(chunk)
    shutil.copystat(src, dst)


def _from_bytes(path: str, raw: bytes) -> Profile:
    if raw.startswith(SQLITE_MAGIC):
        raise ProfileRejected("compressed SQLite must be gzip of an nsys export")
    text = raw.decode("utf-8", errors="replace")
    stripped = text.lstrip("\ufeff \t\r\n")
    if stripped.startswith(("{", "[")):
        try:
            data = json.loads(stripped)
        except ValueError as exc:
            raise ProfileRejected(f"json: {exc}") from None
        return kineto_json.parse(path, data)
    head = text[:65536]
    if ncu_csv.sniff(head):
        return ncu_csv.parse(path, text)
    if unitrace_csv.sniff(text):
        return unitrace_csv.parse(path, text)
    if rocprof_csv.sniff(head) is not None:
        return rocprof_csv.parse(path, text)
    first = stripped.splitlines()[0][:80] if stripped else ""
    raise ProfileRejected(f"unrecognised format (first line {first!r}): not ncu/rocprof/unitrace CSV, "
                          "nsys SQLite or Kineto JSON")


def _attach_trace_id(prof: Profile, p: Path, explicit: str | None) -> None:
    if explicit:
        if not valid_trace_id(explicit):
            raise ProfileRejected(f"invalid trace id {explicit!r}: use 1-64 of [A-Za-z0-9._:-]")
        prof.trace_id, prof.trace_id_from = explicit, "explicit"
        return
    for side in (p.with_name(p.name + ".meta.json"), p.with_name(p.name.split(".")[0] + ".meta.json")):
        if side != p and side.is_file():
            try:
                tid = str(json.loads(side.read_text()).get("trace_id", ""))
            except (OSError, ValueError, AttributeError):
                prof.warnings.append(f"{side.name}: unreadable sidecar")
                continue
            if valid_trace_id(tid):
                prof.trace_id, prof.trace_id_from = tid, "sidecar"
                return
    for r in prof.ranges:
        m = _RANGE_TRACE_RE.search(r.name)
        if m:
            prof.trace_id, prof.trace_id_from = m.group(1), "range"
            return
    m = _NAME_TRACE_RE.search(p.name)
    if m:
        prof.trace_id, prof.trace_id_from = m.group(1), "filename"


__all__ = ["CompanionFile", "ProfileRejected", "import_file", "valid_trace_id"]
