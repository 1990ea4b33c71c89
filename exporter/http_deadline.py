"""urllib with one deadline per request over connect, TLS, status line, headers and body
(urllib's socket timeout bounds only each read), no redirects and no proxy from the environment;
and the one bounded way to read an answer's body (``read_body``: size counted while reading,
the deadline checked between reads; ``inflate``: gzip/deflate decompressed to a cap).

Used by the clients that read another party's server: the upstream source, the Kubernetes
API pod lister and the OTLP push (its requests session registers its urllib3 connections with a
``Deadline`` and reads the Collector's answer through ``read_body``)."""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
import zlib
from collections.abc import Callable
from typing import Any


class Deadline:
    """One deadline per request covering connect, TLS, status line, headers and body.

    Socket timeouts bound each read, not the request: a target that sends its status line or
    headers a byte at a time would hold the poll for ever.  At the deadline a timer shuts the
    connection's socket down, which ends any read in progress."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds
        self.expired = False
        self._conns: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._conns.append(conn)
            if self.expired:
                self._shutdown(conn)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for conn in self._conns:
                self._shutdown(conn)

    @staticmethod
    def _shutdown(conn: http.client.HTTPConnection) -> None:
        sock = conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the fd, not the TLS layer

    def cancel(self) -> None:
        self._timer.cancel()

    def remaining(self) -> float:
        return max(0.001, self.at - time.monotonic())


class _WatchedConnection:
    """Mixin for http.client connections: registered with the deadline before connecting."""

    deadline: Deadline

    def connect(self) -> None:
        self.deadline.watch(self)  # type: ignore[arg-type]
        self.timeout = self.deadline.remaining()
        super().connect()  # type: ignore[misc]


class _HTTPConnection(_WatchedConnection, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_WatchedConnection, http.client.HTTPSConnection):
    pass


class HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self._deadline = deadline

    def http_open(self, req: urllib.request.Request) -> Any:
        conn = type("_Conn", (_HTTPConnection,), {"deadline": self._deadline})
        return self.do_open(conn, req)


class HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: Deadline, context: ssl.SSLContext | None) -> None:
        super().__init__(context=context)
        self._deadline = deadline

    def https_open(self, req: urllib.request.Request) -> Any:
        conn = type("_Conn", (_HTTPSConnection,), {"deadline": self._deadline})
        return self.do_open(conn, req, context=self._context)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an error: only the configured URL is read, and credentials (a bearer
    token, basic auth) never go to another host or scheme."""

    def __init__(self, refuse: Callable[[int, str], Exception]) -> None:
        self._refuse = refuse

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 - urllib API
        raise self._refuse(code, newurl)


def opener(deadline: Deadline, context: ssl.SSLContext | None,
           refuse_redirect: Callable[[int, str], Exception]) -> urllib.request.OpenerDirector:
    """http(s) only, no proxy from the environment (HTTP(S)_PROXY), no redirects."""
    return urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect(refuse_redirect),
                                       HTTPHandler(deadline), HTTPSHandler(deadline, context))


def redact_url(url: str) -> str:
    """``url`` with the password of its userinfo replaced by ``xxxxx`` (Go's ``URL.Redacted``,
    what Prometheus and exporter-toolkit log): for log lines and error messages."""
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.password is None:
            return url
        user = parts.username or ""
        host = parts.netloc.rpartition("@")[2]
        return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:xxxxx@{host}"))
    except ValueError:
        return "<a URL that does not parse>"


class BodyTooLarge(ValueError):
    """An answer (on the wire or decompressed) above its limit."""


class DeadlinePassed(TimeoutError):
    """The request's deadline passed before its answer was complete."""


def read_body(read: Callable[[int], bytes], deadline: Deadline | None, limit: int, what: str) -> bytes:
    """Read with ``read(n)`` (a ``read1`` that returns what arrived, or a ``read``) until the end,
    counting while reading: past ``limit`` bytes raises ``BodyTooLarge`` before more is kept, and a
    passed ``deadline`` (whose timer shuts the socket down, ending a read in progress) raises
    ``DeadlinePassed``."""
    chunks: list[bytes] = []
    size = 0
    while True:
        if deadline is not None and (deadline.expired or time.monotonic() > deadline.at):
            raise DeadlinePassed(f"{what}: no complete answer within the deadline")
        try:
            chunk = read(min(65536, limit + 1 - size))
        except (OSError, ValueError, http.client.HTTPException):
            if deadline is not None and deadline.expired:
                raise DeadlinePassed(f"{what}: no complete answer within the deadline") from None
            raise
        if not chunk:
            break
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"{what}: body larger than {limit} bytes")
        chunks.append(chunk)
    if deadline is not None and deadline.expired:  # shut down mid-body: what arrived is cut short
        raise DeadlinePassed(f"{what}: no complete answer within the deadline")
    return b"".join(chunks)


def inflate(body: bytes, encoding: str, limit: int, what: str) -> bytes:
    """``body`` decompressed per its Content-Encoding (gzip, deflate; identity as is), never past
    ``limit`` bytes: a compression bomb raises ``BodyTooLarge`` instead of filling memory.  Any
    other encoding raises ``ValueError`` (nothing was asked for that we cannot bound)."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding in ("gzip", "x-gzip"):
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    elif encoding == "deflate":
        d = zlib.decompressobj()
    else:
        raise ValueError(f"{what}: unsupported Content-Encoding {encoding[:40]!r}")
    out = d.decompress(body, limit)
    if d.unconsumed_tail or (not d.eof and d.decompress(b"", 1)):
        raise BodyTooLarge(f"{what}: decompressed body larger than {limit} bytes")
    return out
