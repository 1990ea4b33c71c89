"""The OTLP push's parts: mappings/otel.yaml against the schema and the official semantic
conventions package, docs/otel.md drift, the config section, the converter, the pending slot."""

from __future__ import annotations

import copy
import logging
import math
import os
import re
import socket
import sys
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
from exporter.render.otlp_stats import PushStats
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


def test_the_guide_states_the_pinned_semconv_version_and_links_the_alert(mapping):
    guide = (REPO / "docs" / "otel-guide.md").read_text()
    stated = re.findall(r"semantic conventions (\d+\.\d+\.\d+)", guide)
    urls = re.findall(r"https://opentelemetry\.io/schemas/(\d+\.\d+\.\d+)", guide)
    assert stated and urls
    assert set(stated) | set(urls) == {mapping.semconv}, "docs/otel-guide.md states another semconv version"
    rules = re.search(r"`(deploy/prometheus/otlp/[^`]+\.yml)`", guide)
    assert rules and (REPO / rules.group(1)).is_file()


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


def _sums(metric) -> dict:  # noqa: ANN001 - a convert.MetricOut
    """{(hw.id, the point's attributes other than hw.id and the identity): value}."""
    return {tuple((k, v) for k, v in a if not k.startswith("hw.")): v for a, v in metric.points.items()}


def test_a_convention_metric_has_the_whole_gpu_and_its_parts_are_ours(schema, mapping):
    """AMD ECC counts come as GPU totals and per RAS block, NVIDIA memory for the GPU and per MIG
    instance, AMD power for the board and the gfx domain: each hw.* metric gets the totals only
    (its points of a GPU add up to the GPU), the parts go to the gpu.* name without hw."""
    amd, nv = 'vendor="amd",gpu="0",uuid="A"', 'vendor="nvidia",gpu="0",uuid="N"'
    text = "".join(f"{line}\n" for line in [
        f'gpu_ecc_errors_total{{{amd},severity="corrected"}} 7',
        f'gpu_ecc_errors_total{{{amd},severity="uncorrected"}} 2',
        f'gpu_ecc_errors_total{{{amd},severity="deferred"}} 1',
        f'gpu_ecc_errors_total{{{amd},severity="corrected",block="umc"}} 5',
        f'gpu_ecc_errors_total{{{amd},severity="corrected",block="gfx"}} 2',
        f'gpu_ecc_errors_total{{{amd},severity="uncorrected",block="umc"}} 2',
        f'gpu_power_watts{{{amd}}} 500',
        f'gpu_power_watts{{{amd},domain="gfx"}} 300',
        f'gpu_memory_used_bytes{{{nv}}} 30',
        f'gpu_memory_used_bytes{{{nv},gpu_instance="1",compute_instance="0",mig_profile="3g.40gb"}} 10',
        f'gpu_memory_used_bytes{{{nv},gpu_instance="2",compute_instance="0",mig_profile="3g.40gb"}} 20',
        f'gpu_memory_total_bytes{{{nv}}} 80',
        f'gpu_memory_total_bytes{{{nv},gpu_instance="1",compute_instance="0",mig_profile="3g.40gb"}} 40',
        f'gpu_xid_errors_total{{{nv},xid="48"}} 1',
        f'gpu_pcie_replays_total{{{nv}}} 3',
        f'gpu_interconnect_errors_total{{{nv},interconnect="nvlink",type="crc_flit"}} 4',
    ]).encode()
    out = Converter(mapping, schema).convert(text, 1000.0).metrics
    assert _sums(out["hw.errors"]) == {(("error.type", "corrected"),): 7.0, (("error.type", "uncorrected"),): 2.0,
                                       (("error.type", "deferred"),): 1.0}
    assert sum(out["hw.errors"].points.values()) == 10.0  # no block counted twice, no XID, no replay
    assert _sums(out["gpu.errors"]) == {
        (("error.type", "corrected"), ("gpu.ras.block", "gfx")): 2.0,
        (("error.type", "corrected"), ("gpu.ras.block", "umc")): 5.0,
        (("error.type", "uncorrected"), ("gpu.ras.block", "umc")): 2.0}
    assert list(out["hw.power"].points.values()) == [500.0]
    assert _sums(out["gpu.power"]) == {(("gpu.power.domain", "gfx"),): 300.0}
    assert list(out["hw.gpu.memory.usage"].points.values()) == [30.0]
    assert list(out["hw.gpu.memory.limit"].points.values()) == [80.0]
    assert sorted(dict(a)["gpu.mig.gpu_instance"] for a in out["gpu.memory.usage"].points) == ["1", "2"]
    assert out["gpu.memory.usage"].instrument == "updowncounter" and out["gpu.memory.usage"].unit == "By"
    assert list(out["gpu.memory.limit"].points.values()) == [40.0]
    assert _sums(out["gpu.xid.errors"]) == {(("gpu.xid", "48"),): 1.0}
    assert list(out["gpu.pcie.replays"].points.values()) == [3.0]
    assert _sums(out["gpu.interconnect.errors"]) == {(("error.type", "crc_flit"), ("gpu.interconnect", "nvlink")): 4.0}


def test_a_convention_rule_that_takes_a_part_is_refused(schema):
    data = yaml.safe_load(OTEL_YAML.read_text())
    data["metrics"]["gpu_memory_used_bytes"] = {"name": "hw.gpu.memory.usage", "instrument": "updowncounter"}
    data["metrics"]["gpu_power_watts"] = [{"without": ["domain"], "name": "hw.power"}, {"name": "hw.power"}]
    with pytest.raises(ConfigError) as exc:
        check(OtelMapping.model_validate(data), schema)
    msg = str(exc.value)
    assert ("metrics.gpu_memory_used_bytes: hw.gpu.memory.usage is a convention metric, for the whole GPU: leave "
            "the series of a part out (without: ['compute_instance', 'gpu_instance', 'mig_profile'])") in msg
    assert "metrics.gpu_power_watts[1]: hw.power is a convention metric" in msg
    assert "metrics.gpu_power_watts[0]" not in msg


def test_resource_attributes_precedence():
    from exporter.otlp.resource import resource_attributes

    static = (("cluster", "c1"), ("cloud", "aws"), ("region", "us-east-1"), ("zone", "us-east-1a"))
    env = {"NODE_NAME": "node-env", "POD_NAME": "p", "POD_NAMESPACE": "ns"}
    out = resource_attributes(static, {"cloud", "region", "zone"}, environ=env)
    assert out["host.name"] == out["k8s.node.name"] == "node-env"
    assert (out["cloud.provider"], out["cloud.region"], out["cloud.availability_zone"]) == ("aws", "us-east-1",
                                                                                          "us-east-1a")
    assert out["cluster"] == "c1" and not {"cloud", "region", "zone"} & set(out)
    out = resource_attributes(static, {"cloud"}, node_name="node-cfg", environ=env,
                              configured={"host.name": "mine"})
    assert out["k8s.node.name"] == "node-cfg" and out["host.name"] == "mine"  # configured attributes win
    assert out["region"] == "us-east-1"  # a static label the cloud enricher did not add keeps its name
    out = resource_attributes((), environ={})
    assert out["host.name"] == socket.gethostname() and "k8s.node.name" not in out  # not on Kubernetes


def _write(tmp: Path, body: str) -> Path:
    p = tmp / "config.yml"
    p.write_text(body)
    return p


def test_config_headers_file_tls_and_timeouts(tmp_path):
    pytest.importorskip(otlp_config.PROTOCOL_MODULES["http/protobuf"][0], reason="the otlp extra (make install)")
    headers = tmp_path / "h"
    headers.write_text("Authorization: Bearer x\n# comment\n\nX-Tenant: a\n")
    with pytest.raises(ConfigError, match=r"config.yml:2: exporters.otlp: headers_file with the plaintext endpoint "
                                          r"http://localhost:4318/v1/metrics: the headers \(credentials\) would "
                                          r"travel unencrypted.*set allow_plaintext: true"):
        load_config(_write(tmp_path, f"exporters:\n  otlp:\n    enabled: true\n    headers_file: {headers}\n"))
    plain = "    allow_plaintext: true\n"
    cfg = load_config(_write(tmp_path, f"exporters:\n  otlp:\n    enabled: true\n    headers_file: {headers}\n{plain}"))
    assert cfg.exporters.otlp.headers == {"authorization": "Bearer x", "x-tenant": "a"}
    assert cfg.exporters.otlp.url == "http://localhost:4318/v1/metrics"
    link = tmp_path / "link"
    os.symlink(headers, link)
    with pytest.raises(ConfigError, match="symbolic link"):
        load_config(_write(tmp_path, f"exporters:\n  otlp:\n    enabled: true\n    headers_file: {link}\n{plain}"))
    headers.write_text("Authorization Bearer s3cret\n")
    with pytest.raises(ConfigError) as exc:
        load_config(_write(tmp_path, f"exporters:\n  otlp:\n    enabled: true\n    headers_file: {headers}\n{plain}"))
    assert "not a 'Name: value' header line" in str(exc.value) and "s3cret" not in str(exc.value)
    with pytest.raises(ConfigError, match="must not exceed interval"):
        load_config(_write(tmp_path, "exporters:\n  otlp:\n    interval: 5s\n    timeout: 10s\n"))
    with pytest.raises(ConfigError, match="cert_file and key_file go together"):
        load_config(_write(tmp_path, f"exporters:\n  otlp:\n    tls: {{cert_file: {headers}}}\n"))


@pytest.mark.parametrize("protocol, blocked, extra", [
    ("grpc", "opentelemetry.exporter.otlp.proto.grpc", "otlp-grpc"),  # the otlp extra alone
    ("grpc", "grpc", "otlp-grpc"),
    ("http/protobuf", "opentelemetry.exporter.otlp.proto.http", "otlp"),
])
def test_enabled_without_the_extra_is_a_config_error_naming_it(tmp_path, monkeypatch, protocol, blocked, extra):
    """The extra's package simulated missing the way Python marks a module unavailable (None in
    sys.modules: an import of it, or of anything under it, raises ModuleNotFoundError)."""
    pytest.importorskip(otlp_config.PROTOCOL_MODULES[protocol][0], reason="the otlp extras (make install)")
    for name in [m for m in sys.modules if m == blocked or m.startswith(blocked + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, blocked, None)
    path = _write(tmp_path, f"exporters:\n  otlp:\n    enabled: true\n    protocol: {protocol}\n")
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert f"install the {extra} extra (pip install 'unified-gpu-exporter[{extra}]')" in str(exc.value)
    assert "config.yml:2: exporters.otlp" in str(exc.value)
    load_config(_write(tmp_path, f"exporters:\n  otlp:\n    enabled: false\n    protocol: {protocol}\n"))  # off: fine


class _Cycle:
    failed = False

    def __init__(self, text: bytes) -> None:
        self.text, self.at = text, time.time()


@pytest.mark.needs_extra("otlp")
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


def test_failure_reason_is_the_most_specific_message_of_the_push():
    """The SDK ends a failed push with a summary that says nothing of the cause; the transport's
    own record wins, then the last message that is not a summary (gRPC's error details)."""
    from exporter.otlp.pusher import _Reasons

    why = _Reasons(keep=3)
    log = logging.getLogger("test.otlp.reasons")
    log.addHandler(why)
    log.propagate = False
    try:
        log.warning("Transient error %s encountered while exporting %s batch, retrying in %.2fs.",
                    "SSLError(CERTIFICATE_VERIFY_FAILED)", "metrics", 1.0)
        for i in range(3):
            log.warning("Transient error %s encountered while exporting metrics batch, retrying in 2s.", f"try {i}")
        log.error("Failed to export %s batch due to timeout, max retries or shutdown.", "metrics")
        summary = "Failed to export metrics batch due to timeout, max retries or shutdown."
        assert len(why.messages) == 3 and why.messages[-1] == summary  # bounded, the last one kept
        assert why.reason() == f"Transient error try 0 encountered while exporting metrics batch, retrying in 2s. " \
                               f"({summary})"
        assert why.reason("SSLError: [SSL: CERTIFICATE_VERIFY_FAILED]") == \
            f"SSLError: [SSL: CERTIFICATE_VERIFY_FAILED] ({summary})"
        why.messages = [summary]  # the timeout came before any retry: only the summary
        assert why.reason() == summary
        why.messages = []
        assert why.reason() == "the receiver did not accept the push"
        why.messages = ["Failed to export metrics to h:4317, error code: StatusCode.UNAVAILABLE, error details: x"]
        assert why.reason() == why.messages[0]
    finally:
        log.removeHandler(why)


@pytest.mark.needs_extra("otlp")
def test_an_unchanged_reload_keeps_the_pusher(schema, mapping, tmp_path):
    """The same section (read again from the file), headers file, names and schema: the running
    pusher stays, with its start times and logged state; its resource follows the new config."""
    from exporter.otlp.hook import OtlpOutput
    from exporter.render.otlp_stats import STATS

    headers = tmp_path / "h"
    headers.write_text("X-Tenant: a\n")
    body = f"exporters:\n  otlp:\n    enabled: true\n    headers_file: {headers}\n    allow_plaintext: true\n"
    out = OtlpOutput()
    try:
        out.configure(load_config(_write(tmp_path, body)), schema, mapping)
        first = out.pusher
        out.configure(load_config(_write(tmp_path, body)), load_schema(), load_mapping(load_schema()))
        assert out.pusher is first
        headers.write_text("X-Tenant: b\n")  # the same section, another header value
        out.configure(load_config(_write(tmp_path, body)), schema, mapping)
        assert out.pusher is not first and first._closing
        second = out.pusher
        out.configure(load_config(_write(tmp_path, body.replace("enabled: true", "enabled: true\n    interval: 30s"))),
                      schema, mapping)
        assert out.pusher is not second
        third = out.pusher
        third._closing = True  # closed (a stop under way): a reload makes a new one
        out.configure(load_config(_write(tmp_path, body)), schema, mapping)
        assert out.pusher is not third
    finally:
        out.close()
        STATS.enabled = False


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


def test_the_public_export_path_sends_the_same_bytes(schema, mapping, monkeypatch):
    """Where the exporter has no batch path (``sdk.batch_path`` None: an SDK version without
    ``_export_batch``), ``send`` falls back to the public ``export(MetricsData)`` with the SDK's
    encoder: the receiver gets the same request body either way."""
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otlp extra (make install)")
    from exporter.otlp import sdk
    from exporter.otlp.config import OtlpConfig
    from exporter.otlp.encode import Encoder
    from exporter.otlp.transport import make_exporter
    from tests.otlp_receiver import OtlpReceiver

    dev = 'vendor="amd",gpu="0",uuid="A"'
    text = (f'gpu_info{{{dev},model="MI300X",driver="6.8",pci_bus_id="p",serial="S",simulated="false",'
            f'source="amdgpu"}} 1\ngpu_energy_joules_total{{{dev}}} 12.5\ngpu_power_watts{{{dev}}} 300\n'
            f'gpu_process_memory_bytes{{{dev},pid="7",process="python"}} 42\n').encode()
    conv = Converter(mapping, schema).convert(text, 1000.0)
    resource = {"service.name": "x"}
    with OtlpReceiver() as receiver:
        exporter = make_exporter(OtlpConfig(endpoint=receiver.url))
        try:
            assert sdk.batch_path(exporter.sdk) is not None  # the pinned SDK has the fast path
            assert sdk.send(exporter.sdk, Encoder(), conv, resource, mapping.schema_url, 5.0)
            monkeypatch.setattr(sdk, "batch_path", lambda exporter: None)
            assert sdk.send(exporter.sdk, Encoder(), conv, resource, mapping.schema_url, 5.0)
        finally:
            exporter.shutdown()
        assert len(receiver.bodies) == 2
        assert receiver.bodies[0] == receiver.bodies[1]
        assert receiver.requests[0][1].resource_metrics[0].scope_metrics[0].metrics


@pytest.mark.needs_extra("otlp-grpc")
def test_grpc_protocol_pushes_to_a_grpc_receiver(schema, mapping, tmp_path):
    from concurrent import futures

    import grpc
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
                                           "    allow_plaintext: true\n"
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
