"""Listening sockets: connection limits (slowloris, fd exhaustion) and the TLS listener that
answers plain HTTP the way Go's net/http does."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import resource
import socket
import ssl
from collections import OrderedDict
from typing import Any

from aiohttp import web

log = logging.getLogger("unified_gpu_exporter")

# Connection limits (slowloris and fd exhaustion).  A connection gets HEADER_TIMEOUT to send its
# first complete request head; an idle keep-alive connection is closed after KEEPALIVE_TIMEOUT
# (aiohttp's keepalive_timeout, which also covers a later request whose head never finishes).
# At most MAX_CONNECTIONS are open: a new one then evicts the oldest connection that is not in
# the middle of a request, so a scraper always finds a slot however many idle or slow clients
# hold connections.  TLS handshakes are bounded by asyncio's ssl_handshake_timeout.
HEADER_TIMEOUT = 10.0
KEEPALIVE_TIMEOUT = 15.0
MAX_CONNECTIONS = 512


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the open-files soft limit to the hard limit (as Go programs do at start).
    Returns the (soft, hard) limits now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-files limit", extra={"reason": str(exc)})
    return soft, hard


class _Guarded(asyncio.Protocol):
    """Wraps aiohttp's per-connection protocol: header deadline and membership in the cap."""

    __slots__ = ("_guard", "_inner", "transport", "_head", "_in_head", "_timer", "busy")

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol):
        self._guard = guard
        self._inner = inner
        self.transport: asyncio.Transport | None = None
        self._head = b""
        self._in_head = True   # until the first request head is complete
        self._timer: asyncio.TimerHandle | None = None
        self.busy = False      # a request head arrived: never evicted to make room

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self._guard._admit(self)
        self._timer = asyncio.get_running_loop().call_later(self._guard.header_timeout, self._expire)
        self._inner.connection_made(transport)

    def _expire(self) -> None:
        self._timer = None
        if self._in_head and self.transport is not None:
            self._guard.timed_out += 1
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head = (self._head + data)[-4096:]
            if b"\r\n\r\n" in self._head or b"\n\n" in self._head:
                self._in_head = False
                self.busy = True
                self._head = b""
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._guard._release(self)
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class ConnectionGuard:
    """Stands in for aiohttp's ``web.Server`` as the protocol factory (all else delegated)."""

    def __init__(self, server: Any, max_connections: int = MAX_CONNECTIONS,
                 header_timeout: float = HEADER_TIMEOUT):
        self._server = server
        self.max_connections = max(2, max_connections)
        self.header_timeout = header_timeout
        self._open: OrderedDict[int, _Guarded] = OrderedDict()  # oldest first
        self.evicted = 0
        self.timed_out = 0

    def __call__(self) -> _Guarded:
        return _Guarded(self, self._server())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def _admit(self, conn: _Guarded) -> None:
        if len(self._open) >= self.max_connections:
            # make room: the oldest connection that has not sent a complete request head
            victim = next((c for c in self._open.values() if not c.busy), None)
            if victim is not None:
                self._open.pop(id(victim), None)
                self.evicted += 1
                if victim.transport is not None:
                    victim.transport.abort()
        self._open[id(conn)] = conn

    def _release(self, conn: _Guarded) -> None:
        self._open.pop(id(conn), None)


def guard_connections(runner: web.AppRunner, max_connections: int = MAX_CONNECTIONS,
                      header_timeout: float = HEADER_TIMEOUT) -> ConnectionGuard:
    """Put a ConnectionGuard in front of a set-up runner's server (before any site starts)."""
    server = runner.server
    assert server is not None, "call runner.setup() first"
    guard = ConnectionGuard(server, max_connections, header_timeout)
    runner._server = guard  # type: ignore[assignment] - the factory sites pass to create_server
    return guard


# what Go's net/http answers when a plain HTTP request reaches its TLS listener
BAD_REQUEST_ON_TLS = (b"HTTP/1.0 400 Bad Request\r\n\r\n"
                      b"Client sent an HTTP request to an HTTPS server.\n")
_TLS_HANDSHAKE_RECORD = 0x16


class SniffingTLSSite(web.BaseSite):
    """A TLS listener that looks at the first byte of each connection before TLS starts.

    A TLS handshake record goes to the normal TLS path (``connect_accepted_socket`` with
    ``ssl_handshake_timeout`` = the header timeout); a plain HTTP request gets Go's ``400 Bad
    Request`` instead of a silent close; anything else is closed.  A connection that sends
    nothing within the header timeout is closed.  The bytes are peeked (``MSG_PEEK``), so TLS
    reads them again.
    """

    def __init__(self, runner: web.BaseRunner, host: str | None = None, port: int = 0, *,
                 ssl_context: ssl.SSLContext, sock: socket.socket | None = None,
                 backlog: int = 128, header_timeout: float = HEADER_TIMEOUT):
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._host, self._port, self._given = host, port, sock
        self._header_timeout = header_timeout
        self._listeners: list[socket.socket] = []
        self._waiting: dict[socket.socket, asyncio.TimerHandle] = {}
        self._handshakes: set[asyncio.Task] = set()
        self.plain_http_refused = 0

    @property
    def name(self) -> str:
        return f"https://{self._host or ''}:{self.port}"

    @property
    def port(self) -> int:
        return self._listeners[0].getsockname()[1] if self._listeners else self._port

    def _bind(self) -> list[socket.socket]:
        if not self._host and socket.has_dualstack_ipv6():
            return [socket.create_server(("", self._port), family=socket.AF_INET6,
                                         backlog=self._backlog, dualstack_ipv6=True)]
        if not self._host:
            return [socket.create_server(("", self._port), backlog=self._backlog)]
        out = []
        infos = socket.getaddrinfo(self._host, self._port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        for family, _, _, _, addr in dict.fromkeys((i[0], 0, 0, "", i[4]) for i in infos):
            out.append(socket.create_server(addr[:2], family=family, backlog=self._backlog))
        return out

    async def start(self) -> None:
        await super().start()
        self._listeners = [self._given] if self._given is not None else self._bind()
        loop = asyncio.get_running_loop()
        for ls in self._listeners:
            ls.setblocking(False)
            loop.add_reader(ls.fileno(), self._accept, ls)

    def _accept(self, ls: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(self._backlog):
            try:
                conn, _addr = ls.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # out of descriptors: stop accepting for a second (as asyncio does)
                    log.warning("accept failed, pausing for 1 s", extra={"reason": str(exc)})
                    loop.remove_reader(ls.fileno())
                    loop.call_later(1.0, self._resume, ls)
                return
            conn.setblocking(False)
            cap = getattr(self._runner.server, "max_connections", MAX_CONNECTIONS)
            if len(self._waiting) >= cap:  # silent clients: the oldest makes room
                self._close(next(iter(self._waiting)))
            self._waiting[conn] = loop.call_later(self._header_timeout, self._close, conn)
            loop.add_reader(conn.fileno(), self._sniff, conn)

    def _resume(self, ls: socket.socket) -> None:
        if ls in self._listeners and ls.fileno() >= 0:
            asyncio.get_running_loop().add_reader(ls.fileno(), self._accept, ls)

    def _close(self, conn: socket.socket) -> None:
        timer = self._waiting.pop(conn, None)
        if timer is not None:
            timer.cancel()
        with contextlib.suppress(OSError, ValueError):
            asyncio.get_running_loop().remove_reader(conn.fileno())
        conn.close()

    def _sniff(self, conn: socket.socket) -> None:
        try:
            head = conn.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        timer = self._waiting.get(conn)
        if timer is None:
            return  # closed by its timer in the same loop iteration
        if head and head[0] == _TLS_HANDSHAKE_RECORD:
            del self._waiting[conn]
            timer.cancel()
            asyncio.get_running_loop().remove_reader(conn.fileno())
            task = asyncio.ensure_future(self._tls(conn))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)
            return
        if head[:1].isalpha():  # "GET /metrics HTTP/1.1" on the TLS port
            self.plain_http_refused += 1
            try:
                conn.send(BAD_REQUEST_ON_TLS)
                conn.shutdown(socket.SHUT_WR)
            except OSError:
                self._close(conn)
                return
            # lingering close: drain what the client sent, so closing does not reset the
            # connection before it has read the answer (bounded by a second)
            loop = asyncio.get_running_loop()
            timer.cancel()
            self._waiting[conn] = loop.call_later(1.0, self._close, conn)
            loop.remove_reader(conn.fileno())
            loop.add_reader(conn.fileno(), self._drain, conn)
            return
        self._close(conn)

    def _drain(self, conn: socket.socket) -> None:
        try:
            if conn.recv(65536):
                return
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            pass
        self._close(conn)

    async def _tls(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(self._runner.server, conn,  # type: ignore[arg-type]
                                               ssl=self._ssl_context,
                                               ssl_handshake_timeout=self._header_timeout)
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError):
            conn.close()  # a failed handshake: asyncio has closed its transport already

    async def stop(self) -> None:
        loop = asyncio.get_running_loop()
        for ls in self._listeners:
            with contextlib.suppress(OSError, ValueError):
                loop.remove_reader(ls.fileno())
            ls.close()
        for conn in list(self._waiting):
            self._close(conn)
        for task in list(self._handshakes):
            task.cancel()
        await super().stop()
