"""The OpenTelemetry side: the official OTLP exporters and the SDK's metrics data model.

Imported only when ``exporters.otlp`` is enabled.  No instruments and callbacks: the values are
already aggregated (cumulative counters, gauges) by the render cycle, their timestamp is the
cycle's, and no second aggregation state or reader thread is needed.  Cumulative temporality
throughout (what a Prometheus counter is).

``send`` hands the exporter the request ``encode.Encoder`` built (the same bytes the SDK's
encoder makes of ``metrics_data``, at about a ninth of the CPU: what keeps the push within its
CPU budget, bench/bench_otlp.py) through the exporters' batch path (``_export_batch`` of the
HTTP exporter, 1.45 on; ``_export`` of the gRPC one, whose ``_translate_data`` passes a built
request through): retries, deadline, compression, TLS and the exporters' own accounting stay
theirs.  Where an exporter version lacks that path, ``send`` falls back to the public
``export(MetricsData)`` (the SDK's encoder; a test checks both send the same bytes).  The
exporters themselves are set up in ``transport``.
"""

from __future__ import annotations

import math

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from .. import __version__
from .convert import Converted, MetricOut
from .encode import SCOPE

CUMULATIVE = AggregationTemporality.CUMULATIVE


def grpc_exporter_class():  # noqa: ANN202
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    class GrpcExporter(OTLPMetricExporter):
        """Takes an already built request as well as the SDK's MetricsData."""

        takes_requests = True

        def _translate_data(self, data):  # noqa: ANN001, ANN202
            return data if isinstance(data, ExportMetricsServiceRequest) else super()._translate_data(data)

        def _count_data(self, data):  # noqa: ANN001, ANN202
            if isinstance(data, ExportMetricsServiceRequest):
                return sum(len(getattr(m, m.WhichOneof("data")).data_points)
                           for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics)
            return super()._count_data(data)

    return GrpcExporter


def batch_path(exporter):  # noqa: ANN001, ANN201
    """The exporter's call that sends an already built request (retries, deadline, compression,
    TLS and the exporter's own accounting included), or None where this SDK version has none:
    ``_export_batch`` of the OTLP/HTTP exporter (1.45 on, the lower bound in pyproject.toml), the
    request-aware ``_export`` of ``GrpcExporter``."""
    batch = getattr(exporter, "_export_batch", None)
    if batch is not None:
        return batch
    if getattr(exporter, "takes_requests", False):
        return lambda request: exporter._export(data=request)
    return None


def send(exporter, encoder, conv: Converted, resource: dict[str, str], schema_url: str,  # noqa: ANN001
         timeout: float) -> bool:
    """Export one cycle; True when the receiver accepted it.  ``exporter``: the SDK's exporter."""
    batch = batch_path(exporter)
    if batch is not None:
        return batch(encoder.request(conv, resource, schema_url)) == MetricExportResult.SUCCESS
    return export(exporter, metrics_data(conv, resource, schema_url), timeout)


def _ns(t: float) -> int:
    return int(t * 1e9)


def _histogram_point(attrs, h, start: int, now: int) -> HistogramDataPoint:
    buckets, total, count = h
    finite = sorted(b for b in buckets if not math.isinf(b))
    cumulative = [buckets[b] for b in finite] + [count]
    counts = [int(c - p) for c, p in zip(cumulative, [0.0, *cumulative[:-1]], strict=True)]
    return HistogramDataPoint(attributes=dict(attrs), start_time_unix_nano=start, time_unix_nano=now,
                              count=int(count), sum=total, bucket_counts=counts, explicit_bounds=finite,
                              min=None, max=None)


def _metric(m: MetricOut, conv: Converted, now: int) -> Metric:
    def start(attrs) -> int:  # noqa: ANN001
        return _ns(conv.start.get((m.name, attrs), conv.at))

    if m.instrument == "histogram":
        data = Histogram([_histogram_point(a, h, start(a), now) for a, h in m.hist.items()], CUMULATIVE)
    elif m.instrument == "gauge":
        data = Gauge([NumberDataPoint(dict(a), 0, now, v) for a, v in m.points.items()])
    else:
        data = Sum([NumberDataPoint(dict(a), start(a), now, v) for a, v in m.points.items()], CUMULATIVE,
                   is_monotonic=m.instrument == "counter")
    return Metric(name=m.name, description=m.description, unit=m.unit, data=data)


def metrics_data(conv: Converted, resource: dict[str, str], schema_url: str) -> MetricsData:
    now = _ns(conv.at)
    scope = InstrumentationScope(SCOPE, __version__, schema_url)
    metrics = [_metric(m, conv, now) for m in conv.metrics.values()]
    return MetricsData([ResourceMetrics(Resource(resource, schema_url), [ScopeMetrics(scope, metrics, schema_url)],
                                        schema_url)])


def export(exporter, data: MetricsData, timeout: float) -> bool:  # noqa: ANN001
    return exporter.export(data, timeout_millis=timeout * 1000) == MetricExportResult.SUCCESS
