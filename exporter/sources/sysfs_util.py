"""Small, robust readers for sysfs/procfs attribute files.

Every function returns ``None`` instead of raising.  A file that does not exist is the normal way
the kernel says "not supported here" and is silent; every other failure is classified into one of
the error kinds of ``PollResult.errors`` and counted in the optional ``errors`` counter (pass
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


def device_driver(device_dir: str | os.PathLike[str]) -> str:
    """The driver bound to a device directory: its ``driver`` link, else (a capture without the
    link) its uevent's ``DRIVER=``, else "" (unknown)."""
    return link_name(Path(device_dir, "driver")) or read_kv(Path(device_dir, "uevent")).get("DRIVER", "")


# ------------------------------------------------------------------------------------------------
# Kept-open attribute files: one pread(2) per read instead of openat+fstat+lseek+read+close

# a kept descriptor that fails with one of these is closed and the path opened again once (the
# device went away and came back, the file was replaced, a descriptor was closed under us)
_REOPEN = frozenset({errno.ENODEV, errno.ENOENT, errno.ESTALE, errno.EBADF, errno.ENXIO})
_CHUNK = 65536
SYSFS_MAGIC_FSTYPE = "sysfs"


def _pread_all(fd: int) -> bytes:
    data = os.pread(fd, _CHUNK, 0)
    if len(data) < _CHUNK:
        return data
    parts = [data]
    while True:  # larger than one chunk: rare (binary attributes); read to EOF
        more = os.pread(fd, _CHUNK, sum(len(p) for p in parts))
        if not more:
            return b"".join(parts)
        parts.append(more)


class KeptFiles:
    """Attribute files kept open and re-read from offset 0 with ``os.pread``.

    sysfs regenerates an attribute's text on every read at offset 0, so a kept descriptor reads
    fresh values; a card that is unplugged makes its descriptors fail (ENODEV), and they are then
    closed and the path opened once more (ENOENT there is the usual "absent", counted by the
    caller like any other read).  At most ``budget`` descriptors are kept; paths beyond it are
    read the plain way.  Raises ``OSError`` like ``open``/``read`` would.  Not for files that are
    replaced by rename (a kept descriptor would read the old file): see ``on_sysfs``.
    """

    def __init__(self, budget: int):
        self.budget = budget
        self.fds: dict[str, int] = {}
        self.reopened = 0  # descriptors dropped and opened again (for tests and self-metrics)

    def read(self, path: str) -> bytes:
        fd = self.fds.get(path)
        if fd is not None:
            try:
                return _pread_all(fd)
            except OSError as exc:
                if exc.errno not in _REOPEN:
                    raise
                self.fds.pop(path, None)
                _close(fd)
                self.reopened += 1
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = _pread_all(fd)
        except BaseException:
            _close(fd)
            raise
        if len(self.fds) < self.budget:
            self.fds[path] = fd
        else:
            _close(fd)
        return data

    def drop_under(self, prefix: str) -> None:
        """Close every kept descriptor whose path starts with ``prefix`` (a card that went away)."""
        for path in [p for p in self.fds if p.startswith(prefix)]:
            _close(self.fds.pop(path))

    def close(self) -> None:
        fds, self.fds = self.fds, {}
        for fd in fds.values():
            _close(fd)


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def fd_budget(wanted: int, reserve: int = 1024) -> int:
    """How many descriptors may be kept open for ``wanted`` files: the soft RLIMIT_NOFILE is raised
    toward the hard one when needed (as the Go runtime does for node_exporter), ``reserve`` stays
    free for sockets, scrapes and other sources."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < wanted + reserve:
            target = wanted + reserve if hard == resource.RLIM_INFINITY else min(hard, wanted + reserve)
            if target > soft:
                try:
                    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                    soft = target
                except (OSError, ValueError):
                    pass
        if soft == resource.RLIM_INFINITY:
            return wanted
        return max(0, min(wanted, soft - reserve))
    except ImportError:  # not POSIX
        return 0


def on_sysfs(path: str | os.PathLike[str], mountinfo: str = "/proc/self/mountinfo") -> bool:
    """True when ``path`` lies on a sysfs mount (its attribute files are never replaced by rename)."""
    try:
        real = os.path.realpath(path)
        with open(mountinfo, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return False
    best, fstype = -1, ""
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5:
            continue
        mount = fields[4].replace("\\040", " ")
        if (real == mount or real.startswith(mount.rstrip("/") + "/")) and len(mount) > best:
            best, fstype = len(mount), (right.split() or [""])[0]
    return fstype == SYSFS_MAGIC_FSTYPE
