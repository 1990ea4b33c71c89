"""urllib with one deadline per request over connect, TLS, status line, headers and body
(urllib's socket timeout bounds only each read), no redirects and no proxy from the environment.

Used by the clients that read another party's server: the upstream source and the Kubernetes
API pod lister."""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import time
import urllib.request
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
