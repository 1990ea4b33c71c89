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
from collections.abc import Callable
from typing import Any

from aiohttp import web

from ..render.server_stats import STATS

log = logging.getLogger("unified_gpu_exporter")

# Connection limits (slowloris and fd exhaustion).  A connection gets HEADER_TIMEOUT to send its
# first complete request head; an idle keep-alive connection is closed after KEEPALIVE_TIMEOUT
# (aiohttp's keepalive_timeout, which also covers a later request whose head never finishes).
# At most MAX_CONNECTIONS sockets are open, counting every state: waiting for a first byte, in
# a TLS handshake, sending a request head, idle between keep-alive requests and in a request.  A
# new one evicts the oldest socket that is not in the middle of a request, so a scraper always
# finds a slot however many idle, stalled or slow clients hold connections.  TLS handshakes are
# also bounded by asyncio's ssl_handshake_timeout (HEADER_TIMEOUT).  The cap never exceeds the
# open-files soft limit less FD_RESERVE (the descriptors sources, logs and files need).
HEADER_TIMEOUT = 10.0
KEEPALIVE_TIMEOUT = 15.0
MAX_CONNECTIONS = 512
FD_RESERVE = 64
# what _Guarded.busy reads of aiohttp's RequestHandler (private: checked at start, idle_check)
_IDLE_ATTRS = ("_waiter", "_messages", "_request_in_progress")


class _Guarded(asyncio.Protocol):
    """Wraps aiohttp's per-connection protocol: header deadline and membership in the cap."""

    __slots__ = ("_guard", "_inner", "transport", "_head", "_in_head", "_timer", "_seen_request",
                 "replaces")

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol):
        self._guard = guard
        self._inner = inner
        self.transport: asyncio.Transport | None = None
        self._head = b""
        self._in_head = True   # until the first request head is complete
        self._timer: asyncio.TimerHandle | None = None
        self._seen_request = False
        self.replaces: Any = None  # the TLS listener's entry for this socket's handshake

    @property
    def busy(self) -> bool:
        """In a request (head complete, answer not yet written): never evicted to make room.

        Before its first complete head, and idle between keep-alive requests (aiohttp's handler
        waits for the next message and has none queued), a connection may be evicted; idle only
        where the start-up check found what it reads (``idle_check``)."""
        if not self._seen_request:
            return False
        if not self._guard.idle_eviction:
            return True
        inner = self._inner
        waiter = getattr(inner, "_waiter", None)
        idle = (waiter is not None and not waiter.done() and not getattr(inner, "_messages", ())
                and not getattr(inner, "_request_in_progress", False))
        return not idle

    def evict(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self._guard._admit(self, self.replaces)
        self.replaces = None
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
                self._seen_request = True
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
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft != resource.RLIM_INFINITY and max_connections > soft - FD_RESERVE:
            log.warning("--web.max-connections is above the open-files limit; capped",
                        extra={"max_connections": max_connections, "nofile": soft,
                               "cap": max(2, soft - FD_RESERVE)})
            max_connections = soft - FD_RESERVE
        self.max_connections = max(2, max_connections)
        self.header_timeout = header_timeout
        # every socket of every listener, oldest first: _Guarded connections, and the TLS
        # listener's sockets that have not reached HTTP yet (anything with .busy and .evict())
        self._open: OrderedDict[int, Any] = OrderedDict()
        self.evicted = 0
        self.timed_out = 0
        missing = idle_check(server)
        self.idle_eviction = not missing
        STATS.eviction = self.idle_eviction
        if missing:
            log.warning("idle keep-alive connections cannot be evicted under --web.max-connections: "
                        "aiohttp's protocol lacks %s (an untested aiohttp release?); only connections "
                        "before their first request and TLS handshakes are evicted", missing)

    def __call__(self) -> _Guarded:
        return _Guarded(self, self._server())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def _admit(self, conn: Any, replaces: Any = None) -> None:
        if replaces is not None:  # a TLS socket's handshake entry becomes its connection
            self._open.pop(id(replaces), None)
        while len(self._open) >= self.max_connections:
            # make room: the oldest socket that is not in the middle of a request
            victim = next((c for c in self._open.values() if not c.busy), None)
            if victim is None:
                break  # all in requests: admitted over the cap (bounded by the fd reserve)
            self._open.pop(id(victim), None)
            self.evicted += 1
            victim.evict()
        self._open[id(conn)] = conn

    def _release(self, conn: Any) -> None:
        self._open.pop(id(conn), None)


def idle_check(server: Any) -> str:
    """"" when the protocol ``server()`` builds has what ``_Guarded.busy`` reads to tell an idle
    keep-alive connection (aiohttp's private ``RequestHandler`` attributes, read since 3.14), else
    what is missing."""
    try:
        proto = server()
    except Exception as exc:  # noqa: BLE001 - a protocol factory we cannot probe: no idle eviction
        return f"a protocol to probe ({type(exc).__name__}: {exc})"
    missing = [a for a in _IDLE_ATTRS if not hasattr(proto, a)]
    if missing:
        return ", ".join(missing)
    if not (isinstance(proto._request_in_progress, bool) and hasattr(proto._messages, "__len__")
            and (proto._waiter is None or isinstance(proto._waiter, asyncio.Future))):
        return "_waiter/_messages/_request_in_progress of the expected types"
    return ""


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


class _Pending:
    """A TLS listener's socket before HTTP (waiting for its first byte, refused, or in the TLS
    handshake): an entry of the connection cap that is never busy."""

    __slots__ = ("_site", "sock", "timer", "task")
    busy = False

    def __init__(self, site: SniffingTLSSite, sock: socket.socket) -> None:
        self._site, self.sock = site, sock
        self.timer: asyncio.TimerHandle | None = None
        self.task: asyncio.Future | None = None

    def evict(self) -> None:
        self._site._drop(self)


class SniffingTLSSite(web.BaseSite):
    """A TLS listener that looks at the first byte of each connection before TLS starts.

    A TLS handshake record goes to the normal TLS path (``connect_accepted_socket`` with
    ``ssl_handshake_timeout`` = the header timeout); a plain HTTP request gets Go's ``400 Bad
    Request`` instead of a silent close; anything else is closed.  A connection that sends
    nothing within the header timeout is closed.  The bytes are peeked (``MSG_PEEK``), so TLS
    reads them again.  Every socket counts in the connection cap from accept on, handshakes in
    progress included (the oldest is evicted to make room).  ``context_provider`` (optional)
    gives the context for each new connection, so a changed client-certificate policy applies
    to the next handshake.
    """

    def __init__(self, runner: web.BaseRunner, host: str | None = None, port: int = 0, *,
                 ssl_context: ssl.SSLContext, sock: socket.socket | None = None,
                 backlog: int = 128, header_timeout: float = HEADER_TIMEOUT,
                 context_provider: Callable[[], ssl.SSLContext] | None = None):
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._host, self._port, self._given = host, port, sock
        self._header_timeout = header_timeout
        self._listeners: list[socket.socket] = []
        self._pending: dict[socket.socket, _Pending] = {}  # sockets that have not reached HTTP
        server = runner.server
        # the cap shared with the HTTP connections (a private one without guard_connections)
        self._guard = server if isinstance(server, ConnectionGuard) else ConnectionGuard(server)
        self._context_provider = context_provider
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
            entry = _Pending(self, conn)
            self._pending[conn] = entry
            self._guard._admit(entry)  # counted in the cap from accept on; may evict the oldest
            entry.timer = loop.call_later(self._header_timeout, self._drop, entry)
            loop.add_reader(conn.fileno(), self._sniff, entry)

    def _resume(self, ls: socket.socket) -> None:
        if ls in self._listeners and ls.fileno() >= 0:
            asyncio.get_running_loop().add_reader(ls.fileno(), self._accept, ls)

    def _drop(self, entry: _Pending) -> None:
        """Close a socket that has not reached HTTP (timer, eviction, error, stop)."""
        self._guard._release(entry)
        if self._pending.pop(entry.sock, None) is None:
            return
        if entry.timer is not None:
            entry.timer.cancel()
        if entry.task is not None:  # in the TLS handshake: asyncio owns the socket now
            entry.task.cancel()
            with contextlib.suppress(OSError):
                entry.sock.shutdown(socket.SHUT_RDWR)
            return
        with contextlib.suppress(OSError, ValueError):
            asyncio.get_running_loop().remove_reader(entry.sock.fileno())
        entry.sock.close()

    def _sniff(self, entry: _Pending) -> None:
        conn = entry.sock
        try:
            head = conn.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(entry)
            return
        if conn not in self._pending:
            return  # closed by its timer in the same loop iteration
        loop = asyncio.get_running_loop()
        if head and head[0] == _TLS_HANDSHAKE_RECORD:
            # stays in the cap (evictable) until the handshake ends, which asyncio bounds too
            assert entry.timer is not None
            entry.timer.cancel()
            entry.timer = None
            loop.remove_reader(conn.fileno())
            entry.task = asyncio.ensure_future(self._tls(entry))
            return
        if head[:1].isalpha():  # "GET /metrics HTTP/1.1" on the TLS port
            self.plain_http_refused += 1
            try:
                conn.send(BAD_REQUEST_ON_TLS)
                conn.shutdown(socket.SHUT_WR)
            except OSError:
                self._drop(entry)
                return
            # lingering close: drain what the client sent, so closing does not reset the
            # connection before it has read the answer (bounded by a second)
            assert entry.timer is not None
            entry.timer.cancel()
            entry.timer = loop.call_later(1.0, self._drop, entry)
            loop.remove_reader(conn.fileno())
            loop.add_reader(conn.fileno(), self._drain, entry)
            return
        self._drop(entry)

    def _drain(self, entry: _Pending) -> None:
        try:
            if entry.sock.recv(65536):
                return
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            pass
        self._drop(entry)

    async def _tls(self, entry: _Pending) -> None:
        loop = asyncio.get_running_loop()
        server = self._runner.server

        def protocol() -> Any:
            proto = server()  # type: ignore[misc]
            if isinstance(proto, _Guarded):
                proto.replaces = entry  # takes the handshake's place in the cap
            return proto
        ctx = self._context_provider() if self._context_provider is not None else self._ssl_context
        try:
            await loop.connect_accepted_socket(protocol, entry.sock, ssl=ctx,
                                               ssl_handshake_timeout=self._header_timeout)
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError):
            entry.sock.close()  # a failed handshake: asyncio has closed its transport already
        finally:
            self._pending.pop(entry.sock, None)
            self._guard._release(entry)

    async def stop(self) -> None:
        loop = asyncio.get_running_loop()
        for ls in self._listeners:
            with contextlib.suppress(OSError, ValueError):
                loop.remove_reader(ls.fileno())
            ls.close()
        for entry in list(self._pending.values()):
            self._drop(entry)
        await super().stop()
