"""Issue 26, finding 13: an upstream target that trickles its status line or headers (a byte at
a time, each byte well inside the socket timeout) fails by its own deadline, which covers
connect, status line, headers and body; the healthy target beside it is still read."""

from __future__ import annotations

import concurrent.futures
import socket
import threading
import time

import pytest

from tests.test_upstream_http import GOOD, GOOD_KEY, ExporterServer, Route, make_source, server, target  # noqa: F401


class Trickler:
    """A loopback server that reads a request, then sends ``head`` one byte every ``gap`` s."""

    def __init__(self, head: bytes, gap: float = 0.1) -> None:
        self.head, self.gap = head, gap
        self.ls = socket.create_server(("127.0.0.1", 0))
        self.closed_by_client = threading.Event()
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ls.getsockname()[1]}/metrics"

    def _serve(self) -> None:
        self.ls.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.ls.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            i = 0
            while not self._stop.is_set():
                try:
                    conn.sendall(self.head[i % len(self.head):][:1])
                except OSError:
                    self.closed_by_client.set()
                    return
                i += 1
                time.sleep(self.gap)

    def close(self) -> None:
        self._stop.set()
        self.ls.close()


@pytest.fixture
def tricklers():
    made = [Trickler(b"HTTP/1.1 200 OK\r\n" + b"X" * 10_000),               # an endless status line
            Trickler(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n" + b"X-Pad: y\r\n" * 10_000)]
    yield made
    for t in made:
        t.close()


def test_trickled_status_line_and_headers_fail_by_the_target_deadline(server, tricklers):  # noqa: F811
    server.routes["/metrics"] = Route(body=GOOD.encode())
    src = make_source(target(server.url("/metrics"), name="good", timeout=5),
                      target(tricklers[0].url, name="status", timeout=1),
                      target(tricklers[1].url, name="headers", timeout=1))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        t0 = time.monotonic()
        fut = pool.submit(src.poll)
        try:
            result = fut.result(timeout=30)  # before the fix: never (the trickle never ends)
        except concurrent.futures.TimeoutError:
            for t in tricklers:
                t.close()  # let the hung poll end so the pool can shut down
            pytest.fail("the poll did not return within 30 s: a trickling target held it")
        elapsed = time.monotonic() - t0
    assert elapsed < 20, elapsed
    assert result.errors["timeout"] == 2, result.errors
    assert GOOD_KEY in {d.key for d in result.devices}
    # the exporter closed the trickling connections (no thread left reading them)
    for t in tricklers:
        assert t.closed_by_client.wait(10)
