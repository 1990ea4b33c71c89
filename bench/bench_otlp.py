"""OTLP push: process CPU with the push on vs off, simulated node at 32 cards (issue 30).

Two exporters run side by side over the same window on the same scaled demo scenario, both with
the defaults (poll 1 s, fast sampling and indicators on), neither scraped: ``on`` has
``exporters.otlp`` enabled (interval 15 s, http/protobuf, gzip) pushing to a receiver in this
process, ``off`` has not.  The window starts after the first push (the SDK is imported then, once).
Also measured in-process, on the same 32-card exposition: the CPU of one push's stages (parse and
convert, SDK data model, protobuf encoding), which is what the push adds per interval.

    python bench/bench_otlp.py [--devices 32] [--seconds 60] [--interval 15s]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.simulated import start  # noqa: E402


class _Receiver:
    """Accepts OTLP/HTTP requests and counts them (no decoding: this process's CPU is not measured)."""

    def __init__(self) -> None:
        self.requests = 0
        self.bytes = 0
        rec = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length", "0"))
                rec.bytes += len(self.rfile.read(n))
                rec.requests += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/metrics"


def push_stages(exposition: bytes, receiver_url: str, repeat: int = 5) -> dict:
    """CPU ms of one push's stages on this exposition (steady state: after a first conversion),
    and of the whole push in its thread (convert, encode, export with gzip and HTTP to a local
    receiver: ``time.thread_time``, which the receiver's threads do not add to)."""
    import gzip

    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

    from exporter.map.schema import load_schema
    from exporter.otlp import sdk
    from exporter.otlp.convert import Converter
    from exporter.otlp.encode import Encoder
    from exporter.otlp.naming import load_mapping

    schema = load_schema()
    conv = Converter(load_mapping(schema), schema)
    c0 = time.process_time()
    conv.convert(exposition, time.time())
    first = time.process_time() - c0
    url, res = "https://opentelemetry.io/schemas/1.44.0", {"service.name": "bench"}
    enc = Encoder()
    enc.request(conv.convert(exposition, time.time()), res, url)  # steady state: attribute sets encoded
    t = {"convert": 0.0, "encode": 0.0, "gzip": 0.0, "sdk_encoder": 0.0}
    points = 0
    for _ in range(repeat):
        c0 = time.process_time()
        out = conv.convert(exposition, time.time())
        c1 = time.process_time()
        body = enc.request(out, res, url).SerializeToString()
        c2 = time.process_time()
        gz = gzip.compress(body, 9)
        c3 = time.process_time()
        # the path not taken, for reference: the SDK data model and the SDK's encoder
        sdk_body = encode_metrics(sdk.metrics_data(out, res, url)).SerializeToString()
        c4 = time.process_time()
        assert sdk_body == body
        t["convert"] += c1 - c0
        t["encode"] += c2 - c1
        t["gzip"] += c3 - c2
        t["sdk_encoder"] += c4 - c3
        points = out.exported
    ms = {k: v / repeat * 1000 for k, v in t.items()}
    from exporter.otlp.config import OtlpConfig

    exporter = sdk.make_exporter(OtlpConfig(endpoint=receiver_url))
    whole = 0.0
    for _ in range(repeat):
        c0 = time.thread_time()
        assert sdk.send(exporter, enc, conv.convert(exposition, time.time()), res, url, 10.0)
        whole += time.thread_time() - c0
    exporter.shutdown()
    return {"push_thread_ms": whole / repeat * 1000,"first_convert_ms": first * 1000, **{f"{k}_ms": v for k, v in ms.items()},
            "push_ms": ms["convert"] + ms["encode"] + ms["gzip"], "points": points, "protobuf_bytes": len(body),
            "gzip_bytes": len(gz), "exposition_series": out.series}


def run(tmp: Path, devices: int = 32, seconds: float = 60.0, interval: str = "15s", settle: float = 5.0) -> dict:
    receiver = _Receiver()
    conf = tmp / "otlp-on.yaml"
    conf.write_text(f"exporters:\n  otlp:\n    enabled: true\n    endpoint: {receiver.url}\n"
                    f"    interval: {interval}\n    timeout: 10s\n")
    on = start(devices, tmp, name=f"otlp-on{devices}", extra=("--config.file", str(conf)))
    off = start(devices, tmp, name=f"otlp-off{devices}")
    try:
        on.wait_ready()
        off.wait_ready()
        deadline = time.monotonic() + 60
        while receiver.requests < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        if receiver.requests < 1:
            raise RuntimeError(f"no push arrived: {on.tail()}")
        time.sleep(settle)
        r0, c_on, c_off = receiver.requests, on.cpu(), off.cpu()
        time.sleep(seconds)
        d_on, d_off = on.cpu() - c_on, off.cpu() - c_off
        pushes = receiver.requests - r0
        exposition = off.get()
    finally:
        on.stop()
        off.stop()
    try:
        stages = push_stages(exposition, receiver.url)
    finally:
        receiver.server.shutdown()
    seconds_per_push = float(interval.rstrip("s"))
    return {"modelled_ratio": 1 + stages["push_thread_ms"] / 1000 / seconds_per_push / (d_off / seconds) if d_off else None,
            "devices": devices, "interval": interval, "seconds": seconds, "pushes": pushes,
            "push_bytes_avg": receiver.bytes / max(receiver.requests, 1),
            "cpu_on_percent": d_on / seconds * 100, "cpu_off_percent": d_off / seconds * 100,
            "ratio": d_on / d_off if d_off else None, "stages": stages}


def main() -> None:
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--interval", default="15s")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ugx-otlp-") as d:
        print(json.dumps(run(Path(d), args.devices, args.seconds, args.interval), indent=1))


if __name__ == "__main__":
    main()
