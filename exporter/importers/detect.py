"""Recognise a profiler artifact by its content, parse it, and attach its trace id.

``import_at`` (a name in a held directory: the drop directory) and ``import_file`` (a path: the
CLI) never raise anything but ``ProfileRejected`` (or its ``CompanionFile`` subclass): a parser
bug on a hostile file becomes a rejection with the exception named, so the drop directory and
the CLI keep going.  Every file is read under the ``exporter.safefile`` rule; ``max_bytes``
bounds the content after decompression (a gzip member cannot inflate past it).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path

from .. import safefile
from . import kineto_json, ncu_csv, nsys_sqlite, rocprof_csv, unitrace_csv
from .model import CompanionFile, Profile, ProfileRejected
from .siblings import Siblings

MAX_BYTES = 512 * 1024 * 1024  # per file, after decompression
MAX_SIDECAR_BYTES = 64 * 1024  # a <file>.meta.json holds a trace id, not data
SIDECAR = ".meta.json"
SQLITE_MAGIC = b"SQLite format 3\x00"
_TRACE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")
_RANGE_TRACE_RE = re.compile(r"trace[_ -]?id\s*[=:]\s*([A-Za-z0-9][A-Za-z0-9._:-]{0,63})", re.I)
_NAME_TRACE_RE = re.compile(r"(?:trace_id=|traceid-)([A-Za-z0-9][A-Za-z0-9:-]{0,63})")


def valid_trace_id(value: str) -> bool:
    return bool(_TRACE_ID_RE.match(value))


def import_file(path: str | os.PathLike, trace_id: str | None = None, max_bytes: int = MAX_BYTES) -> Profile:
    """Parse one artifact named by the caller (the CLI: a symlink the user typed is resolved).
    Raises ProfileRejected (or CompanionFile) with a precise reason."""
    real = Path(os.path.realpath(path))
    try:
        dir_fd = safefile.open_dir(real.parent)
    except OSError as exc:
        raise ProfileRejected(f"unreadable: {type(exc).__name__}: {exc}") from None
    try:
        return import_at(dir_fd, real.name, trace_id=trace_id, max_bytes=max_bytes, path=str(path))
    finally:
        os.close(dir_fd)


def import_at(dir_fd: int, name: str, *, trace_id: str | None = None, max_bytes: int = MAX_BYTES,
              path: str | None = None, single_link: bool = False,
              cancel: Callable[[], bool] | None = None) -> Profile:
    """Parse ``name`` in the directory ``dir_fd`` under the ``safefile`` rule: opened without
    following a symlink, a regular file (with one link when ``single_link``), read through the
    opened fd with ``max_bytes`` as a hard limit (after decompression too), never by path again;
    its companions and sidecar are read the same way.  ``path`` names it in the profile and in
    messages; ``cancel`` stops a long SQLite import (the daemon is stopping)."""
    siblings = Siblings(dir_fd, max_bytes, single_link=single_link)
    shown = path or name
    try:
        prof = _import(dir_fd, name, shown, siblings, max_bytes, single_link, cancel)
    except ProfileRejected:
        raise
    except safefile.TooLarge as exc:
        raise ProfileRejected(f"{exc} (the import limit)") from None
    except safefile.Refused as exc:
        raise ProfileRejected(f"not read: {exc}") from None
    except (OSError, EOFError, zlib.error) as exc:
        raise ProfileRejected(f"unreadable: {type(exc).__name__}: {exc}") from None
    except RecursionError:
        raise ProfileRejected("too deeply nested") from None
    except MemoryError:
        raise ProfileRejected("too large to parse in memory") from None
    except Exception as exc:  # noqa: BLE001 - a parser must never take the importer down
        raise ProfileRejected(f"parser error: {type(exc).__name__}: {exc}") from None
    _attach_trace_id(prof, name, siblings, trace_id)
    return prof


def _import(dir_fd: int, name: str, shown: str, siblings: Siblings, max_bytes: int, single_link: bool,
            cancel: Callable[[], bool] | None) -> Profile:
    fd, st = safefile.open_regular(name, dir_fd, single_link=single_link)
    try:
        if st.st_size == 0:
            raise ProfileRejected("empty file")
        if st.st_size > max_bytes:
            raise ProfileRejected(f"file is {st.st_size} bytes, above the import limit of {max_bytes}")
        gz = safefile.is_gzip(fd)
        parts = safefile.chunks(fd, max_bytes, gunzip=gz)
        first = next(parts, b"")
        if first.startswith(SQLITE_MAGIC):
            # SQLite reads its file by path: it gets a private copy (0700 temp dir), never the
            # producer's inode, so the bytes it reads are the ones counted against the limit
            with tempfile.TemporaryDirectory(prefix="ugx-import-") as tmp:
                copy = os.path.join(tmp, "export.sqlite")
                with open(copy, "wb") as out:
                    out.write(first)
                    for c in parts:
                        out.write(c)
                return nsys_sqlite.parse(shown, copy, cancel=cancel)
        raw = bytearray(first)
        for c in parts:
            raw += c
    finally:
        os.close(fd)
    if not raw:
        raise ProfileRejected("empty file")
    if not gz and raw.startswith(b"SQLite format"):
        raise ProfileRejected("SQLite header damaged")
    return _from_bytes(shown, raw, siblings)


def _from_bytes(path: str, raw: bytes | bytearray, siblings: Siblings) -> Profile:
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
        return rocprof_csv.parse(path, text, siblings)
    first = stripped.splitlines()[0][:80] if stripped else ""
    raise ProfileRejected(f"unrecognised format (first line {first!r}): not ncu/rocprof/unitrace CSV, "
                          "nsys SQLite or Kineto JSON")


def _attach_trace_id(prof: Profile, name: str, siblings: Siblings, explicit: str | None) -> None:
    if explicit:
        if not valid_trace_id(explicit):
            raise ProfileRejected(f"invalid trace id {explicit!r}: use 1-64 of [A-Za-z0-9._:-]")
        prof.trace_id, prof.trace_id_from = explicit, "explicit"
        return
    for side in dict.fromkeys((name + SIDECAR, name.split(".")[0] + SIDECAR)):
        if side == name:
            continue
        try:
            data = siblings.read(side, limit=MAX_SIDECAR_BYTES)
            if data is None:
                continue
            tid = str(json.loads(data).get("trace_id", ""))
        except (OSError, ValueError, AttributeError, RecursionError) as exc:
            prof.warnings.append(f"{side}: unreadable sidecar ({exc})")
            continue
        if valid_trace_id(tid):
            prof.trace_id, prof.trace_id_from = tid, "sidecar"
            return
    for r in prof.ranges:
        m = _RANGE_TRACE_RE.search(r.name)
        if m:
            prof.trace_id, prof.trace_id_from = m.group(1), "range"
            return
    m = _NAME_TRACE_RE.search(name)
    if m:
        prof.trace_id, prof.trace_id_from = m.group(1), "filename"


__all__ = ["CompanionFile", "ProfileRejected", "import_at", "import_file", "valid_trace_id"]
