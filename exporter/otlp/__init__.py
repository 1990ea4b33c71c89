"""OTLP push of the rendered cycle under the OpenTelemetry semantic conventions (``exporters.otlp``).

``config`` (the config section), ``naming`` (mappings/otel.yaml, validated against the canonical
schema), ``convert`` (exposition text -> points, no OpenTelemetry import), ``encode`` (points ->
the OTLP protobuf request), ``resource``,
``sdk`` (the OpenTelemetry SDK data model and the official OTLP exporters, imported only when the
push is enabled), ``pusher`` (the push thread), ``hook`` (what the daemon calls), ``stats`` (its
self-metrics) and ``docs`` (docs/otel.md).  Importing this package imports nothing of OpenTelemetry.
"""
