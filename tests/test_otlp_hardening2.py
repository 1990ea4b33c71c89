"""Issue 37, items 2 and 9: a hostile Collector's answer.  A gzip answer that inflates to a
gigabyte is refused after at most ``MAX_ANSWER_BYTES`` (it took the push to 1 GiB); an answer
that trickles a byte at a time ends at the push's one deadline and is counted a failure (it held
the push thread for ever, counted neither way).  Loopback only."""

from __future__ import annotations

import socket
import threading
import time
import zlib

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otlp extra (make install)")

from exporter.render.otlp_stats import PushStats  # noqa: E402
from tests.bounded import run_bounded  # noqa: E402
from tests.test_otlp_hardening import _load, _offer, _pusher, names  # noqa: E402, F401
from tests.test_webconfig_tls import tls_files  # noqa: E402, F401 - the session fixture (openssl PKI)


class RawReceiver:
    """Reads a request's head and body, then sends ``head`` and ``body`` (``gap`` s between
    bytes of the body when set)."""

    def __init__(self, head: bytes, body: bytes = b"", gap: float = 0.0) -> None:
        self.head, self.body, self.gap = head, body, gap
        self.ls = socket.create_server(("127.0.0.1", 0))
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ls.getsockname()[1]}/v1/metrics"

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.ls.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            try:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, rest = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(rest) < length:
                    rest += conn.recv(65536)
                conn.sendall(self.head)
                if not self.gap:
                    conn.sendall(self.body)
                    return
                for i in range(len(self.body)):
                    if self.stop.is_set():
                        return
                    conn.sendall(self.body[i:i + 1])
                    time.sleep(self.gap)
            except OSError:
                return

    def close(self) -> None:
        self.stop.set()
        self.ls.close()


def test_a_trickled_answer_ends_at_the_deadline_and_counts_a_failure(tmp_path, names):  # noqa: F811
    receiver = RawReceiver(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\n"
                           b"Content-Length: 100000\r\n\r\n", b"\0" * 100_000, gap=0.2)
    stats = PushStats()
    try:
        pusher = _pusher(_load(tmp_path, receiver.url, timeout="2s").exporters.otlp, names, stats)
        _offer(pusher, timeout=60)  # before the fix: never (each byte well inside the read timeout)
        pusher.close(wait=5)
    finally:
        receiver.close()
    assert (stats.success, stats.failure) == (0, 1)


_BOMB_CHILD = r"""
import socket, sys, threading, types
from exporter.otlp.transport import PushSession
bomb = open(sys.argv[1], "rb").read()
ls = socket.create_server(("127.0.0.1", 0))
conns = []
def serve():
    conn, _ = ls.accept()
    data = b""
    while not data.endswith(b"\r\n\r\nx"):  # the head and the one-byte body
        data += conn.recv(65536)
    conns.append(conn)  # kept open: the client reads the answer, nothing resets it
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Encoding: gzip\r\n"
                 + f"Content-Length: {len(bomb)}\r\n\r\n".encode() + bomb)
threading.Thread(target=serve, daemon=True).start()
tls = types.SimpleNamespace(ca_file=None, cert_file=None, key_file=None)
session = PushSession(types.SimpleNamespace(tls=tls, proxy_url="", timeout=30.0))
try:
    r = session.post(f"http://127.0.0.1:{ls.getsockname()[1]}/v1/metrics", data=b"x", timeout=30)
    print("READ", len(r.content))
except Exception as exc:
    print("REFUSED", type(exc).__name__, str(exc)[:200])
"""


def test_a_gzip_bomb_answer_is_refused_without_inflating(tmp_path):
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = b"\0" * (1 << 20)
    bomb = b"".join(z.compress(zeros) for _ in range(900)) + z.flush()  # 900 MiB inflated
    assert len(bomb) < 1 << 20  # under the cap on the wire: the inflate cap is what holds
    (tmp_path / "bomb").write_bytes(bomb)
    # before the fix: requests inflated the whole answer (a MemoryError under 700 MiB, or a kill)
    got = run_bounded(_BOMB_CHILD, str(tmp_path / "bomb"), timeout=120, mem=700 << 20)
    assert got.ok, got.out[-2000:]
    assert "REFUSED AnswerRefused" in got.out and "decompressed body larger" in got.out, got.out[-2000:]


def test_a_ca_file_swapped_for_a_fifo_after_load_does_not_hang_the_push(tmp_path, tls_files):  # noqa: F811
    """The push opens no configured TLS file by path: what was read (bounded, a regular file) is
    handed to requests as an anonymous memory file.  Before: requests opened the CA path at every
    new connection, and a FIFO there held the push thread for ever."""
    import os
    import shutil
    import types

    from exporter.otlp.transport import PushSession
    from tests.otlp_receiver import OtlpReceiver
    from tests.test_otlp_tls import _server_ctx

    ca = tmp_path / "ca.pem"
    shutil.copy(tls_files["ca.pem"], ca)
    tls = types.SimpleNamespace(ca_file=ca, cert_file=None, key_file=None)
    session = PushSession(types.SimpleNamespace(tls=tls, proxy_url="", timeout=10.0))
    ca.unlink()
    os.mkfifo(ca)
    box: list = []
    with OtlpReceiver(tls=_server_ctx(tls_files)) as receiver:
        t = threading.Thread(target=lambda: box.append(session.post(receiver.url, data=b"", timeout=10)),
                             daemon=True)
        t.start()
        t.join(30)
        if t.is_alive():  # let the old code's reader go before failing
            fd = os.open(ca, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
    session.close()
    assert not t.is_alive(), "the push blocked opening the CA file"
    assert box and box[0].status_code < 500
