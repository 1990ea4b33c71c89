"""logfmt and JSON log formatting, node_exporter style (ts=... level=... msg=... key=value).

Every value is one line whatever it holds (issue 37): in logfmt, a value with a space, ``=``,
a quote, a backslash or any control character (C0, DEL, C1, the Unicode line and paragraph
separators) is quoted and those characters escaped (``\n``, ``\r``, ``\t``, ``\u001b``), as
go-kit's logfmt does for node_exporter; JSON escapes them itself.  A value longer than
``MAX_VALUE_CHARS`` (a traceback: ``MAX_EXC_CHARS``) is cut, with a marker that gives its length,
so that no peer (an upstream target's names, a dropped file's name) can write a megabyte line."""

from __future__ import annotations

import json
import logging
import re
import sys
import time

MAX_VALUE_CHARS = 2048
MAX_EXC_CHARS = 16384
_UNSAFE = re.compile(r'[\x00-\x20"=\\\x7f-\x9f\u2028\u2029]')
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", '"': '\\"', "\\": "\\\\", " ": " ", "=": "="}


def cut(value: str, limit: int = MAX_VALUE_CHARS) -> str:
    """``value``, cut at ``limit`` characters with a marker that says how long it was."""
    return value if len(value) <= limit else f"{value[:limit]}...(cut, {len(value)} characters)"


def _escape(m: re.Match) -> str:
    c = m.group()
    return _ESCAPES.get(c) or f"\\u{ord(c):04x}"


_STD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "taskName"}


def _fields(record: logging.LogRecord) -> dict[str, object]:
    out: dict[str, object] = {
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        + f".{int(record.msecs):03d}Z",
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    for k, v in record.__dict__.items():
        if k not in _STD and not k.startswith("_"):
            out[k] = cut(v) if isinstance(v, str) else v
    out["msg"] = cut(str(out["msg"]))
    if record.exc_info:
        out["exc"] = cut(logging.Formatter().formatException(record.exc_info), MAX_EXC_CHARS)
    return out


def _logfmt_value(v: object) -> str:
    s = cut(str(v), MAX_EXC_CHARS)
    if s == "" or _UNSAFE.search(s):
        return '"' + _UNSAFE.sub(_escape, s) + '"'
    return s


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={_logfmt_value(v)}" for k, v in _fields(record).items())


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record), default=str)


def setup_logging(level: str = "info", fmt: str = "logfmt") -> None:
    handler = logging.StreamHandler(sys.stderr)  # stdout is reserved for --once output
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.server").addFilter(_quiet_bad_requests)


def _quiet_bad_requests(record: logging.LogRecord) -> bool:
    """A malformed request is the client's problem: log it at debug, without a traceback, so
    no client can flood the log."""
    try:
        from aiohttp.http_exceptions import HttpProcessingError
    except ImportError:  # pragma: no cover
        return True
    exc = record.exc_info[1] if record.exc_info else None
    if isinstance(exc, HttpProcessingError):
        if not logging.getLogger("aiohttp.server").isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.exc_info, record.exc_text = None, None
    return True
