"""An OTLP/HTTP metrics receiver for the tests: decodes every ExportMetricsServiceRequest with the
official protobuf definitions (opentelemetry-proto) and keeps it with its headers.

``hold`` makes it slow: each request waits until the event is set (or the client gives up).
``status`` is the HTTP status it answers (200: accepted).
"""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)


class OtlpReceiver:
    def __init__(self, status: int = 200, port: int = 0) -> None:
        self.status = status
        self.requests: list[tuple[dict[str, str], ExportMetricsServiceRequest]] = []
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
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/metrics"

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
