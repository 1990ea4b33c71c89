"""End to end: the real daemon (simulated node, one GPU of each vendor) pushes OTLP/HTTP to a
receiver that decodes it with opentelemetry-proto; the push is checked against /metrics of the same
cycle, and a down or slow receiver is shown to cost the scrape path nothing."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.proto", reason="pip install opentelemetry-proto (make install)")
pytestmark = pytest.mark.needs_extra("otlp")  # the daemons push: the SDK and its exporter

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from exporter.map.schema import load_schema  # noqa: E402
from exporter.otlp.naming import load_mapping  # noqa: E402
from tests.e2e_util import ProcessSet, free_port, http_get, start_exporter, wait_until  # noqa: E402
from tests.otlp_receiver import OtlpReceiver  # noqa: E402

CUMULATIVE = 2  # opentelemetry.proto.metrics.v1.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
SEMCONV_URL = load_mapping(load_schema()).schema_url  # the version pinned in mappings/otel.yaml


def _config(tmp: Path, endpoint: str, interval: str = "1s", timeout: str = "1s", extra: str = "") -> Path:
    headers = tmp / "otlp-headers"
    headers.write_text("# a secret\nAuthorization: Bearer t0ken-for-test\nX-Scope-OrgID: team-a\n")
    headers.chmod(0o600)
    conf = tmp / "config.yml"
    conf.write_text(f"""
labels: {{cluster: lab-1}}
{extra}
exporters:
  otlp:
    enabled: true
    endpoint: {endpoint}
    interval: {interval}
    timeout: {timeout}
    headers_file: {headers}
    allow_plaintext: true
    resource_attributes: {{deployment.environment.name: test}}
""")
    return conf


def _value(v) -> object:  # noqa: ANN001 - an AnyValue
    return getattr(v, v.WhichOneof("value"))


def _attrs(kvs) -> dict:  # noqa: ANN001
    return {kv.key: _value(kv.value) for kv in kvs}


def _pushed(req) -> tuple[dict, dict]:  # noqa: ANN001
    """(resource attributes, {metric name: metric}) of one request."""
    (rm,) = req.resource_metrics
    metrics = {}
    for sm in rm.scope_metrics:
        assert sm.schema_url == SEMCONV_URL
        for m in sm.metrics:
            assert m.name not in metrics, f"{m.name} twice in one push"
            metrics[m.name] = m
    assert rm.schema_url == SEMCONV_URL
    return _attrs(rm.resource.attributes), metrics


def _points(m) -> list:  # noqa: ANN001
    return list(getattr(m, m.WhichOneof("data")).data_points)


def _find(m, **want) -> tuple[dict, float]:  # noqa: ANN001
    hits = [(a, p) for p in _points(m) if all((a := _attrs(p.attributes)).get(k) == v for k, v in want.items())]
    assert len(hits) == 1, f"{m.name} {want}: {len(hits)} points"
    a, p = hits[0]
    return a, p.as_double


def _scrape(server) -> dict[tuple[str, frozenset], float]:  # noqa: ANN001
    body = http_get(server.url + "/metrics").text
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(body) for s in fam.samples}


def _prom(samples: dict, name: str, **labels) -> float:
    hits = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    assert len(hits) == 1, f"{name} {labels}: {len(hits)} series in /metrics"
    return hits[0]


def _same_cycle(receiver: OtlpReceiver, server) -> tuple[dict, object, dict]:  # noqa: ANN001
    """A push and a scrape of the same rendered cycle: the energy counters (which advance at
    every poll) of every GPU agree.  Without indicators the daemon renders once per poll."""
    for _ in range(10):
        n = len(receiver.requests)
        got = receiver.wait_for(n + 1, 20)
        assert len(got) > n, "no push arrived"
        prom = _scrape(server)
        headers, req = got[-1]
        energy = {_attrs(p.attributes)["hw.id"]: p.as_double for rm in req.resource_metrics
                  for sm in rm.scope_metrics for m in sm.metrics if m.name == "hw.energy" for p in _points(m)}
        scraped = {dict(ls)["uuid"]: v for (name, ls), v in prom.items() if name == "gpu_energy_joules_total"}
        if energy and energy == scraped and len(receiver.requests) == len(got):
            return headers, req, prom
    raise AssertionError("no push matched a scrape of the same cycle in 10 cycles")


def test_push_matches_metrics_of_the_same_cycle(tmp_path):
    conf = _config(tmp_path, "RECEIVER", extra="indicators: {enabled: false}")
    with OtlpReceiver() as receiver, ProcessSet() as procs:
        conf.write_text(conf.read_text().replace("RECEIVER", receiver.url))
        server = start_exporter(procs, tmp_path, ["--simulate", "--config.file", str(conf), "--poll.interval", "2s"])
        receiver.wait_for(2, 20)  # rates (Intel's utilization) need a second poll
        headers, req, prom = _same_cycle(receiver, server)
    assert headers["authorization"] == "Bearer t0ken-for-test" and headers["x-scope-orgid"] == "team-a"
    resource, metrics = _pushed(req)
    assert resource["service.name"] == "unified-gpu-exporter" and resource["host.name"]
    assert resource["cluster"] == "lab-1" and resource["deployment.environment.name"] == "test"
    infos = {dict(ls)["vendor"]: dict(ls) for (n, ls), _ in prom.items() if n == "gpu_info" and dict(ls)["gpu"] == "0"}
    assert set(infos) == {"nvidia", "amd", "intel"}
    for vendor, info in infos.items():
        uuid = info["uuid"]
        dev = {"vendor": vendor, "gpu": "0"}
        identity = {"hw.id": uuid, "hw.name": f"{vendor}:0", "hw.type": "gpu", "hw.vendor": vendor,
                    "hw.model": info["model"], "hw.driver_version": info["driver"],
                    "hw.serial_number": info["serial"]}

        m = metrics["hw.gpu.utilization"]
        assert (m.unit, m.WhichOneof("data")) == ("1", "gauge")
        attrs, v = _find(m, **{"hw.id": uuid, "hw.gpu.task": "general"})
        assert attrs == {**identity, "hw.gpu.task": "general"}  # the whole attribute set, no label left over
        assert v == pytest.approx(_prom(prom, "gpu_compute_utilization_percent", **dev) / 100, rel=1e-12)

        m = metrics["hw.gpu.memory.utilization"]
        assert m.unit == "1"
        assert _find(m, **{"hw.id": uuid})[1] == pytest.approx(
            _prom(prom, "gpu_memory_utilization_percent", **dev) / 100, rel=1e-12)
        for otel, canonical in (("hw.gpu.memory.usage", "gpu_memory_used_bytes"),
                                ("hw.gpu.memory.limit", "gpu_memory_total_bytes")):
            m = metrics[otel]
            assert (m.unit, m.WhichOneof("data")) == ("By", "sum")
            assert not m.sum.is_monotonic and m.sum.aggregation_temporality == CUMULATIVE
            assert _find(m, **{"hw.id": uuid}) == (identity, _prom(prom, canonical, **dev))

        m = metrics["hw.power"]
        assert (m.unit, m.WhichOneof("data")) == ("W", "gauge")
        assert _find(m, **{"hw.id": uuid}) == (identity, _prom(prom, "gpu_power_watts", **dev))
        m = metrics["hw.energy"]
        assert (m.unit, m.WhichOneof("data")) == ("J", "sum")
        assert m.sum.is_monotonic and m.sum.aggregation_temporality == CUMULATIVE
        assert _find(m, **{"hw.id": uuid}) == (identity, _prom(prom, "gpu_energy_joules_total", **dev))
        (p,) = [p for p in _points(m) if _attrs(p.attributes)["hw.id"] == uuid]
        assert 0 < p.start_time_unix_nano <= p.time_unix_nano

        m = metrics["hw.temperature"]
        assert (m.unit, m.WhichOneof("data")) == ("Cel", "gauge")
        sensors = {dict(ls)["sensor"]: v for (n, ls), v in prom.items()
                   if n == "gpu_temperature_celsius" and {("vendor", vendor), ("gpu", "0")} <= ls}
        assert sensors
        for sensor, value in sensors.items():
            attrs, v = _find(m, **{"hw.id": f"{uuid}/temperature/{sensor}"})
            assert attrs == {"hw.id": f"{uuid}/temperature/{sensor}", "hw.type": "temperature",
                             "hw.parent": uuid, "hw.name": f"{vendor}:0 temperature {sensor}",
                             "hw.sensor_location": sensor}
            assert v == value

        m = metrics["hw.status"]
        assert m.unit == "1" and m.WhichOneof("data") == "sum" and not m.sum.is_monotonic
        states = {_attrs(p.attributes)["hw.state"]: p.as_double for p in _points(m)
                  if _attrs(p.attributes)["hw.id"] == uuid}
        assert states == {"ok": 1.0, "degraded": 0.0, "failed": 0.0, "predicted_failure": 0.0}

        # ours: no convention covers bandwidth utilization
        m = metrics["gpu.memory.bandwidth.utilization"]
        assert m.unit == "1"
        if vendor == "intel":  # the demo's Intel GPU reports no memory bandwidth: nor does the push
            assert not [n for (n, ls), _ in prom.items() if n == "gpu_memory_bandwidth_utilization_percent"
                        and ("vendor", "intel") in ls]
            assert not [p for p in _points(m) if _attrs(p.attributes)["hw.id"] == uuid]
        else:
            assert _find(m, **{"hw.id": uuid}) == (identity, pytest.approx(
                _prom(prom, "gpu_memory_bandwidth_utilization_percent", **dev) / 100, rel=1e-12))

        pcie = {dict(ls)["direction"]: v for (n, ls), v in prom.items()
                if n == "gpu_pcie_bytes_total" and {("vendor", vendor), ("gpu", "0")} <= ls}
        for direction, value in pcie.items():
            m = metrics["hw.gpu.io"]
            assert m.unit == "By" and m.sum.is_monotonic and m.sum.aggregation_temporality == CUMULATIVE
            otel_dir = {"tx": "transmit", "rx": "receive"}[direction]
            assert _find(m, **{"hw.id": uuid, "network.io.direction": otel_dir}) == (
                {**identity, "network.io.direction": otel_dir}, value)
    # the static label is on the resource, not on the points
    assert not any("cluster" in _attrs(p.attributes) for m in metrics.values() for p in _points(m))
    # a convention metric has the whole GPU only: the points of one hw.id differ in their values of
    # the same attributes (task, direction, error.type, state), never in which attributes they have
    for name, m in metrics.items():
        if name.startswith("hw."):
            keys: dict[str, set] = {}
            for p in _points(m):
                a = _attrs(p.attributes)
                keys.setdefault(a["hw.id"], set()).add(frozenset(a))
            assert all(len(v) == 1 for v in keys.values()), (name, keys)
    if "hw.errors" in metrics:
        assert {_attrs(p.attributes)["error.type"] for p in _points(metrics["hw.errors"])} <= {
            "corrected", "uncorrected", "deferred"}
    # every GPU of the node has its status
    assert len({_attrs(p.attributes)["hw.id"] for p in _points(metrics["hw.status"])}) == len(
        [1 for (n, _), _ in prom.items() if n == "gpu_info"])


class _GcpMetadata:
    """GCP's instance metadata service, as much of it as the cloud enricher reads."""

    ITEMS = {"id": "4520031799277581759", "zone": "projects/123456/zones/europe-west4-a",
             "machine-type": "projects/123456/machineTypes/a2-highgpu-1g"}

    def __init__(self) -> None:
        items = self.ITEMS

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                name = self.path.rsplit("/", 1)[-1]
                if self.headers.get("Metadata-Flavor") != "Google" or name not in items:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = items[name].encode()
                self.send_response(200)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_resource_from_the_cloud_enricher_and_the_kubernetes_environment(tmp_path, monkeypatch):
    """The daemon as the DaemonSet runs it (the downward API's NODE_NAME, POD_NAME, POD_NAMESPACE;
    a container host name that is the pod's), on a GCP instance: the resource carries the cloud
    identity and the Kubernetes placement, host.name is the node's name, and the cloud labels
    are on no point."""
    gcp = _GcpMetadata()
    extra = (f"enrich:\n  cloud:\n    providers: [gcp]\n    endpoints: {{gcp: {gcp.url}}}\n"
             "indicators: {enabled: false}")
    monkeypatch.setenv("NODE_NAME", "gpu-node-7")
    monkeypatch.setenv("POD_NAME", "unified-gpu-exporter-x2v9k")
    monkeypatch.setenv("POD_NAMESPACE", "monitoring")
    try:
        with OtlpReceiver() as receiver, ProcessSet() as procs:
            conf = _config(tmp_path, receiver.url, extra=extra)
            start_exporter(procs, tmp_path, ["--simulate", "--config.file", str(conf), "--poll.interval", "1s"])
            # the cloud labels come with a render after the metadata answered
            wait_until(lambda: any(_pushed(req)[0].get("cloud.provider") for _, req in receiver.requests), 30,
                       what="a push with the cloud identity")
            req = next(req for _, req in receiver.requests if _pushed(req)[0].get("cloud.provider"))
    finally:
        gcp.close()
    resource, metrics = _pushed(req)
    assert {k: resource[k] for k in ("cloud.provider", "cloud.region", "cloud.availability_zone", "host.type",
                                      "host.id", "k8s.node.name", "host.name", "k8s.pod.name",
                                      "k8s.namespace.name", "cluster", "deployment.environment.name")} == {
        "cloud.provider": "gcp", "cloud.region": "europe-west4", "cloud.availability_zone": "europe-west4-a",
        "host.type": "a2-highgpu-1g", "host.id": "4520031799277581759", "k8s.node.name": "gpu-node-7",
        "host.name": "gpu-node-7", "k8s.pod.name": "unified-gpu-exporter-x2v9k", "k8s.namespace.name": "monitoring",
        "cluster": "lab-1", "deployment.environment.name": "test"}
    assert not {"cloud", "region", "zone", "instance_type", "instance_id"} & {
        k for m in metrics.values() for p in _points(m) for k in _attrs(p.attributes)}


def _energy_starts(req) -> dict:  # noqa: ANN001
    return {_attrs(p.attributes)["hw.id"]: p.start_time_unix_nano for rm in req.resource_metrics
            for sm in rm.scope_metrics for m in sm.metrics if m.name == "hw.energy" for p in _points(m)}


def _otlp_counter(server, result: str) -> float:  # noqa: ANN001
    return _prom(_scrape(server), "unified_gpu_exporter_otlp_exports_total", result=result)


def test_a_down_or_slow_receiver_costs_the_scrape_path_nothing(tmp_path):
    port = free_port()  # nothing listens there yet: the receiver is down
    conf = _config(tmp_path, f"http://127.0.0.1:{port}/v1/metrics")
    with ProcessSet() as procs:
        server = start_exporter(procs, tmp_path, ["--simulate", "--config.file", str(conf), "--poll.interval", "1s"])
        wait_until(lambda: _otlp_counter(server, "failure") >= 3, 30, what="three failed pushes")
        assert http_get(server.url + "/readyz").status == 200
        wait_until(lambda: "OTLP push failing" in server.log(), 10, what="the failure logged")
        assert server.log().count("OTLP push failing") == 1  # once per state change, not per push

        receiver = OtlpReceiver(port=port)
        receiver.hold = threading.Event()  # slow: every request waits until released
        with receiver:
            assert receiver.waiting.wait(20), "no push reached the slow receiver"
            # a push is held open: scrapes are answered and the cycles keep advancing meanwhile
            seen = set()
            for _ in range(30):
                r = http_get(server.url + "/metrics", timeout=5)
                assert r.status == 200
                seen.add(_prom(_scrape(server), "unified_gpu_exporter_source_last_success_timestamp_seconds",
                               source="simulator"))
                if len(seen) >= 3 and not receiver.hold.is_set():
                    break
                threading.Event().wait(0.2)
            assert len(seen) >= 3, "the render loop stalled while a push was held"
            receiver.hold.set()  # recovers
            wait_until(lambda: _otlp_counter(server, "success") >= 1, 30, what="a push accepted")
            # the line follows the count by a moment (the push thread counts, then logs)
            wait_until(lambda: "OTLP push recovered" in server.log(), 10, what="the recovery logged")
        assert server.log().count("OTLP push failing") == 1
        assert server.log().count("OTLP push recovered") == 1


def test_reload_moves_the_push_to_the_new_endpoint_and_off(tmp_path):
    import signal

    with OtlpReceiver() as first, OtlpReceiver() as second, ProcessSet() as procs:
        conf = _config(tmp_path, first.url)
        server = start_exporter(procs, tmp_path, ["--simulate", "--config.file", str(conf), "--poll.interval", "1s"])
        assert first.wait_for(1, 20), "no push to the first receiver"
        # an unchanged reload keeps the push: the same start times, no second "succeeded" line
        server.signal(signal.SIGHUP)
        wait_until(lambda: "configuration reloaded" in server.log(), 10)
        n = len(first.requests)
        got = first.wait_for(n + 2, 20)
        assert len(got) >= n + 2, "the push stopped after an unchanged reload"
        assert _energy_starts(got[0][1]) == _energy_starts(got[-1][1])
        assert server.log().count("OTLP push succeeded") == 1
        conf.write_text(conf.read_text().replace(first.url, second.url))
        server.signal(signal.SIGHUP)
        assert second.wait_for(1, 30), "no push to the new endpoint after the reload"
        n = len(first.requests)
        conf.write_text(conf.read_text().replace("enabled: true", "enabled: false"))
        server.signal(signal.SIGHUP)
        wait_until(lambda: "unified_gpu_exporter_otlp_exports_total" not in http_get(server.url + "/metrics").text,
                   20, what="the push's self-metrics gone after disabling it")
        m = len(second.requests)
        # at most the push that was under way when the reload came; none after
        wait_until(lambda: "configuration reloaded" in server.log(), 5)
        threading.Event().wait(3)
        assert len(first.requests) <= n + 1 and len(second.requests) <= m + 1
