"""The OTLP push's parts: mappings/otel.yaml against the schema and the official semantic
conventions package, docs/otel.md drift, the config section, the converter, the pending slot."""

from __future__ import annotations

import copy
import math
import os
import re
import threading
import time
from pathlib import Path

import pytest
import yaml

from exporter.config import load_config
from exporter.map.schema import load_schema
from exporter.otlp import config as otlp_config
from exporter.otlp.convert import Converter
from exporter.otlp.docs import render as render_docs
from exporter.otlp.naming import OtelMapping, check, load_mapping
from exporter.otlp.pusher import Pusher
from exporter.otlp.stats import PushStats
from exporter.yamlfile import ConfigError
from tests.conftest import REPO

OTEL_YAML = REPO / "mappings" / "otel.yaml"


@pytest.fixture(scope="module")
def schema():
    return load_schema()


@pytest.fixture(scope="module")
def mapping(schema):
    return load_mapping(schema)


def test_docs_otel_md_is_up_to_date(schema, mapping):
    assert (REPO / "docs" / "otel.md").read_text() == render_docs(schema, mapping), \
        "docs/otel.md is stale: run `make docs`"


def test_every_served_metric_has_an_entry_and_a_missing_one_is_an_error(schema):
    data = yaml.safe_load(OTEL_YAML.read_text())
    del data["metrics"]["gpu_power_watts"]
    data["metrics"]["gpu_clock_mhz"] = {"name": "gpu.clock", "attributes": {"nonexistent": "gpu.x"}}
    data["metrics"]["gpu_fan_speed_rpm"] = {"name": "hw.gpu.utilization"}  # same name, unit rpm != 1
    with pytest.raises(ConfigError) as exc:
        check(OtelMapping.model_validate(data), schema)
    msg = str(exc.value)
    assert "gpu_power_watts (canonical.yaml) has no entry" in msg
    assert "gpu_clock_mhz has no label 'nonexistent'" in msg
    assert "hw.gpu.utilization is a gauge in rpm" in msg


def _semconv_definitions() -> dict[str, tuple[str, str]]:
    """name -> (instrument, unit) from the installed opentelemetry-semantic-conventions package."""
    from opentelemetry.semconv._incubating.metrics import hw_metrics

    text = Path(hw_metrics.__file__).read_text()
    out = {}
    for m in re.finditer(r'^HW_\w+: Final = "([^"]+)"\n"""\n.*?\nInstrument: (\w+)\nUnit: (\S+)', text, re.M | re.S):
        out[m.group(1)] = (m.group(2), m.group(3))
    return out


def test_convention_names_have_the_conventions_instrument_and_unit(schema, mapping):
    pytest.importorskip("opentelemetry.semconv", reason="the otlp extra (make install)")
    official = _semconv_definitions()
    assert "hw.gpu.utilization" in official
    used = {(r.name, r.instrument, r.unit) for m in mapping.metrics for r in mapping.rules(m, schema)}
    used.add(("hw.status", "updowncounter", "1"))
    hw = sorted(u for u in used if u[0].startswith("hw."))
    assert len(hw) >= 12
    for name, instrument, unit in hw:
        assert name in official, f"{name} is not in the installed semantic conventions"
        assert official[name] == (instrument, unit), f"{name}: ours {instrument} {unit}, conventions {official[name]}"


def test_the_pinned_semconv_version_has_a_schema_url(mapping):
    schemas = pytest.importorskip("opentelemetry.semconv.schemas", reason="the otlp extra (make install)")
    Schemas = schemas.Schemas  # noqa: N806 - the package's name

    assert mapping.schema_url in {s.value for s in Schemas}


def test_converter_units_attributes_and_start_times(schema, mapping):
    text = (b'gpu_info{vendor="amd",gpu="0",uuid="u1",model="MI300X",driver="6.8",pci_bus_id="x",serial="",'
            b'simulated="false",source="amdgpu"} 1\n'
            b'# TYPE gpu_clock_mhz gauge\n'
            b'gpu_clock_mhz{vendor="amd",gpu="0",uuid="u1",domain="graphics",region="eu-1"} 2100\n'
            b'gpu_engine_utilization_percent{vendor="amd",gpu="0",uuid="u1",engine="decoder"} 50\n'
            b'gpu_engine_utilization_percent{vendor="amd",gpu="0",uuid="u1",engine="video"} 25\n'
            b'gpu_energy_joules_total{vendor="amd",gpu="0",uuid="u1"} 100\n'
            b'gpu_process_memory_bytes{vendor="amd",gpu="0",uuid="u1",pid="42",process="a \\"b\\""} 7\n'
            b'gpu_memory_remapped_rows{vendor="amd",gpu="0",uuid="u1",state="pending"} 1\n')
    conv = Converter(mapping, schema)
    out = conv.convert(text, 1000.0, frozenset({"region"}))
    ident = {"hw.id": "u1", "hw.name": "amd:0", "hw.type": "gpu", "hw.vendor": "amd", "hw.model": "MI300X",
             "hw.driver_version": "6.8"}  # the empty serial is left off
    clock = out.metrics["gpu.clock.frequency"]
    assert clock.unit == "Hz" and dict(next(iter(clock.points))) == {**ident, "gpu.domain": "graphics"}
    assert list(clock.points.values()) == [2100e6]
    util = out.metrics["hw.gpu.utilization"].points
    assert [(dict(a), v) for a, v in util.items()] == [({**ident, "hw.gpu.task": "decoder"}, 0.5)]
    assert list(out.metrics["gpu.engine.utilization"].points.values()) == [0.25]
    proc = out.metrics["gpu.process.memory.usage"]
    assert dict(next(iter(proc.points)))["process.pid"] == 42
    assert dict(next(iter(proc.points)))["process.executable.name"] == 'a "b"'
    status = {dict(a)["hw.state"]: v for a, v in out.metrics["hw.status"].points.items()}
    assert status == {"ok": 0.0, "degraded": 1.0, "failed": 0.0, "predicted_failure": 0.0}
    key = next(k for k in out.start if k[0] == "hw.energy")
    assert out.start[key] == 1000.0
    # a later cycle keeps the start; a counter that went down starts again
    again = conv.convert(text, 1015.0, frozenset({"region"}))
    assert again.start[key] == 1000.0
    reset = conv.convert(text.replace(b"} 100\n", b"} 3\n"), 1030.0, frozenset({"region"}))
    assert reset.start[key] == 1030.0


def _write(tmp: Path, body: str) -> Path:
    p = tmp / "config.yml"
    p.write_text(body)
    return p


def test_config_headers_file_tls_and_timeouts(tmp_path):
    pytest.importorskip(otlp_config.PROTOCOL_MODULES["http/protobuf"], reason="the otlp extra (make install)")
    headers = tmp_path / "h"
    headers.write_text("Authorization: Bearer x\n# comment\n\nX-Tenant: a\n")
    cfg = load_config(_write(tmp_path, f"exporters:\n  otlp:\n    enabled: true\n    headers_file: {headers}\n"))
    assert cfg.exporters.otlp.headers == {"authorization": "Bearer x", "x-tenant": "a"}
    assert cfg.exporters.otlp.url == "http://localhost:4318/v1/metrics"
    link = tmp_path / "link"
    os.symlink(headers, link)
    with pytest.raises(ConfigError, match="symbolic link"):
        load_config(_write(tmp_path, f"exporters:\n  otlp:\n    enabled: true\n    headers_file: {link}\n"))
    headers.write_text("Authorization Bearer s3cret\n")
    with pytest.raises(ConfigError) as exc:
        load_config(_write(tmp_path, f"exporters:\n  otlp:\n    enabled: true\n    headers_file: {headers}\n"))
    assert "not a 'Name: value' header line" in str(exc.value) and "s3cret" not in str(exc.value)
    with pytest.raises(ConfigError, match="must not exceed interval"):
        load_config(_write(tmp_path, "exporters:\n  otlp:\n    interval: 5s\n    timeout: 10s\n"))
    with pytest.raises(ConfigError, match="cert_file and key_file go together"):
        load_config(_write(tmp_path, f"exporters:\n  otlp:\n    tls: {{cert_file: {headers}}}\n"))


def test_enabled_without_the_package_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.setitem(otlp_config.PROTOCOL_MODULES, "grpc", "opentelemetry_not_installed.metric_exporter")
    path = _write(tmp_path, "exporters:\n  otlp:\n    enabled: true\n    protocol: grpc\n")
    with pytest.raises(ConfigError, match=r"not installed \(the otlp extra"):
        load_config(path)
    load_config(_write(tmp_path, "exporters:\n  otlp:\n    enabled: false\n    protocol: grpc\n"))  # off: fine


class _Cycle:
    failed = False

    def __init__(self, text: bytes) -> None:
        self.text, self.at = text, time.time()


def test_one_pending_cycle_older_ones_dropped_and_counted(schema, mapping, tmp_path):
    """While the push thread is held in an export (a receiver that does not answer), offers
    replace the one pending cycle and count each replaced one; offer never waits."""
    pytest.importorskip("opentelemetry.proto", reason="the otlp extra (make install)")
    from tests.otlp_receiver import OtlpReceiver

    cfg = copy.deepcopy(load_config(_write(tmp_path, "exporters:\n  otlp:\n    enabled: true\n"
                                                     "    interval: 5s\n    timeout: 5s\n")).exporters.otlp)
    stats = PushStats()
    with OtlpReceiver() as receiver:
        receiver.hold = threading.Event()
        cfg.endpoint = receiver.url
        pusher = Pusher(cfg, mapping, schema, lambda static: {"service.name": "t"}, stats)
        cycle = _Cycle(b'gpu_power_watts{vendor="nvidia",gpu="0",uuid="u"} 10\n')
        assert pusher.offer(cycle, ())
        assert receiver.waiting.wait(10)  # the thread is inside the export now
        assert not pusher.offer(cycle, ())  # not due yet (interval)
        for _ in range(3):
            pusher._next_due = 0.0  # due again at once (the interval is what the test skips)
            t0 = time.monotonic()
            assert pusher.offer(_Cycle(cycle.text), ())
            assert time.monotonic() - t0 < 1.0  # generous: offer takes a lock and returns
        assert stats.dropped == 2  # three offers, one slot: two replaced
        receiver.hold.set()
        assert pusher.pushed.wait(10)
        pusher.close(wait=10)
    assert stats.success >= 1
    assert stats.success + stats.failure == 2  # the first cycle and the last pending one


def test_encoder_makes_the_request_the_sdk_encoder_makes(schema, mapping):
    """The push's encoder against the official one, on a live-like exposition (every kind of
    instrument, a histogram included, integer attributes, reused attribute sets)."""
    pytest.importorskip("opentelemetry.exporter.otlp.proto.common", reason="the otlp extra (make install)")
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

    from exporter.otlp import sdk
    from exporter.otlp.encode import Encoder

    dev = 'vendor="nvidia",gpu="0",uuid="GPU-1"'
    text = (f'gpu_info{{{dev},model="H100",driver="550",pci_bus_id="p",serial="S",simulated="false",'
            f'source="nvml"}} 1\n'
            f'gpu_power_watts{{{dev}}} 0\n'
            f'gpu_energy_joules_total{{{dev}}} 123.5\n'
            f'gpu_memory_used_bytes{{{dev}}} 1e9\n'
            f'gpu_process_memory_bytes{{{dev},pid="7",process="python"}} 42\n'
            f'gpu_kernel_execution_time_milliseconds_bucket{{{dev},kernel="k",le="1.0"}} 2\n'
            f'gpu_kernel_execution_time_milliseconds_bucket{{{dev},kernel="k",le="10.0"}} 5\n'
            f'gpu_kernel_execution_time_milliseconds_bucket{{{dev},kernel="k",le="+Inf"}} 6\n'
            f'gpu_kernel_execution_time_milliseconds_sum{{{dev},kernel="k"}} 30.5\n'
            f'gpu_kernel_execution_time_milliseconds_count{{{dev},kernel="k"}} 6\n').encode()
    conv = Converter(mapping, schema)
    enc = Encoder()
    for at in (1000.0, 1015.0):  # the second push reuses the encoded attribute sets
        out = conv.convert(text, at)
        ours = enc.request(out, {"service.name": "x", "host.name": "h"}, mapping.schema_url)
        ref = encode_metrics(sdk.metrics_data(out, {"service.name": "x", "host.name": "h"}, mapping.schema_url))
        assert ours.SerializeToString() == ref.SerializeToString()
    hist = out.metrics["gpu.kernel.execution.duration"]
    assert hist.unit == "s"
    ((buckets, total, count),) = hist.hist.values()
    assert buckets == {0.001: 2.0, 0.01: 5.0, math.inf: 6.0} and total == pytest.approx(0.0305) and count == 6


def test_grpc_protocol_pushes_to_a_grpc_receiver(schema, mapping, tmp_path):
    grpc = pytest.importorskip("grpc", reason="grpcio (the otlp extra)")
    from concurrent import futures

    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc

    got: list = []
    arrived = threading.Event()

    class Service(metrics_service_pb2_grpc.MetricsServiceServicer):
        def Export(self, request, context):  # noqa: N802 - the service's name
            got.append((dict(context.invocation_metadata()), request))
            arrived.set()
            return metrics_service_pb2.ExportMetricsServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        headers = tmp_path / "h"
        headers.write_text("X-Tenant: a\n")
        cfg = load_config(_write(tmp_path, f"exporters:\n  otlp:\n    enabled: true\n    protocol: grpc\n"
                                           f"    endpoint: http://127.0.0.1:{port}\n    headers_file: {headers}\n"
                                           "    interval: 5s\n    timeout: 5s\n")).exporters.otlp
        stats = PushStats()
        pusher = Pusher(cfg, mapping, schema, lambda static: {"service.name": "t"}, stats)
        assert pusher.offer(_Cycle(b'gpu_power_watts{vendor="intel",gpu="0",uuid="u"} 10\n'), ())
        assert arrived.wait(15), "no gRPC export arrived"
        assert pusher.pushed.wait(15)
        pusher.close(wait=5)
    finally:
        server.stop(0)
    assert stats.success == 1 and stats.failure == 0
    meta, req = got[0]
    assert meta["x-tenant"] == "a"
    names = {m.name: m for rm in req.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert names["hw.power"].unit == "W" and names["hw.power"].gauge.data_points[0].as_double == 10.0
    assert set(names) == {"hw.power"}  # no gpu_info in this cycle: no hw.status either
