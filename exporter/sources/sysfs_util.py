"""Small, robust readers for sysfs/procfs attribute files.

Every function returns ``None`` instead of raising.  A file that does not exist is the normal way
the kernel says "not supported here" and is silent; every other failure is classified into one of
the error kinds of ``Sample.errors`` and counted in the optional ``errors`` counter (pass
``sample.errors`` directly).

    read_text(path, errors=None) -> str | None     stripped contents
    read_int(path, errors=None)  -> int | None     decimal, or hex with a 0x prefix
    read_float(path, errors=None) -> float | None
    read_kv(path, errors=None)   -> dict[str, str] ``KEY=value`` lines (uevent files)
    error_kind(exc) -> str                          the error kind of an OSError
"""

from __future__ import annotations

import errno
import os
from collections.abc import MutableMapping
from pathlib import Path

Errors = MutableMapping[str, int] | None

# errno -> error kind; anything else is a read_error
_ERRNO_KIND = {
    errno.ENODEV: "device_lost",
    errno.ENXIO: "device_lost",
    errno.ESHUTDOWN: "device_lost",
    errno.EOPNOTSUPP: "not_supported",
    errno.ENOTSUP: "not_supported",
    errno.ENODATA: "not_supported",
    errno.EINVAL: "not_supported",
    errno.ETIMEDOUT: "timeout",
    errno.EAGAIN: "timeout",
    errno.EBUSY: "timeout",
}

# a missing file (or a path through something that is not a directory) means "absent": silent
_ABSENT = (errno.ENOENT, errno.ENOTDIR)


def error_kind(exc: BaseException) -> str:
    """Classify an exception raised while reading a kernel attribute file."""
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, OSError) and exc.errno in _ERRNO_KIND:
        return _ERRNO_KIND[exc.errno]
    if isinstance(exc, (UnicodeDecodeError, ValueError)):
        return "malformed_value"
    return "read_error"


def _count(errors: Errors, kind: str) -> None:
    if errors is not None:
        errors[kind] = errors.get(kind, 0) + 1


def read_text(path: str | os.PathLike[str], errors: Errors = None) -> str | None:
    """Stripped text of a small attribute file, or None (absent: silent; other errors: counted)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(65536)
    except OSError as exc:
        if exc.errno not in _ABSENT:
            _count(errors, error_kind(exc))
        return None
    try:
        return data.decode("utf-8", "strict").strip()
    except UnicodeDecodeError:
        _count(errors, "malformed_value")
        return None


def parse_int(text: str) -> int | None:
    """A decimal integer, or a hex one with a 0x prefix; None when it is neither."""
    text = text.strip()
    try:
        if text[:2].lower() == "0x":
            return int(text, 16)
        return int(text, 10)
    except ValueError:
        return None


def read_int(path: str | os.PathLike[str], errors: Errors = None) -> int | None:
    """Integer value of an attribute file; a malformed value is counted as malformed_value."""
    text = read_text(path, errors)
    if text is None:
        return None
    value = parse_int(text)
    if value is None:
        _count(errors, "malformed_value")
    return value


def read_float(path: str | os.PathLike[str], errors: Errors = None) -> float | None:
    """Float value of an attribute file; a malformed value is counted as malformed_value."""
    text = read_text(path, errors)
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        _count(errors, "malformed_value")
        return None


def read_kv(path: str | os.PathLike[str], errors: Errors = None) -> dict[str, str]:
    """``KEY=value`` lines (a uevent file) as a dict; empty when absent or unreadable."""
    text = read_text(path, errors)
    out: dict[str, str] = {}
    if not text:
        return out
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def link_name(path: str | os.PathLike[str]) -> str | None:
    """Basename of a symlink's target (``device/driver`` -> ``i915``), or None."""
    try:
        return Path(os.readlink(path)).name
    except OSError:
        return None
