"""logfmt and JSON log formatting, node_exporter style (ts=... level=... msg=... key=value)."""

from __future__ import annotations

import json
import logging
import sys
import time

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
            out[k] = v
    if record.exc_info:
        out["exc"] = logging.Formatter().formatException(record.exc_info)
    return out


def _logfmt_value(v: object) -> str:
    s = str(v)
    if s == "" or any(c in s for c in ' ="\n\t'):
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
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
