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

* The Collector's answer is read through ``http_deadline.read_body`` (at most ``MAX_ANSWER_BYTES``
  on the wire, counted while reading) and ``http_deadline.inflate`` (gzip/deflate to the same
  cap): requests would read it whole and inflate it without a cap (issue 37: a 2.4 MiB gzip
  answer took 1 GiB).  Each request has one ``http_deadline.Deadline`` (the SDK's remaining
  timeout) over connect, TLS, status line, headers and body: its timer shuts the connection's
  socket down, so an answer that trickles ends as a failed push instead of holding the push
  thread for ever (requests' timeout bounds each read only).

The SDK still adds ``OTEL_EXPORTER_OTLP_HEADERS``/``OTEL_EXPORTER_OTLP_METRICS_HEADERS`` to the
configured headers (docs/otel-guide.md says so).
"""

from __future__ import annotations

import contextlib
from typing import Any

import requests
import urllib3
from requests.adapters import HTTPAdapter

from ..http_deadline import BodyTooLarge, Deadline, DeadlinePassed, inflate, read_body
from . import tlsfiles
from .config import OtlpConfig

MAX_FAILURE = 400  # characters of a transport failure kept for the log line
MAX_ANSWER_BYTES = 1 << 20  # of a Collector's answer, on the wire and decompressed (a response is bytes)


# requests.Session.request's parameters after method and url, in order (a caller may pass any
# of them by position)
_REQUEST_ARGS = ("params", "data", "headers", "cookies", "files", "auth", "timeout", "allow_redirects",
                 "proxies", "hooks", "stream", "verify", "cert", "json")


class RedirectRefused(Exception):
    """A 3xx answer: the SDK would count it a success (it treats 200-399 so and follows no
    redirect), and the metrics would be lost at every push.  Not a connection error: the SDK
    does not retry it."""


class AnswerRefused(Exception):
    """The Collector's answer was too large (or in an encoding we did not ask for).  Not a
    connection error: the SDK does not retry it."""


class _WatchedAdapter(HTTPAdapter):
    """requests' adapter whose urllib3 pools register every connection they hand out with the
    current request's ``Deadline`` (``deadline``), new or reused, proxied or not."""

    deadline: Deadline | None = None

    def init_poolmanager(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201 - requests' API
        super().init_poolmanager(*args, **kwargs)
        self._watch(self.poolmanager)

    def proxy_manager_for(self, proxy, **kwargs):  # noqa: ANN001, ANN003, ANN201 - requests' API
        manager = super().proxy_manager_for(proxy, **kwargs)
        self._watch(manager)
        return manager

    def _watch(self, manager: Any) -> None:
        adapter = self

        def watched(base: type) -> type:
            def _get_conn(pool, timeout=None):  # noqa: ANN001, ANN202
                conn = base._get_conn(pool, timeout)
                if adapter.deadline is not None:
                    adapter.deadline.watch(conn)
                return conn
            return type(f"Watched{base.__name__}", (base,), {"_get_conn": _get_conn})
        manager.pool_classes_by_scheme = {"http": watched(urllib3.HTTPConnectionPool),
                                          "https": watched(urllib3.HTTPSConnectionPool)}


class PushSession(requests.Session):
    """The HTTP exporter's session: nothing from the environment, the configured TLS and proxy
    on every request whatever the caller passes (an SDK that gives ``verify=``, ``cert=`` or
    ``proxies=`` per request would otherwise override the session's), no redirect followed and
    a 3xx a failure, and the last transport failure of a push (``failure``, reset by the caller)."""

    def __init__(self, cfg: OtlpConfig) -> None:
        super().__init__()
        self.trust_env = False
        self._adapter = _WatchedAdapter()
        self.mount("http://", self._adapter)
        self.mount("https://", self._adapter)
        self.headers["Accept-Encoding"] = "gzip, deflate"  # the encodings inflate() bounds
        self._timeout = float(cfg.timeout)
        self._memfiles = contextlib.ExitStack()
        self.apply(cfg)
        self.failure = ""

    def apply(self, cfg: OtlpConfig) -> None:
        """The configured TLS files are read here (``tlsfiles.read_bounded``: regular files only,
        bounded, never blocking) into anonymous memory files that requests is given as paths:
        a FIFO or device put at a configured path later is never opened by a push."""
        tls = cfg.tls
        files = [p for p in (tls.ca_file, tls.cert_file if tls.key_file else None,
                             tls.key_file if tls.cert_file else None) if p is not None]
        self._memfiles.close()
        self._memfiles = contextlib.ExitStack()
        paths = iter(self._memfiles.enter_context(tlsfiles.memfiles(*(tlsfiles.read_bounded(p) for p in files))))
        self._verify = next(paths) if tls.ca_file else tlsfiles.system_store()
        self._cert = (next(paths), next(paths)) if tls.cert_file and tls.key_file else None
        self._proxies = {"http": cfg.proxy_url, "https": cfg.proxy_url} if cfg.proxy_url else {}
        self.verify, self.cert, self.proxies = self._verify, self._cert, dict(self._proxies)

    def request(self, method, url, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN201 - requests' signature
        kwargs.update(zip(_REQUEST_ARGS, args, strict=False))
        kwargs.update(verify=self._verify, cert=self._cert, proxies=dict(self._proxies), allow_redirects=False,
                      stream=True)  # the body is read here, bounded
        timeout = kwargs.get("timeout")
        seconds = max(timeout) if isinstance(timeout, tuple) else (timeout or self._timeout)
        deadline = Deadline(max(0.001, float(seconds)))
        self._adapter.deadline = deadline
        try:
            response = super().request(method, url, **kwargs)
            try:
                self._read_answer(response, deadline)
            except BaseException:
                response.close()
                raise
        except DeadlinePassed as exc:
            self.failure = f"no complete answer within {seconds:g} s"
            raise requests.exceptions.ReadTimeout(self.failure) from exc
        except Exception as exc:
            self.failure = (f"no complete answer within {seconds:g} s" if deadline.expired
                            else f"{type(exc).__name__}: {exc}")[:MAX_FAILURE]
            raise
        finally:
            deadline.cancel()
            self._adapter.deadline = None
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

    def close(self) -> None:
        super().close()
        self._memfiles.close()

    @staticmethod
    def _read_answer(response: requests.Response, deadline: Deadline) -> None:
        """The answer's body, bounded on the wire and inflated to the same cap, as the
        response's content (what the SDK reads afterwards)."""
        raw = response.raw
        try:
            body = read_body(lambda n: raw.read(n, decode_content=False), deadline, MAX_ANSWER_BYTES,
                             "the Collector's answer")
            body = inflate(body, response.headers.get("Content-Encoding", ""), MAX_ANSWER_BYTES,
                           "the Collector's answer")
        except (BodyTooLarge, ValueError) as exc:
            raise AnswerRefused(str(exc)) from None
        except urllib3.exceptions.HTTPError as exc:
            if deadline.expired:
                raise DeadlinePassed("the Collector's answer") from exc
            raise requests.exceptions.ConnectionError(str(exc)) from exc
        response._content = body  # noqa: SLF001 - requests' own slot for a read body
        response._content_consumed = True  # noqa: SLF001
        raw.release_conn()


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
