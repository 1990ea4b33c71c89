"""The counting process's wire format: one frame per message, and its answer checked field by field.

A frame is a 4-byte big-endian length and that many bytes of JSON.  A request (serving process ->
counter) is ``{"id", "now", "limits": [max_fds, max_seconds, check_period, verify_period],
"names"}``; the answer is ``{"id", "host_pids", "unreadable", "partial", "budget_hit", "errors",
"records", "names"}``, where each record is ``[pid, fd, driver, pdev, client_id, engine_ns,
cycles, total_cycles, capacity, maxfreq_hz, resident, malformed]``: numbers and short names
derived from DRM fdinfo, never a file's text (and ``comm`` of the pids found only with
``processes: series``).

The answer comes from the one process that can read every other process's ``/proc``: it is read
like any untrusted input, as the import worker's (``importers/answer.py``).  The frame is
bounded while it is read (``MAX_ANSWER_BYTES``), the JSON refuses NaN and infinities, every
count (records, engines, regions, error kinds, names), string (length and alphabet: a pid and
an fd are ASCII digits, a PCI address is one ``normalize_pdev`` leaves as it is) and number
(an integer in 0..2**64, a finite float) is checked, and the answer must carry the request's
id.  Anything else is a ``BadAnswer`` (``kind``: oversized, malformed, late, exited) and the
counter is restarted (``counter.py``).
"""

from __future__ import annotations

import json
import math
import re
import struct

from ..sources.fdinfo_parser import FdinfoRecord, normalize_pdev

MAX_REQUEST_BYTES = 4096
MAX_ANSWER_BYTES = 4 << 20
MAX_RECORDS = 8192  # DRM clients answered per poll (beyond: budget_hit, a partial count)
MAX_KEYS = 64  # engines or memory regions per record
MAX_NAMES = MAX_RECORDS
_HEADER = struct.Struct(">I")
_NAME = re.compile(r"[A-Za-z0-9_.:+-]{1,64}\Z")
_DIGITS = re.compile(r"[0-9]{1,10}\Z")
# the scanner's error kinds the counting process answers (source_errors_total{source="fdinfo"}):
# the debugfs client list not usable this poll (the blind re-verification ran), its malformed lines,
# a <pid>/stat that could not be read or parsed (fdinfo_activity: a real re-verification ran)
ERROR_KINDS = frozenset({"read_error", "clients_list_unavailable", "clients_list_malformed", "stat_unreadable",
                         "stat_malformed"})


class BadAnswer(Exception):
    """The counter's answer cannot be used: ``kind`` is oversized, malformed, late or exited."""

    def __init__(self, kind: str, why: str) -> None:
        super().__init__(why)
        self.kind = kind


def frame(doc: object) -> bytes:
    data = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
    return _HEADER.pack(len(data)) + data


def length(header: bytes, limit: int) -> int:
    """The length a frame header announces; BadAnswer("oversized") above ``limit``."""
    (n,) = _HEADER.unpack(header)
    if n > limit:
        raise BadAnswer("oversized", f"a frame of {n} bytes announced, above {limit}")
    return n


def _refuse(name: str) -> float:
    raise ValueError(f"{name} in the counter's answer")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("a non-finite number")
    return value


def _int(value: object) -> int:
    if type(value) is not int or not 0 <= value < 1 << 64:
        raise ValueError("an integer in 0..2**64 expected")
    return value


def _str(value: object, pattern: re.Pattern[str], empty: bool = False) -> str:
    if not isinstance(value, str) or not ((empty and value == "") or pattern.match(value)):
        raise ValueError(f"an unexpected string {str(value)[:40]!r}")
    return value


def _bool(value: object) -> bool:
    if type(value) is not bool:
        raise ValueError("a boolean expected")
    return value


def _ints(value: object) -> dict[str, int]:
    if not isinstance(value, dict) or len(value) > MAX_KEYS:
        raise ValueError("a bounded object of integers expected")
    return {_str(k, _NAME): _int(v) for k, v in value.items()}


def _freqs(value: object) -> dict[str, float]:
    if not isinstance(value, dict) or len(value) > MAX_KEYS:
        raise ValueError("a bounded object of numbers expected")
    out = {}
    for k, v in value.items():
        if type(v) not in (int, float) or not math.isfinite(v) or v < 0:
            raise ValueError("a finite non-negative number expected")
        out[_str(k, _NAME)] = float(v)
    return out


def _record(r: object) -> tuple[str, str, FdinfoRecord]:
    if not isinstance(r, list) or len(r) != 12:
        raise ValueError("a record of 12 fields expected")
    pid, fd, driver, pdev, cid = (_str(r[0], _DIGITS), _str(r[1], _DIGITS), _str(r[2], _NAME),
                                  _str(r[3], _NAME, empty=True), _str(r[4], _NAME, empty=True))
    if pdev and normalize_pdev(pdev) != pdev:
        raise ValueError(f"a PCI address {pdev[:40]!r} that is not normalised")
    rec = FdinfoRecord(driver=driver, pdev=pdev, client_id=cid, engine_ns=_ints(r[5]), cycles=_ints(r[6]),
                       total_cycles=_ints(r[7]), capacity=_ints(r[8]), maxfreq_hz=_freqs(r[9]),
                       memory={"resident": _ints(r[10])}, malformed=_int(r[11]))
    return pid, fd, rec


def encode_record(pid: str, fd: str, rec: FdinfoRecord) -> list:
    return [pid, fd, rec.driver, rec.pdev, rec.client_id, rec.engine_ns, rec.cycles, rec.total_cycles,
            rec.capacity, rec.maxfreq_hz, rec.resident(), rec.malformed]


class Answer:
    """One checked answer: what ``fdinfo_records.Scanner`` gives the source."""

    __slots__ = ("host_pids", "unreadable", "partial", "budget_hit", "errors", "records", "names")

    def __init__(self, doc: dict) -> None:
        self.host_pids = _bool(doc["host_pids"])
        self.unreadable = _int(doc["unreadable"])
        self.partial = _bool(doc["partial"])
        self.budget_hit = _bool(doc["budget_hit"])
        errors = doc["errors"]
        if not isinstance(errors, dict) or not set(errors) <= ERROR_KINDS:
            raise ValueError("error kinds the scan never counts")
        self.errors = {k: _int(v) for k, v in errors.items()}
        records = doc["records"]
        if not isinstance(records, list) or len(records) > MAX_RECORDS:
            raise ValueError(f"above {MAX_RECORDS} records, or not a list")
        self.records = [_record(r) for r in records]
        names = doc["names"]
        if not isinstance(names, dict) or len(names) > MAX_NAMES:
            raise ValueError("names: a bounded object expected")
        self.names = {_str(k, _DIGITS): v for k, v in names.items()}
        if not all(isinstance(v, str) and 0 < len(v) <= 64 and v.isprintable() for v in self.names.values()):
            raise ValueError("a process name that is not short printable text")


def decode(data: bytes, want_id: int) -> Answer:
    """The counter's answer to request ``want_id``, every field checked; BadAnswer("malformed")."""
    try:
        doc = json.loads(data, parse_constant=_refuse, parse_float=_finite)
        if not isinstance(doc, dict) or doc.get("id") != want_id or type(doc.get("id")) is not int:
            raise ValueError("not the answer to this request")
        if "error" in doc:  # the counter could not scan (it says why): a bad answer all the same
            raise ValueError(f"the counter failed: {str(doc['error'])[:200]}")
        return Answer(doc)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError, OverflowError) as exc:
        raise BadAnswer("malformed", f"the counter's answer is not valid ({type(exc).__name__}: "
                                     f"{str(exc)[:200]})") from None
