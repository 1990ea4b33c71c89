"""HTTP for the upstream source: one deadline per request over connect, TLS, status line,
headers and body (urllib's socket timeout bounds only each read)."""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import time
import urllib.request
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
