"""OTLP push: process CPU with the push on vs off, simulated node at 32 cards (issue 30).

Two exporters run side by side on the same scaled demo scenario, both with the defaults (poll
1 s, fast sampling and indicators on), neither scraped, as a crossover (``run``): one has
``exporters.otlp`` enabled (interval 15 s, http/protobuf, gzip) pushing to a receiver in this
process, the other not, then both reload with the roles swapped.
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
    mapping = load_mapping(schema)
    conv = Converter(mapping, schema)
    c0 = time.process_time()
    conv.convert(exposition, time.time())
    first = time.process_time() - c0
    url, res = mapping.schema_url, {"service.name": "bench"}
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
    from exporter.otlp.transport import make_exporter

    exporter = make_exporter(OtlpConfig(endpoint=receiver_url))
    whole = 0.0
    for _ in range(repeat):
        c0 = time.thread_time()
        assert sdk.send(exporter.sdk, enc, conv.convert(exposition, time.time()), res, url, 10.0)
        whole += time.thread_time() - c0
    exporter.shutdown()
    return {"push_thread_ms": whole / repeat * 1000, "first_convert_ms": first * 1000,
            **{f"{k}_ms": v for k, v in ms.items()},
            "push_ms": ms["convert"] + ms["encode"] + ms["gzip"], "points": points, "protobuf_bytes": len(body),
            "gzip_bytes": len(gz), "exposition_series": out.series}


def _otlp_conf(path: Path, receiver: _Receiver, interval: str, enabled: bool) -> None:
    path.write_text(f"exporters:\n  otlp:\n    enabled: {str(enabled).lower()}\n    endpoint: {receiver.url}\n"
                    f"    interval: {interval}\n    timeout: 10s\n")


def _wait(cond, what: str, proc, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: {proc.tail()}")
        time.sleep(0.1)


def _pushing(proc) -> bool:
    return b"unified_gpu_exporter_otlp_exports_total" in proc.get()


def run(tmp: Path, devices: int = 32, seconds: float = 60.0, interval: str = "15s", settle: float = 5.0,
        warm_pushes: int = 2) -> dict:
    """A crossover, so that what differs between two processes of the same configuration (their
    hash seeds, heap layout, which core they land on: a few % of CPU) cancels out: exporters A
    and B run side by side; in the first half A pushes and B does not, then both reload (SIGHUP)
    with the roles swapped.  ratio = sqrt(A_on/B_off * B_on/A_off), each half ``seconds / 2``
    long, measured after the pushing exporter's ``warm_pushes``-th push (the SDK is imported at the first, and
    the first two parse each series prefix they have not seen: a start-up cost, not a steady one)."""
    import signal

    receiver = _Receiver()
    conf = {"a": tmp / "otlp-a.yaml", "b": tmp / "otlp-b.yaml"}
    _otlp_conf(conf["a"], receiver, interval, True)
    _otlp_conf(conf["b"], receiver, interval, False)
    procs = {k: start(devices, tmp, name=f"otlp-{k}{devices}", extra=("--config.file", str(conf[k])))
             for k in ("a", "b")}
    half = seconds / 2
    cpu: dict[str, float] = {}
    pushes = 0
    try:
        for p in procs.values():
            p.wait_ready()
        for on, off in (("a", "b"), ("b", "a")):
            if on == "b":  # the swap: A stops pushing first, then B starts
                _otlp_conf(conf["a"], receiver, interval, False)
                procs["a"].popen.send_signal(signal.SIGHUP)
                _wait(lambda: not _pushing(procs["a"]), "A did not stop pushing after a reload", procs["a"])
                _otlp_conf(conf["b"], receiver, interval, True)
                procs["b"].popen.send_signal(signal.SIGHUP)
            # measured from the second push on: the first two parse every new series prefix (the
            # set grows while the indicators warm up), a one-off of ~0.15 s each at 32 cards
            first = receiver.requests
            _wait(lambda first=first: receiver.requests >= first + warm_pushes, f"no push from {on.upper()}",
                  procs[on], timeout=120.0)
            time.sleep(settle)
            r0, c_on, c_off = receiver.requests, procs[on].cpu(), procs[off].cpu()
            time.sleep(half)
            cpu[f"{on}_on"], cpu[f"{off}_off"] = procs[on].cpu() - c_on, procs[off].cpu() - c_off
            pushes += receiver.requests - r0
        exposition = procs["b"].get()
    finally:
        for p in procs.values():
            p.stop()
    try:
        stages = push_stages(exposition, receiver.url)
    finally:
        receiver.server.shutdown()
    seconds_per_push = float(interval.rstrip("s"))
    d_on, d_off = cpu["a_on"] + cpu["b_on"], cpu["a_off"] + cpu["b_off"]
    crossed = (cpu["a_on"] / cpu["b_off"] * cpu["b_on"] / cpu["a_off"]) ** 0.5 if min(cpu.values()) > 0 else None
    return {"modelled_ratio": 1 + stages["push_thread_ms"] / 1000 / seconds_per_push / (d_off / seconds) if d_off else None,
            "devices": devices, "interval": interval, "seconds": seconds, "pushes": pushes,
            "push_bytes_avg": receiver.bytes / max(receiver.requests, 1),
            "cpu_on_percent": d_on / seconds * 100, "cpu_off_percent": d_off / seconds * 100,
            "ratio": crossed, "halves": {k: round(v, 3) for k, v in cpu.items()}, "stages": stages}


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
