"""The SDK's official OTLP exporters, set up from ``exporters.otlp`` and nothing else.

Imported by the push thread only.  What the environment could change and does not:

* OTLP/HTTP goes through a ``requests.Session`` of ours with ``trust_env`` off: requests then reads
  no ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE`` (which would replace ``tls.ca_file``), no
  ``HTTP(S)_PROXY``/``NO_PROXY`` and no ``~/.netrc``.  Its TLS settings are set again after the
  SDK built its transport, so the SDK's ``OTEL_EXPORTER_OTLP_*CERTIFICATE``/``*CLIENT_*``
  variables do not apply either; giving a session also skips the SDK's credential-provider
  variable.  The session remembers the last transport failure (the TLS error, the HTTP status)
  for the push's log line.
* gRPC gets credentials built here and the channel option that turns off gRPC's own proxy
  variables (``grpc_proxy``, ``https_proxy``, ``http_proxy``), or the configured ``proxy_url``.
  gRPC still applies ``no_grpc_proxy``/``no_proxy`` to a configured proxy (no channel option
  turns that off): ``config`` refuses a proxy_url those variables would bypass.
* Without ``tls.ca_file`` both verify against the system's trust store, as OpenSSL was built to
  find it (``ssl.get_default_verify_paths()``'s ``openssl_cafile``/``openssl_capath``; for gRPC
  a CA directory's certificates are read into one bundle, ``tlsfiles.system_roots``), not
  certifi's copy nor gRPC's bundled roots.
* OTLP/HTTP follows no redirect and counts a 3xx as a failure (``RedirectRefused``): the SDK
  counts it a success.

The SDK still adds ``OTEL_EXPORTER_OTLP_HEADERS``/``OTEL_EXPORTER_OTLP_METRICS_HEADERS`` to the
configured headers (docs/otel-guide.md says so).
"""

from __future__ import annotations

from typing import Any

import requests

from . import tlsfiles
from .config import OtlpConfig

MAX_FAILURE = 400  # characters of a transport failure kept for the log line


# requests.Session.request's parameters after method and url, in order (a caller may pass any
# of them by position)
_REQUEST_ARGS = ("params", "data", "headers", "cookies", "files", "auth", "timeout", "allow_redirects",
                 "proxies", "hooks", "stream", "verify", "cert", "json")


class RedirectRefused(Exception):
    """A 3xx answer: the SDK would count it a success (it treats 200-399 so and follows no
    redirect), and the metrics would be lost at every push.  Not a connection error: the SDK
    does not retry it."""


class PushSession(requests.Session):
    """The HTTP exporter's session: nothing from the environment, the configured TLS and proxy
    on every request whatever the caller passes (an SDK that gives ``verify=``, ``cert=`` or
    ``proxies=`` per request would otherwise override the session's), no redirect followed and
    a 3xx a failure, and the last transport failure of a push (``failure``, reset by the caller)."""

    def __init__(self, cfg: OtlpConfig) -> None:
        super().__init__()
        self.trust_env = False
        self.apply(cfg)
        self.failure = ""

    def apply(self, cfg: OtlpConfig) -> None:
        tls = cfg.tls
        self._verify = str(tls.ca_file) if tls.ca_file else tlsfiles.system_store()
        self._cert = (str(tls.cert_file), str(tls.key_file)) if tls.cert_file and tls.key_file else None
        self._proxies = {"http": cfg.proxy_url, "https": cfg.proxy_url} if cfg.proxy_url else {}
        self.verify, self.cert, self.proxies = self._verify, self._cert, dict(self._proxies)

    def request(self, method, url, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN201 - requests' signature
        kwargs.update(zip(_REQUEST_ARGS, args, strict=False))
        kwargs.update(verify=self._verify, cert=self._cert, proxies=dict(self._proxies), allow_redirects=False)
        try:
            response = super().request(method, url, **kwargs)
        except Exception as exc:
            self.failure = f"{type(exc).__name__}: {exc}"[:MAX_FAILURE]
            raise
        if 300 <= response.status_code < 400:
            where = response.headers.get("Location", "")[:200]
            self.failure = (f"HTTP {response.status_code} {response.reason}"
                            f"{f' to {where}' if where else ''}: the receiver redirects; redirects are not "
                            "followed, give the final URL as the endpoint")[:MAX_FAILURE]
            response.close()
            raise RedirectRefused(self.failure)
        if response.status_code >= 400:
            self.failure = f"HTTP {response.status_code} {response.reason}"[:MAX_FAILURE]
        return response


class Exporter:
    """One SDK exporter (``sdk``) and, for OTLP/HTTP, its session."""

    def __init__(self, sdk_exporter: Any, session: PushSession | None = None) -> None:
        self.sdk, self.session = sdk_exporter, session

    def take_failure(self) -> str:
        """The last transport failure since the previous call ("" if none was seen)."""
        if self.session is None:
            return ""
        failure, self.session.failure = self.session.failure, ""
        return failure

    def shutdown(self) -> None:
        self.sdk.shutdown()


def make_exporter(cfg: OtlpConfig) -> Exporter:
    if cfg.protocol == "http/protobuf":
        return _http(cfg)
    return _grpc(cfg)


def _http(cfg: OtlpConfig) -> Exporter:
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    session = PushSession(cfg)  # its verify/cert are the only TLS settings (forced per request)
    exporter = OTLPMetricExporter(
        endpoint=cfg.url, headers=cfg.headers, timeout=cfg.timeout, session=session,
        compression=Compression.Gzip if cfg.compression == "gzip" else Compression.NoCompression)
    session.apply(cfg)  # the SDK set verify/cert from its own variables where ours were empty
    return Exporter(exporter, session)


def _grpc(cfg: OtlpConfig) -> Exporter:
    import grpc

    from .sdk import grpc_exporter_class

    tls = cfg.tls
    insecure = cfg.url.startswith("http://")
    credentials = None
    if not insecure:
        def read(p):  # noqa: ANN001, ANN202 - the operator's own TLS files
            return tlsfiles.read_bounded(p) if p is not None else None
        roots = read(tls.ca_file) if tls.ca_file is not None else tlsfiles.system_roots()
        credentials = grpc.ssl_channel_credentials(roots, read(tls.key_file), read(tls.cert_file))
    proxy = (("grpc.http_proxy", cfg.proxy_url),) if cfg.proxy_url else (("grpc.enable_http_proxy", 0),)
    exporter = grpc_exporter_class()(
        endpoint=cfg.url, insecure=insecure, credentials=credentials, headers=cfg.headers or None,
        timeout=cfg.timeout, channel_options=proxy,
        compression=grpc.Compression.Gzip if cfg.compression == "gzip" else grpc.Compression.NoCompression)
    return Exporter(exporter)
