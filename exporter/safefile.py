"""Reading a file that another user can write (drop directory, sidecars, state directory, procfs).

One rule, written once:

- the file is opened relative to a directory fd the caller holds (``open_regular``), with
  ``O_NOFOLLOW`` (a symlink is refused, never followed), ``O_NONBLOCK`` (a FIFO or a file under
  a write lease answers at once instead of hanging the reader) and ``O_NOCTTY``;
- the opened fd is checked with ``fstat`` to be a regular file (optionally with one link: a hard
  link to a file the attacker cannot read is refused);
- it is read through that fd only, never by path again, with a hard byte limit that holds
  while the file grows under the reader and after gzip decompression (``chunks``/``read_fd``).

Every refusal is a ``Refused`` (an ``OSError``) whose message says why; ``TooLarge`` is the one
for a limit.  ``private_dir`` checks (or creates) a directory only the exporter's user can
write, with no ancestor another user could swap; a symlink on the way is followed only where
nobody else could repoint it (``resolve_trusted``).
"""

from __future__ import annotations

import errno
import io
import os
import ssl
import stat
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

CHUNK = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
GZIP_MAGIC = b"\x1f\x8b"


class Refused(OSError):
    """A file that is not read: a symlink, not a regular file, leased, too large, ..."""

    def __str__(self) -> str:
        return str(self.strerror)


class TooLarge(Refused):
    """More bytes than the limit (before or after decompression)."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


def open_dir(path: str | os.PathLike) -> int:
    """A directory fd (the caller's own configured path; raises OSError)."""
    return os.open(path, _DIR_FLAGS)


def open_regular(name: str, dir_fd: int | None, *, single_link: bool = False) -> tuple[int, os.stat_result]:
    """Open ``name`` in ``dir_fd`` for reading under the rule above; returns (fd, fstat).
    ``dir_fd`` None: ``name`` is a path whose directories the caller trusts (``read_small``)."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused(errno.ELOOP, "a symbolic link (never followed)") from None
        if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
            raise Refused(exc.errno, "another process holds a lease on it (still being written?)") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(errno.EINVAL, f"{_kind(st.st_mode)}, not a regular file")
        if single_link and st.st_nlink != 1:
            raise Refused(errno.EMLINK, f"a regular file with {st.st_nlink} links (a hard link is refused)")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


class _BoundedRaw(io.RawIOBase):
    """Reads an fd from offset 0 through ``pread``, refusing to deliver more than ``limit`` bytes."""

    def __init__(self, fd: int, limit: int) -> None:
        self._fd, self._limit, self._pos = fd, limit, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # noqa: ANN001 - a writable buffer
        want = len(b)
        if self._pos + want > self._limit + 1:
            want = self._limit + 1 - self._pos
        if want <= 0:
            raise TooLarge(errno.EFBIG, f"compressed content above the limit of {self._limit} bytes")
        data = os.pread(self._fd, want, self._pos)
        if self._pos + len(data) > self._limit:
            raise TooLarge(errno.EFBIG, f"compressed content above the limit of {self._limit} bytes")
        b[: len(data)] = data
        self._pos += len(data)
        return len(data)


def is_gzip(fd: int) -> bool:
    return os.pread(fd, 2, 0) == GZIP_MAGIC


def chunks(fd: int, limit: int, *, gunzip: bool = False) -> Iterator[bytes]:
    """The content of ``fd`` from offset 0 in chunks of at most 1 MiB; ``gunzip``: decompressed
    (every gzip member).  Raises TooLarge as soon as more than ``limit`` bytes (compressed or
    decompressed) would be delivered, whatever the file's size was when it was opened."""
    total = 0
    if not gunzip:
        while True:
            data = os.read(fd, min(CHUNK, limit + 1 - total))
            if not data:
                return
            total += len(data)
            if total > limit:
                raise TooLarge(errno.EFBIG, f"above the limit of {limit} bytes")
            yield data
    raw, pending, dec = _BoundedRaw(fd, limit), b"", None
    while True:
        data, pending = pending or raw.read(CHUNK), b""
        if not data:
            if dec is not None and not dec.eof:
                raise EOFError("compressed file ended before the end-of-stream marker")
            return
        while data:
            if dec is None or dec.eof:  # the next member; zero padding between members is allowed
                data = data.lstrip(b"\x00")
                if not data:
                    break
                dec = zlib.decompressobj(31)
            out = dec.decompress(data, CHUNK)
            total += len(out)
            if total > limit:
                raise TooLarge(errno.EFBIG, f"decompressed content above the limit of {limit} bytes")
            if out:
                yield out
            data = dec.unused_data if dec.eof else dec.unconsumed_tail


def read_fd(fd: int, limit: int, *, gunzip: bool = False) -> bytearray:
    buf = bytearray()
    for c in chunks(fd, limit, gunzip=gunzip):
        buf += c
    return buf


def read_at(dir_fd: int, name: str, limit: int, *, single_link: bool = False) -> bytearray:
    """The content of ``name`` in ``dir_fd`` (at most ``limit`` bytes, else TooLarge)."""
    fd, _ = open_regular(name, dir_fd, single_link=single_link)
    try:
        return read_fd(fd, limit)
    finally:
        os.close(fd)


def read_path(path: str | os.PathLike, limit: int) -> bytearray:
    """``read_at`` of a path's last component in its directory (the directory path is trusted)."""
    p = Path(path)
    dir_fd = open_dir(p.parent)
    try:
        return read_at(dir_fd, p.name, limit)
    finally:
        os.close(dir_fd)


def read_small(path: str, limit: int) -> bytes:
    """A small file at ``path`` (its directories the caller's, as ``read_path``'s; the last
    component under the rule above) in one ``read`` of ``limit + 1`` bytes: more is TooLarge.
    Only for files written whole before they are read: a procfs seq_file hands one read all it
    has up to the size asked, a regular file ends where a read comes back short.  An open, an
    ``fstat``, a read and a close (a quarter of ``read_path``'s cost): for reads made per
    process (``sources/fdinfo_activity``: ``<pid>/stat``)."""
    fd, _ = open_regular(path, None)
    try:
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise TooLarge(errno.EFBIG, f"above the limit of {limit} bytes")
    return data


def read_named(path: str | os.PathLike, limit: int) -> bytes:
    """A file the operator named in the configuration (a web config, a TLS file, a password or
    headers file), re-read at run time: the path is followed as written (a Kubernetes ConfigMap
    mounts each key as a symlink), but it is opened ``O_NONBLOCK`` and read only when ``fstat``
    says it is a regular file, at most ``limit`` bytes (``TooLarge`` past it): a FIFO or a
    device put in its place (``/dev/zero``) is refused at once instead of hanging the reader or
    filling its memory (issue 37)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(errno.EINVAL, f"{path}: {_kind(st.st_mode)}, not a regular file")
        return bytes(read_fd(fd, limit))
    finally:
        os.close(fd)


def load_pem_chain(ctx: ssl.SSLContext, cert: bytes, key: bytes | None) -> None:
    """``ctx.load_cert_chain`` of PEM bytes already read (``read_named``), through anonymous
    memory files (``memfd``), so that OpenSSL opens nothing by path."""
    fds = []
    try:
        paths = []
        for name, data in (("cert", cert), ("key", key)):
            if data is None:
                paths.append(None)
                continue
            fd = os.memfd_create(f"ugx-{name}", os.MFD_CLOEXEC)
            fds.append(fd)
            os.write(fd, data)
            paths.append(f"/proc/self/fd/{fd}")
        ctx.load_cert_chain(paths[0], paths[1])
    finally:
        for fd in fds:
            os.close(fd)


def owner_problem(st: os.stat_result, *, root_ok: bool = False, sticky_ok: bool = False) -> str:
    """Why a directory is one another user could redirect ("" when it is not): owned by someone
    other than the exporter's user (or root with ``root_ok``), or writable by group or others
    (unless sticky with ``sticky_ok``, like /tmp)."""
    euid = os.geteuid()
    if st.st_uid != euid and not (root_ok and st.st_uid == 0):
        return f"owned by uid {st.st_uid}, not by the exporter's uid {euid}" + (" or root" if root_ok else "")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (sticky_ok and st.st_mode & stat.S_ISVTX):
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return ""


def check_swappable(dirs: Iterable[Path]) -> None:
    """Each of ``dirs`` must be owned by root or the exporter's user and be writable by nobody
    else unless sticky (like /tmp): otherwise another user could swap what is inside for a
    symlink.  Raises Refused naming the culprit."""
    euid = os.geteuid()
    for d in dirs:
        st = os.lstat(d)
        if owner_problem(st, root_ok=True, sticky_ok=True):
            raise Refused(errno.EPERM, f"{d} must be owned by uid 0 or {euid} and writable by nobody else "
                                       f"unless sticky (owner {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}): "
                                       f"another user could swap what is inside")


def resolve_trusted(path: str | os.PathLike) -> Path:
    """The real path of ``path`` (absolute), following only symlinks nobody but root or the
    exporter's user could repoint: each one must sit in a directory only they can write (no
    sticky exception: a link planted in /tmp is someone else's) and be owned by one of them.
    systemd's ``DynamicUser=`` state directory (``/var/lib/x -> private/x``) and a symlinked
    ancestor such as ``/var -> /data/var`` pass; a link another user could swap raises Refused
    naming it.  A missing component ends the walk (the rest is returned as written)."""
    euid = os.geteuid()
    parts = list(Path(os.path.abspath(path)).parts[1:])
    cur, links = Path("/"), 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            cur = cur.parent
            continue
        nxt = cur / part
        try:
            st = os.lstat(nxt)
        except FileNotFoundError:
            return Path(nxt, *parts)
        if not stat.S_ISLNK(st.st_mode):
            cur = nxt
            continue
        links += 1
        if links > 40:
            raise Refused(errno.ELOOP, f"{path}: too many levels of symbolic links")
        holder = os.lstat(cur)  # ``cur`` is a real directory: every link before it was resolved
        problem = owner_problem(holder, root_ok=True)
        if problem or st.st_uid not in (0, euid):
            why = f"{cur} is {problem}" if problem else f"the link is owned by uid {st.st_uid}"
            raise Refused(errno.EPERM, f"{nxt} is a symlink another user could repoint ({why}): "
                                       "name the real directory, or make what holds the link writable "
                                       f"by uid 0 or {euid} only")
        target = Path(os.readlink(nxt))
        if target.is_absolute():
            cur = Path("/")
            parts = list(target.parts[1:]) + parts
        else:
            parts = list(target.parts) + parts
    return cur


def private_dir(path: str | os.PathLike | None, prefix: str) -> Path:
    """A fresh directory (mode 0700, unpredictable name) inside ``path`` (default: the system
    temp dir), which must pass ``check_swappable`` with every ancestor (after ``resolve_trusted``):
    otherwise another user could swap the fresh directory for a symlink and have files written
    where they choose.  Raises Refused naming the culprit (nothing is created then)."""
    base = resolve_trusted(path if path is not None else tempfile.gettempdir())
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode):
        raise Refused(errno.ENOTDIR, f"{base} is {_kind(st.st_mode)}, not a directory")
    check_swappable((base, *base.parents))
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def owned_dir(path: str | os.PathLike, what: str) -> Path:
    """Check (creating it 0700 when missing) a directory the exporter keeps its own files in
    (``--state.dir``): a directory owned by the exporter's user or root and writable by nobody
    else, under ancestors nobody else can swap, reached through no symlink another user could
    repoint (``resolve_trusted``: systemd's ``DynamicUser=`` layout passes).  Returns its real
    path.  Raises Refused naming ``what`` and the culprit."""
    p = Path(os.path.abspath(path))
    try:
        p.mkdir(mode=0o700, parents=True, exist_ok=True)
        real = resolve_trusted(p)
        st = os.lstat(real)
        if not stat.S_ISDIR(st.st_mode):
            raise Refused(errno.ENOTDIR, f"{what} {p} is {_kind(st.st_mode)}, not a directory")
        problem = owner_problem(st, root_ok=True)
        if problem:
            shown = p if real == p else f"{p} (really {real})"
            raise Refused(errno.EPERM, f"{what} {shown} is {problem}: another user could replace the files "
                                       "the exporter keeps there; chown/chmod it (e.g. chmod go-w)")
        check_swappable(real.parents)
    except Refused as exc:
        if str(exc).startswith(what):
            raise
        raise Refused(exc.errno or errno.EPERM, f"{what} {p}: {exc}") from None
    except OSError as exc:
        raise Refused(exc.errno or errno.EIO, f"{what} {p}: {exc.strerror or exc}") from None
    return real
