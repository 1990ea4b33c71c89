"""The ``exporters.otlp`` section of the config file (validated with the rest of it).

    exporters:
      otlp:
        enabled: true
        endpoint: https://collector.example:4318/v1/metrics   # grpc: https://collector.example:4317
        protocol: http/protobuf          # or grpc
        headers_file: /etc/unified-gpu-exporter/otlp-headers   # "Name: value" lines (a secret)
        tls: {ca_file: ..., cert_file: ..., key_file: ...}      # client certificate optional
        proxy_url: http://proxy.example:3128   # optional; proxy variables of the environment are ignored
        interval: 15s                    # one push per interval, of the latest rendered cycle
        timeout: 10s                     # per push, retries included; at most the interval
        compression: gzip                # or none
        resource_attributes: {deployment.environment.name: prod}
        allow_plaintext: false           # true: headers_file/tls/URL credentials allowed with an http:// endpoint

The headers file is read like every file another user might write (``exporter/safefile.py``:
no symlink, a regular file, bounded) and its values are never logged.  With an ``http://``
endpoint the headers (credentials) would go unencrypted and ``tls`` would be unused: either is an
error unless ``allow_plaintext: true`` says the path is private; so are credentials in the
endpoint's URL (``http://user:password@...``), whose password is never logged (``redact_url``).  The TLS files are loaded at load
as OpenSSL will load them (an encrypted or mismatched client key fails here, naming the file and
its line).  With ``enabled: true`` and the OpenTelemetry packages missing (the ``otlp`` extra;
``otlp-grpc`` for protocol grpc), loading the config fails, naming the extra.  The push takes its
endpoint, TLS material and proxy from this section only (``transport.make_exporter``: no proxy, CA
bundle or OTLP certificate variables of the environment); the one exception, gRPC's
``no_grpc_proxy``/``no_proxy``, which gRPC applies even to ``proxy_url``, is refused at load where it
would exempt the endpoint.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ..durations import Duration
from ..http_deadline import redact_url
from . import tlsfiles

MAX_HEADERS_BYTES = 64 * 1024
_TOKEN = re.compile(r"\A[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")  # an HTTP header name (RFC 9110 token)
# the modules each protocol needs, and the extra that installs them (the SDK comes with either)
PROTOCOL_MODULES = {"http/protobuf": ("opentelemetry.exporter.otlp.proto.http.metric_exporter", "requests"),
                    "grpc": ("opentelemetry.exporter.otlp.proto.grpc.metric_exporter", "grpc", "requests")}
PROTOCOL_EXTRAS = {"http/protobuf": "otlp", "grpc": "otlp-grpc"}


def _missing(modules: tuple[str, ...]) -> str:
    """The first of ``modules`` that cannot be imported ("" when all can)."""
    for module in modules:
        try:
            if importlib.util.find_spec(module) is None:
                return module
        except (ModuleNotFoundError, ValueError):
            return module
    return ""


class OtlpTLS(BaseModel):
    """Checked at load as OpenSSL will load the files (``tlsfiles``); ``digest`` fingerprints
    their contents for ``OtlpConfig.identity``."""

    model_config = ConfigDict(extra="forbid")
    ca_file: Path | None = Field(None, description=(
        "CA bundle the Collector's certificate is checked against (default: the system's trust store)"))
    cert_file: Path | None = Field(None, description="client certificate (mutual TLS), with key_file")
    key_file: Path | None = Field(None, description="the client certificate's key")
    _digest: str = PrivateAttr(default="")

    @field_validator("ca_file", "cert_file", "key_file")
    @classmethod
    def _file(cls, v: Path | None) -> Path | None:
        if v is not None and not v.is_file():
            raise ValueError(f"{v}: not a file")
        return v

    @field_validator("ca_file")
    @classmethod
    def _ca(cls, v: Path | None) -> Path | None:
        if v is not None:
            tlsfiles.check_ca(v)
        return v

    @field_validator("key_file")
    @classmethod
    def _key(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        cert = info.data.get("cert_file")
        if v is not None and cert is not None:
            tlsfiles.check_pair(cert, v)
        return v

    @model_validator(mode="after")
    def _pair(self) -> OtlpTLS:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        try:
            self._digest = tlsfiles.fingerprint((self.ca_file, self.cert_file, self.key_file))
        except OSError as exc:
            raise ValueError(str(exc)) from None
        return self

    @property
    def configured(self) -> bool:
        return any(f is not None for f in (self.ca_file, self.cert_file, self.key_file))

    @property
    def digest(self) -> str:
        return self._digest


def grpc_no_proxy(host: str, env: Mapping[str, str]) -> tuple[str, str] | None:
    """The (variable, entry) by which gRPC core would connect to ``host`` directly although a
    proxy is set (its HTTP proxy mapper: ``no_grpc_proxy`` if set, else ``no_proxy``; lower case
    only; entries split on commas, blank-trimmed, matching a host name that ends with them, case
    aside, or an IP address inside a CIDR range; there is no channel option to turn this off)."""
    var = "no_grpc_proxy" if "no_grpc_proxy" in env else "no_proxy" if "no_proxy" in env else None
    if var is None:
        return None
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for raw in env[var].split(","):
        if not raw:
            continue
        entry = raw.strip()
        if host.lower().endswith(entry.lower()):
            return var, entry
        if address is not None and "/" in entry:
            try:
                if address in ipaddress.ip_network(entry, strict=False):
                    return var, entry
            except ValueError:
                continue
    return None


def _refuse_grpc_no_proxy(url: str) -> None:
    host = urlsplit(url).hostname or ""
    hit = grpc_no_proxy(host, os.environ)
    if hit is not None:
        var, entry = hit
        raise ValueError(f"proxy_url with protocol grpc: gRPC would not use the proxy for {host}, because "
                         f"the environment's {var} lists {entry!r} (gRPC applies {var} even to a configured "
                         f"proxy and has no option to ignore it); remove that entry, or set no_grpc_proxy "
                         f"(which gRPC reads instead of no_proxy) without it for the exporter")


def parse_headers(text: str, where: str) -> dict[str, str]:
    """``Name: value`` per line; blank lines and ``#`` comments ignored.  Errors name the line,
    never the value."""
    out: dict[str, str] = {}
    for i, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        name, sep, value = s.partition(":")
        name, value = name.strip(), value.strip()
        if not sep or not _TOKEN.match(name):
            raise ValueError(f"{where}:{i}: not a 'Name: value' header line")
        if any(c in value for c in "\r\n\x00"):
            raise ValueError(f"{where}:{i}: control character in the value of {name}")
        out[name.lower()] = value
    return out


def read_headers(path: Path) -> dict[str, str]:
    from .. import safefile

    try:
        data = safefile.read_path(path, MAX_HEADERS_BYTES)
    except OSError as exc:
        raise ValueError(f"headers_file {path}: {exc}") from None
    return parse_headers(bytes(data).decode("utf-8", "replace"), str(path))


class OtlpConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(False, description=(
        "push the rendered cycles to an OpenTelemetry Collector (OTLP) beside /metrics"))
    endpoint: str = Field("", description=(
        "the Collector's URL (default: http://localhost:4318/v1/metrics; grpc: :4317)"))
    protocol: Literal["http/protobuf", "grpc"] = Field("http/protobuf", description=(
        "http/protobuf or grpc (grpc needs the otlp-grpc extra)"))
    headers_file: Path | None = Field(None, description=(
        "a file of `Name: value` lines sent with each push (credentials stay out of the config)"))
    tls: OtlpTLS = OtlpTLS()
    interval: Duration = Field(15.0, description="one push per this interval (the latest rendered cycle)")
    timeout: Duration = Field(10.0, description="one push's deadline")
    compression: Literal["gzip", "none"] = Field("gzip", description="gzip or none")
    proxy_url: str = Field("", description="an HTTP proxy (CONNECT for https:// and gRPC)")
    allow_plaintext: bool = Field(False, description=(
        "allow headers_file or tls with an http:// endpoint (sent unencrypted)"))
    resource_attributes: dict[str, str] = Field({}, description=(
        "resource attributes of every push (win over the ones derived from labels)"))
    _headers: dict[str, str] = PrivateAttr(default_factory=dict)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        if v:
            u = urlsplit(v)
            if u.scheme not in ("http", "https") or not u.hostname:
                raise ValueError(f"{redact_url(v)!r}: give a URL, http://host:port/... or https://host:port/...")
        return v

    @field_validator("proxy_url")
    @classmethod
    def _proxy(cls, v: str) -> str:
        if v:
            u = urlsplit(v)
            if u.scheme != "http" or not u.hostname or u.path not in ("", "/") or u.query:
                raise ValueError(f"{v!r}: give an HTTP proxy as http://host:port")
        return v

    @model_validator(mode="after")
    def _check(self) -> OtlpConfig:
        if self.interval <= 0 or self.timeout <= 0:
            raise ValueError("interval and timeout must be positive")
        if self.timeout > self.interval:
            raise ValueError(f"timeout ({self.timeout:g}s) must not exceed interval ({self.interval:g}s)")
        if self.url.startswith("http://") and not self.allow_plaintext:
            userinfo = "@" in urlsplit(self.url).netloc
            given = [n for n, on in (("headers_file", self.headers_file is not None),
                                     ("tls", self.tls.configured), ("credentials in the URL", userinfo)) if on]
            if given:
                raise ValueError(f"{' and '.join(given)} with the plaintext endpoint {redact_url(self.url)}: the headers "
                                 "(credentials) would travel unencrypted and no TLS would be used; give an "
                                 "https:// endpoint, or set allow_plaintext: true where the path is private "
                                 "(a Collector on this host)")
        if not self.enabled:
            return self
        if self.protocol == "grpc" and self.proxy_url:
            _refuse_grpc_no_proxy(self.url)
        module = _missing(PROTOCOL_MODULES[self.protocol])
        if module:
            extra = PROTOCOL_EXTRAS[self.protocol]
            raise ValueError(f"enabled with protocol {self.protocol}, but {module} is not installed: "
                             f"install the {extra} extra (pip install 'unified-gpu-exporter[{extra}]')")
        if self.headers_file is not None:
            self._headers = read_headers(self.headers_file)
        return self

    @property
    def headers(self) -> dict[str, str]:
        return dict(self._headers)

    @property
    def url(self) -> str:
        if self.endpoint:
            return self.endpoint
        return "http://localhost:4318/v1/metrics" if self.protocol == "http/protobuf" else "http://localhost:4317"

    def identity(self) -> tuple:
        """What a running pusher depends on (the section, the headers file's content and the TLS
        files' contents: gRPC holds them in memory): a reload that changes none of it keeps the
        pusher (``hook.OtlpOutput.configure``)."""
        return (self.model_dump_json(), tuple(sorted(self._headers.items())), self.tls.digest)


class ExportersConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    otlp: OtlpConfig = OtlpConfig()
