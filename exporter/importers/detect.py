"""Recognise a profiler artifact by its content, parse it, and attach its trace id.

``import_at`` (a name in a held directory: the drop directory) and ``import_file`` (a path: the
CLI) never raise anything but ``ProfileRejected`` (or its ``CompanionFile`` subclass): a parser
bug on a hostile file becomes a rejection with the exception named, so the drop directory and
the CLI keep going.  Every file is read under the ``exporter.safefile`` rule; ``max_bytes``
bounds the content after decompression (a gzip member cannot inflate past it) and
``max_events`` the events (trace events, table rows, kernel records) read from it.

These parse in the calling process: the daemon and the ``import`` command run them in a child
with kernel-enforced limits (``isolate``), which passes the file it opened (``import_fd``).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from .. import safefile
from . import kineto_json, ncu_csv, nsys_sqlite, rocprof_csv, unitrace_csv
from .model import CompanionFile, Profile, ProfileRejected
from .siblings import Siblings, sidecar_names

MAX_BYTES = 512 * 1024 * 1024  # per file, after decompression
MAX_EVENTS = 1_000_000  # trace events, rows of one table or kernel records per file
MAX_SIDECAR_BYTES = 64 * 1024  # a <file>.meta.json holds a trace id, not data
T = TypeVar("T")
SQLITE_MAGIC = b"SQLite format 3\x00"
_TRACE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")
_RANGE_TRACE_RE = re.compile(r"trace[_ -]?id\s*[=:]\s*([A-Za-z0-9][A-Za-z0-9._:-]{0,63})", re.I)
_NAME_TRACE_RE = re.compile(r"(?:trace_id=|traceid-)([A-Za-z0-9][A-Za-z0-9:-]{0,63})")


def valid_trace_id(value: str) -> bool:
    return _TRACE_ID_RE.fullmatch(value) is not None  # "abc\n" is not one


def import_file(path: str | os.PathLike, trace_id: str | None = None, max_bytes: int = MAX_BYTES,
                max_events: int = MAX_EVENTS) -> Profile:
    """Parse one artifact named by the caller (the CLI: a symlink the user typed is resolved).
    Raises ProfileRejected (or CompanionFile) with a precise reason."""
    return in_folder(path, lambda dir_fd, name: import_at(dir_fd, name, trace_id=trace_id, max_bytes=max_bytes,
                                                          path=str(path), max_events=max_events))


def in_folder(path: str | os.PathLike, parse: Callable[[int, str], T]) -> T:
    """``parse(dir_fd, name)`` for a path the caller named (a symlink the user typed is
    resolved), its folder held open meanwhile; ProfileRejected when the folder is unreadable."""
    real = Path(os.path.realpath(path))
    try:
        dir_fd = safefile.open_dir(real.parent)
    except OSError as exc:
        raise ProfileRejected(f"unreadable: {type(exc).__name__}: {exc}") from None
    try:
        return parse(dir_fd, real.name)
    finally:
        os.close(dir_fd)


def import_at(dir_fd: int, name: str, *, trace_id: str | None = None, max_bytes: int = MAX_BYTES,
              path: str | None = None, single_link: bool = False,
              cancel: Callable[[], bool] | None = None, max_events: int = MAX_EVENTS) -> Profile:
    """Parse ``name`` in the directory ``dir_fd`` under the ``safefile`` rule: opened without
    following a symlink, a regular file (with one link when ``single_link``), read through the
    opened fd with ``max_bytes`` as a hard limit (after decompression too), never by path again;
    its companions and sidecar are read the same way.  ``path`` names it in the profile and in
    messages; ``cancel`` stops a long SQLite import (the daemon is stopping)."""
    try:
        fd, _ = safefile.open_regular(name, dir_fd, single_link=single_link)
    except OSError as exc:
        raise rejection(exc) from None
    try:
        return import_fd(fd, dir_fd, name, trace_id=trace_id, max_bytes=max_bytes, path=path,
                         single_link=single_link, cancel=cancel, max_events=max_events)
    finally:
        os.close(fd)


def import_fd(fd: int, dir_fd: int | None, name: str, *, trace_id: str | None = None,
              max_bytes: int = MAX_BYTES, path: str | None = None, single_link: bool = False,
              cancel: Callable[[], bool] | None = None, max_events: int = MAX_EVENTS,
              tmp_dir: str | None = None, sqlite: dict | None = None,
              opened: dict[str, int | str] | None = None) -> Profile:
    """``import_at`` of a file the caller opened (``fd``, read from offset 0; ``dir_fd``: its
    directory, for companions and the sidecar, or ``opened``: those the caller opened, see
    ``siblings``).  ``tmp_dir``: where the private copy of a SQLite file goes (default: a fresh
    temp dir; "": nowhere, SQLite content is refused); ``sqlite``: keyword limits for
    ``nsys_sqlite.parse``."""
    siblings = Siblings(dir_fd, max_bytes, single_link=single_link, opened=opened)
    shown = path or name
    try:
        prof = _import(fd, shown, siblings, max_bytes, cancel, max_events, tmp_dir, sqlite or {})
    except ProfileRejected:
        raise
    except Exception as exc:  # noqa: BLE001 - a parser must never take the importer down
        raise rejection(exc) from None
    _attach_trace_id(prof, name, siblings, trace_id)
    return prof


def rejection(exc: BaseException) -> ProfileRejected:
    """The rejection for an exception met while opening, reading or parsing a file."""
    if isinstance(exc, safefile.TooLarge):
        return ProfileRejected(f"{exc} (the import limit max_file_bytes)", "size")
    if isinstance(exc, safefile.Refused):
        return ProfileRejected(f"not read: {exc}")
    if isinstance(exc, (OSError, EOFError, zlib.error)):
        return ProfileRejected(f"unreadable: {type(exc).__name__}: {exc}")
    return parse_failure(exc)


def parse_failure(exc: BaseException) -> ProfileRejected:
    """The rejection for an exception of parsing or converting (not of reading) a file."""
    if isinstance(exc, RecursionError):
        return ProfileRejected("too deeply nested")
    if isinstance(exc, MemoryError):
        return ProfileRejected("too large to parse in memory (the import memory limit)", "memory")
    return ProfileRejected(f"parser error: {type(exc).__name__}: {exc}")


def check_size(st: os.stat_result, max_bytes: int) -> None:
    """ProfileRejected for an empty file or one above ``max_bytes`` before decompression."""
    if st.st_size == 0:
        raise ProfileRejected("empty file")
    if st.st_size > max_bytes:
        raise ProfileRejected(f"file is {st.st_size} bytes, above the import limit max_file_bytes "
                              f"({max_bytes})", "size")


SNIFF_BYTES = 1 << 20  # of a file's head (decompressed) the parent looks at before a worker starts


def sniff(fd: int, size: int) -> None:
    """A cheap look in the parent before a worker is started for the file (issue 37: every file,
    one byte of junk too, started a worker): at most ``SNIFF_BYTES`` of its head (inflated to
    the same bound).  Raises the rejection the worker would give (``unrecognised format``) when
    that head is the whole content and no parser recognises it; otherwise returns and the worker
    decides (a head too short to tell proves nothing)."""
    try:
        head = os.pread(fd, SNIFF_BYTES, 0)
        whole = len(head) == size
        if head.startswith(safefile.GZIP_MAGIC):
            d = zlib.decompressobj(31)
            raw = d.decompress(head, SNIFF_BYTES)
            whole = whole and d.eof and not d.unused_data and not d.unconsumed_tail
            head = raw
    except (OSError, zlib.error):
        return  # the worker reads it and says what is wrong
    if not whole or head.startswith(SQLITE_MAGIC) or head.startswith(b"SQLite format"):
        return
    text = head.decode("utf-8", errors="replace")
    stripped = text.lstrip("\ufeff \t\r\n")
    if stripped.startswith(("{", "[")) or ncu_csv.sniff(text[:65536]) or unitrace_csv.sniff(text) \
            or rocprof_csv.sniff(text[:65536]) is not None:
        return
    first = stripped.splitlines()[0][:80] if stripped else ""
    raise ProfileRejected(f"unrecognised format (first line {first!r}): not ncu/rocprof/unitrace CSV, "
                          "nsys SQLite or Kineto JSON")


def _import(fd: int, shown: str, siblings: Siblings, max_bytes: int, cancel: Callable[[], bool] | None,
            max_events: int, tmp_dir: str | None, sqlite: dict) -> Profile:
    check_size(os.fstat(fd), max_bytes)
    gz = safefile.is_gzip(fd)
    parts = safefile.chunks(fd, max_bytes, gunzip=gz)
    first = next(parts, b"")
    if first.startswith(SQLITE_MAGIC):
        if tmp_dir == "":  # the importer saw no SQLite header (a gzip member without content first)
            raise ProfileRejected("SQLite content after an empty gzip member: not an nsys export")
        # SQLite reads its file by path: it gets a private copy (0700 temp dir), never the
        # producer's inode, so the bytes it reads are the ones counted against the limit
        try:
            scratch = tempfile.TemporaryDirectory(prefix="ugx-import-", dir=tmp_dir)
        except OSError as exc:
            raise ProfileRejected(f"cannot make the private SQLite copy: {exc}", "environment") from None
        with scratch as tmp:
            copy = os.path.join(tmp, "export.sqlite")
            try:
                with open(copy, "wb") as out:
                    out.write(first)
                    for c in parts:
                        out.write(c)
            except OSError as exc:  # a full disk is no fault of the file: try it later
                if isinstance(exc, safefile.Refused):
                    raise
                raise ProfileRejected(f"cannot write the private SQLite copy: {exc}", "environment") from None
            del first
            return nsys_sqlite.parse(shown, copy, cancel=cancel, max_rows=max_events, **sqlite)
    raw = bytearray(first)
    del first
    for c in parts:
        raw += c
    if not raw:
        raise ProfileRejected("empty file")
    if not gz and raw.startswith(b"SQLite format"):
        raise ProfileRejected("SQLite header damaged")
    prof = _from_bytes(shown, raw, siblings, max_events)
    if len(prof.kernels) + len(prof.ranges) > max_events:
        raise ProfileRejected(f"{len(prof.kernels) + len(prof.ranges)} kernel records and ranges, above "
                              f"max_events_per_import ({max_events})", "events")
    return prof


def _from_bytes(path: str, raw: bytearray, siblings: Siblings, max_events: int) -> Profile:
    text = raw.decode("utf-8", errors="replace")
    raw.clear()  # the caller's buffer: no second copy of the file while it is parsed
    stripped = text.lstrip("\ufeff \t\r\n")
    if stripped.startswith(("{", "[")):
        del text
        try:
            data = json.loads(stripped)
        except ValueError as exc:
            raise ProfileRejected(f"json: {exc}") from None
        del stripped
        return kineto_json.parse(path, data, max_events)
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
    for side in dict.fromkeys(sidecar_names(name)):
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


__all__ = ["CompanionFile", "ProfileRejected", "import_at", "import_fd", "import_file", "valid_trace_id"]
