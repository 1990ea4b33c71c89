"""An OTLP/HTTP metrics receiver for the tests: decodes every ExportMetricsServiceRequest with the
official protobuf definitions (opentelemetry-proto) and keeps it with its headers.

``hold`` makes it slow: each request waits until the event is set (or the client gives up).
``status`` is the HTTP status it answers (200: accepted).  ``tls``: a server-side SSL context
(HTTPS; a context that requires client certificates makes it mutual TLS).  ``bodies`` keeps each
request body as it arrived (decompressed).

``ConnectProxy``: an HTTP proxy that only tunnels (CONNECT, what HTTPS and gRPC clients ask a proxy
for) and records each target.
"""

from __future__ import annotations

import gzip
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)


class OtlpReceiver:
    def __init__(self, status: int = 200, port: int = 0, tls: ssl.SSLContext | None = None) -> None:
        self.status = status
        self.tls = tls
        self.requests: list[tuple[dict[str, str], ExportMetricsServiceRequest]] = []
        self.bodies: list[bytes] = []
        self.hold: threading.Event | None = None
        self.waiting = threading.Event()  # a request is being held
        self.received = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                req = ExportMetricsServiceRequest()
                req.ParseFromString(body)
                if receiver.hold is not None:
                    receiver.waiting.set()
                    receiver.hold.wait(30)
                with receiver.received:
                    receiver.bodies.append(body)
                    receiver.requests.append(({k.lower(): v for k, v in self.headers.items()}, req))
                    receiver.received.notify_all()
                out = ExportMetricsServiceResponse().SerializeToString()
                try:
                    self.send_response(receiver.status)
                    self.send_header("Content-Type", "application/x-protobuf")
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                except OSError:
                    pass  # the client gave up (timeout)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        if tls is not None:  # the handshake on accept: a failed one drops that connection only
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/v1/metrics"

    def wait_for(self, n: int, timeout: float) -> list:
        with self.received:
            self.received.wait_for(lambda: len(self.requests) >= n, timeout)
            return list(self.requests)

    def __enter__(self) -> OtlpReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.hold is not None:
            self.hold.set()
        self.server.shutdown()
        self.server.server_close()


class ConnectProxy:
    """Tunnels ``CONNECT host:port`` requests to their target and records each target."""

    def __init__(self) -> None:
        self.targets: list[str] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._tunnel, args=(client,), daemon=True).start()

    def _tunnel(self, client: socket.socket) -> None:
        with client:
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 16384:
                chunk = client.recv(4096)
                if not chunk:
                    return
                head += chunk
            method, target = head.split(b" ", 2)[:2]
            if method != b"CONNECT":
                client.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
                return
            self.targets.append(target.decode())
            host, _, port = target.decode().rpartition(":")
            try:
                upstream = socket.create_connection((host.strip("[]"), int(port)), timeout=10)
            except OSError:
                client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                return
            with upstream:
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                rest = head.split(b"\r\n\r\n", 1)[1]
                if rest:
                    upstream.sendall(rest)
                pump = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
                pump.start()
                _pipe(client, upstream)
                pump.join(10)

    def __enter__(self) -> ConnectProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        except OSError:
            pass
        self.listener.close()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class GrpcReceiver:
    """An OTLP/gRPC metrics receiver (grpcio, the otlp-grpc extra) on 127.0.0.1: ``requests``
    keeps every ExportMetricsServiceRequest with its metadata.  ``tls``: (key, certificate) PEM
    bytes for a TLS port; plaintext without."""

    def __init__(self, tls: tuple[bytes, bytes] | None = None) -> None:
        import grpc
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc

        self.requests: list[tuple[dict, ExportMetricsServiceRequest]] = []
        self.arrived = threading.Event()
        receiver = self

        class Service(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request, context):  # noqa: N802, ANN001, ANN202 - the service's name
                receiver.requests.append((dict(context.invocation_metadata()), request))
                receiver.arrived.set()
                return metrics_service_pb2.ExportMetricsServiceResponse()

        from concurrent import futures

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Service(), self.server)
        if tls is None:
            self.port = self.server.add_insecure_port("127.0.0.1:0")
        else:
            self.port = self.server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([tls]))

    def __enter__(self) -> GrpcReceiver:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(0)
