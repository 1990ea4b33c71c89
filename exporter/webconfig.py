"""Prometheus exporter-toolkit ``web-config.yml``: parse, validate, TLS context, basic auth.

The file format and its semantics follow prometheus/exporter-toolkit (``docs/web-configuration.md``):

    tls_server_config: {cert_file, key_file | cert, key, client_auth_type, client_ca_file | client_ca,
                        client_allowed_sans, min_version, max_version, cipher_suites,
                        prefer_server_cipher_suites, curve_preferences}
    http_server_config: {http2, headers}
    basic_auth_users: {user: bcrypt hash}
    rate_limit: {interval, burst}

Relative file paths are resolved against the directory of the config file (as exporter-toolkit
does).  Unknown keys are errors.

Reloading (exporter-toolkit re-reads the file on every request, so rotated certificates apply at
once).  Here:

* ``WebConfigWatcher.current()`` stats the YAML file and re-parses it when its mtime/size changed;
  the auth middleware calls it per request, so users, hashes and headers apply to the next request.
  An invalid new file is logged and the last good config stays in force.
* ``WebConfig.ssl_context(provider)`` returns ONE ``ssl.SSLContext`` for
  ``aiohttp.web.TCPSite(ssl_context=...)``.  Its ``sni_callback`` runs during every TLS handshake
  (OpenSSL calls it after the ClientHello even when the client sent no SNI, e.g. Prometheus
  scraping an IP address); it stats cert/key/CA files and, when one changed, builds a fresh
  context and switches the connection to it (``ssl_object.context = new``).  Certificates, keys and
  client CAs therefore rotate without a restart.  Settings that OpenSSL copies from the listening
  context when a connection is created (client_auth_type, min/max version, cipher list) apply
  only after a restart; a change of those is logged.

Python's ``ssl`` cannot express every Go TLS option:

* ``RequestClientCert`` (request, never verify) is served as "no client certificate": the
  certificate would never be used for anything.  ``RequireAnyClientCert`` (require but do not
  verify) cannot be expressed and is rejected with an error that names the secure alternative.
* ``cipher_suites``: Go names are mapped to OpenSSL names for TLS <= 1.2; TLS 1.3 suites are
  accepted and ignored (as Go ignores them); names outside Go's ``tls.CipherSuites()`` are errors.
* ``curve_preferences`` is validated and ignored (OpenSSL's defaults are used).
* ``http2`` is validated and ignored (aiohttp serves HTTP/1.1).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import ipaddress
import logging
import os
import re
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import bcrypt
from aiohttp import web
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from .yamlfile import ConfigError, load_yaml

log = logging.getLogger(__name__)

__all__ = [
    "WebConfig",
    "WebConfigError",
    "WebConfigWatcher",
    "auth_middleware",
]


class WebConfigError(Exception):
    """The web config file is unreadable or invalid; the message names the file and the field."""


# ----------------------------------------------------------------------------------------------
# Schema
# ----------------------------------------------------------------------------------------------

_TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}

# Go crypto/tls tls.CipherSuites() (the "secure" list exporter-toolkit accepts) -> OpenSSL name.
# None: a TLS 1.3 suite, which Go ignores in this setting and Python cannot configure either.
_GO_CIPHER_SUITES: dict[str, str | None] = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",  # Go alias
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",  # Go alias
    "TLS_AES_128_GCM_SHA256": None,
    "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
}

_CURVES = {"CurveP256", "CurveP384", "CurveP521", "X25519"}

ClientAuthType = Literal[
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
]

# exporter-toolkit headers.go: allowed headers and, where restricted, allowed values.
_ALLOWED_HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}

# $2a$ / $2b$ / $2y$ and a cost Go's x/crypto/bcrypt accepts (MinCost 4 .. MaxCost 31);
# exporter-toolkit checks every hash with bcrypt.Cost() before it serves
_BCRYPT_RE = re.compile(r"^\$2[aby]\$(\d{2})\$[./A-Za-z0-9]{53}$")
BCRYPT_MIN_COST, BCRYPT_MAX_COST = 4, 31
# bcrypt uses the first 72 bytes of a password; Go's CompareHashAndPassword ignores the rest
BCRYPT_MAX_PASSWORD = 72


def _parse_duration(text: str) -> float:
    """The shared duration grammar (exporter/durations.py): ``1h30m``, ``1.5s``, ``500ms``, ``1d``."""
    from .durations import parse_duration

    return parse_duration(text)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TLSServerConfig(_Strict):
    cert_file: str = ""
    key_file: str = ""
    cert: str = ""
    key: str = Field(default="", repr=False)
    client_auth_type: ClientAuthType = "NoClientCert"
    client_ca_file: str = ""
    client_ca: str = ""
    client_allowed_sans: list[str] = Field(default_factory=list)
    min_version: Literal["TLS10", "TLS11", "TLS12", "TLS13"] = "TLS12"
    max_version: Literal["TLS10", "TLS11", "TLS12", "TLS13"] = "TLS13"
    cipher_suites: list[str] = Field(default_factory=list)
    prefer_server_cipher_suites: bool = True
    curve_preferences: list[str] = Field(default_factory=list)

    @field_validator("cipher_suites")
    @classmethod
    def _known_ciphers(cls, v: list[str]) -> list[str]:
        for name in v:
            if name not in _GO_CIPHER_SUITES:
                raise ValueError(f"unknown or insecure cipher suite {name!r} "
                                 "(only Go tls.CipherSuites() names are allowed)")
        return v

    @field_validator("curve_preferences")
    @classmethod
    def _known_curves(cls, v: list[str]) -> list[str]:
        for name in v:
            if name not in _CURVES:
                raise ValueError(f"unknown curve {name!r} (allowed: {', '.join(sorted(_CURVES))})")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> TLSServerConfig:
        if self.cert_file and self.cert:
            raise ValueError("cert and cert_file are mutually exclusive")
        if self.key_file and self.key:
            raise ValueError("key and key_file are mutually exclusive")
        has_cert = bool(self.cert_file or self.cert)
        has_key = bool(self.key_file or self.key)
        if has_cert and not has_key:
            raise ValueError("missing key_file (or key)")
        if has_key and not has_cert:
            raise ValueError("missing cert_file (or cert)")
        if self.client_ca_file and self.client_ca:
            raise ValueError("client_ca and client_ca_file are mutually exclusive")
        has_ca = bool(self.client_ca_file or self.client_ca)
        if has_ca and self.client_auth_type == "NoClientCert":
            raise ValueError("client CA given but client_auth_type is NoClientCert")
        if self.client_auth_type in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert") and not has_ca:
            raise ValueError(f"client_auth_type {self.client_auth_type} needs client_ca_file")
        if self.client_auth_type == "RequireAnyClientCert":
            raise ValueError("client_auth_type RequireAnyClientCert (require a certificate but do not "
                             "verify it) cannot be expressed with Python's ssl module and is insecure; "
                             "use RequireAndVerifyClientCert with client_ca_file")
        if self.client_allowed_sans and self.client_auth_type != "RequireAndVerifyClientCert":
            raise ValueError("client_allowed_sans needs client_auth_type RequireAndVerifyClientCert")
        if (self.cipher_suites and self.min_version != "TLS13"
                and not any(_GO_CIPHER_SUITES[n] for n in self.cipher_suites)):
            raise ValueError("cipher_suites lists only TLS 1.3 suites, which cannot be configured "
                             "(TLS 1.3 always uses its own): TLS 1.2 clients could not connect; "
                             "list TLS 1.2 suites or set min_version: TLS13")
        if _TLS_VERSIONS[self.min_version] > _TLS_VERSIONS[self.max_version]:
            raise ValueError(f"min_version {self.min_version} is above max_version {self.max_version}")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file or self.cert)


class HTTPServerConfig(_Strict):
    http2: bool = True
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("headers")
    @classmethod
    def _allowed_headers(cls, v: dict[str, str]) -> dict[str, str]:
        canonical = {k.lower(): k for k in _ALLOWED_HEADERS}
        out: dict[str, str] = {}
        for name, value in v.items():
            key = canonical.get(name.lower())
            if key is None:
                raise ValueError(f"HTTP header {name!r} can not be configured "
                                 f"(allowed: {', '.join(_ALLOWED_HEADERS)})")
            allowed = _ALLOWED_HEADERS[key]
            if allowed is not None and str(value).lower() not in allowed:
                raise ValueError(f"invalid value {value!r} for header {key} (allowed: {', '.join(allowed)})")
            if "\r" in str(value) or "\n" in str(value):
                raise ValueError(f"header {key} value contains a line break")
            out[key] = str(value)
        return out


class RateLimit(_Strict):
    interval: str = "0s"
    burst: int = Field(default=0, ge=0)

    @field_validator("interval")
    @classmethod
    def _duration(cls, v: str) -> str:
        _parse_duration(v)
        return v

    @property
    def interval_seconds(self) -> float:
        return _parse_duration(self.interval)


class _WebConfigFile(_Strict):
    tls_server_config: TLSServerConfig = Field(default_factory=TLSServerConfig)
    http_server_config: HTTPServerConfig = Field(default_factory=HTTPServerConfig)
    basic_auth_users: dict[str, str] = Field(default_factory=dict)
    rate_limit: RateLimit = Field(default_factory=RateLimit)

    @field_validator("basic_auth_users", mode="before")
    @classmethod
    def _users(cls, v: Any) -> Any:
        if v is None:
            return {}
        if not isinstance(v, dict):
            raise ValueError("must be a map of user name to bcrypt hash")  # noqa: TRY004 (pydantic)
        for user, hashed in v.items():
            if not isinstance(user, str) or not user or ":" in user:
                raise ValueError(f"invalid user name {user!r} (non-empty, no ':')")
            m = _BCRYPT_RE.match(hashed) if isinstance(hashed, str) else None
            if m is None:
                # never echo the value: it is a secret hash
                raise ValueError(f"user {user!r}: password is not a bcrypt hash with prefix $2a$, "
                                 "$2b$ or $2y$ (create one with: htpasswd -nBC 10 \"\" | tr -d ':\\n')")
            if not BCRYPT_MIN_COST <= int(m.group(1)) <= BCRYPT_MAX_COST:
                raise ValueError(f"user {user!r}: bcrypt cost {int(m.group(1))} is outside "
                                 f"{BCRYPT_MIN_COST}..{BCRYPT_MAX_COST}")
        return v


def _format_validation_error(path: Path, err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        parts.append(f"{loc}: {msg}")
    return f"web config {path}: " + "; ".join(parts)


# ----------------------------------------------------------------------------------------------
# The loaded config
# ----------------------------------------------------------------------------------------------


class WebConfig:
    """A validated web config; ``WebConfig.load(path)`` or ``WebConfig.empty()`` (no TLS, no auth)."""

    def __init__(self, data: _WebConfigFile, path: Path | None) -> None:
        self._data = data
        self.path = path
        self.tls = data.tls_server_config
        self.http = data.http_server_config
        self.users: dict[str, bytes] = {u: h.encode() for u, h in data.basic_auth_users.items()}
        self.rate_limit = data.rate_limit
        base = path.parent if path is not None else Path.cwd()
        self._base_dir = base
        self._allowed_sans = frozenset(data.tls_server_config.client_allowed_sans)
        self.broken = ""  # set on a stand-in that refuses everything (see WebConfigWatcher)

    @classmethod
    def refusing(cls, reason: str, path: Path | None) -> WebConfig:
        """A config that serves nothing: every request 500, every TLS handshake refused."""
        cfg = cls(_WebConfigFile(), path)
        cfg.broken = reason
        return cfg

    # -- loading ---------------------------------------------------------------------------------
    @classmethod
    def empty(cls) -> WebConfig:
        return cls(_WebConfigFile(), None)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> WebConfig:
        """Read and validate the file; the TLS material is loaded once to catch errors now."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            raise WebConfigError(f"web config {p}: cannot read file: {e.strerror or e}") from None
        try:
            # duplicate keys refused (as yaml.UnmarshalStrict does), aliases bounded
            raw, _lines = load_yaml(p, text)
        except ConfigError as e:
            raise WebConfigError(f"web config {e}") from None
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise WebConfigError(f"web config {p}: top level must be a map")
        try:
            data = _WebConfigFile.model_validate(raw)
        except ValidationError as e:
            raise WebConfigError(_format_validation_error(p, e)) from None
        cfg = cls(data, p)
        if cfg.tls_enabled:
            cfg.build_ssl_context()  # raises WebConfigError naming the field
        return cfg

    # -- properties ------------------------------------------------------------------------------
    @property
    def tls_enabled(self) -> bool:
        return self.tls.enabled

    @property
    def auth_enabled(self) -> bool:
        return bool(self.users)

    @property
    def headers(self) -> dict[str, str]:
        return self.http.headers

    @property
    def allowed_sans(self) -> frozenset[str]:
        return self._allowed_sans

    def resolve(self, name: str) -> Path:
        p = Path(name)
        return p if p.is_absolute() else self._base_dir / p

    def tls_files(self) -> tuple[Path, ...]:
        t = self.tls
        return tuple(self.resolve(n) for n in (t.cert_file, t.key_file, t.client_ca_file) if n)

    def tls_file_state(self) -> tuple[Any, ...]:
        """Identity of the TLS material on disk: (path, mtime_ns, size, inode) per file."""
        state: list[Any] = [id(self._data)]
        for f in self.tls_files():
            try:
                st = f.stat()
                state.append((str(f), st.st_mtime_ns, st.st_size, st.st_ino))
            except OSError:
                state.append((str(f), None))
        return tuple(state)

    def _shape(self) -> tuple[Any, ...]:
        t = self.tls
        return (t.client_auth_type, t.min_version, t.max_version, tuple(t.cipher_suites),
                t.prefer_server_cipher_suites)

    # -- TLS -------------------------------------------------------------------------------------
    def build_ssl_context(self) -> ssl.SSLContext:
        """A fresh server context from the current files (no reloading)."""
        t = self.tls
        where = f"web config {self.path}" if self.path else "web config"
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = _TLS_VERSIONS[t.min_version]
        ctx.maximum_version = _TLS_VERSIONS[t.max_version]
        ctx.options |= ssl.OP_NO_COMPRESSION
        if t.prefer_server_cipher_suites:
            ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
        else:
            ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
        tls12 = [c for c in (_GO_CIPHER_SUITES[n] for n in t.cipher_suites) if c]
        if tls12:
            try:
                ctx.set_ciphers(":".join(dict.fromkeys(tls12)))
            except ssl.SSLError as e:
                raise WebConfigError(f"{where}: tls_server_config.cipher_suites: {e}") from None
        try:
            if t.cert_file:
                ctx.load_cert_chain(self.resolve(t.cert_file), self.resolve(t.key_file))
            else:
                _load_inline_cert_chain(ctx, t.cert, t.key)
        except (OSError, ssl.SSLError) as e:
            raise WebConfigError(f"{where}: tls_server_config.cert_file/key_file: "
                                 f"cannot load certificate and key: {_describe(e)}") from None
        if t.client_auth_type in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert"):
            try:
                if t.client_ca_file:
                    ctx.load_verify_locations(cafile=str(self.resolve(t.client_ca_file)))
                else:
                    ctx.load_verify_locations(cadata=t.client_ca)
            except (OSError, ssl.SSLError) as e:
                raise WebConfigError(f"{where}: tls_server_config.client_ca_file: "
                                     f"cannot load client CA: {_describe(e)}") from None
            ctx.verify_mode = (ssl.CERT_REQUIRED if t.client_auth_type == "RequireAndVerifyClientCert"
                               else ssl.CERT_OPTIONAL)
        else:
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def ssl_context(self, provider: Callable[[], WebConfig] | None = None) -> ssl.SSLContext | None:
        """The listening context for ``web.TCPSite(ssl_context=...)``, or None without TLS.

        Every handshake checks the cert/key/CA files (and, with ``provider``, the current config)
        and moves the connection onto a freshly built context when they changed.
        """
        if not self.tls_enabled:
            return None
        return _ReloadingTLS(self, provider).context


def _describe(e: BaseException) -> str:
    if isinstance(e, ssl.SSLError):
        return e.reason or str(e)
    if isinstance(e, OSError):
        return f"{e.strerror or e}" + (f": {e.filename}" if e.filename else "")
    return str(e)


def _load_inline_cert_chain(ctx: ssl.SSLContext, cert: str, key: str) -> None:
    """Load PEM strings without writing them to disk (anonymous memfd; Linux)."""
    fds = []
    try:
        paths = []
        for name, text in (("cert", cert), ("key", key)):
            fd = os.memfd_create(f"webconfig-{name}", os.MFD_CLOEXEC)
            fds.append(fd)
            os.write(fd, text.encode())
            paths.append(f"/proc/self/fd/{fd}")
        ctx.load_cert_chain(paths[0], paths[1])
    finally:
        for fd in fds:
            os.close(fd)


class _ReloadingTLS:
    """One listening SSLContext whose sni_callback swaps in rebuilt contexts after rotation."""

    def __init__(self, cfg: WebConfig, provider: Callable[[], WebConfig] | None) -> None:
        self._cfg = cfg
        self._provider = provider
        self._lock = threading.Lock()
        self._shape = cfg._shape()
        self.context = cfg.build_ssl_context()
        self._current = self.context
        self._state = cfg.tls_file_state()
        self.context.sni_callback = self._on_handshake

    def _on_handshake(self, sslobj: Any, server_name: str | None, _ctx: ssl.SSLContext) -> int | None:
        cfg = self._provider() if self._provider is not None else self._cfg
        if cfg.broken or not cfg.tls_enabled:
            # the web config is unreadable, invalid or no longer enables TLS: refuse, as
            # exporter-toolkit's GetConfigForClient does, instead of serving without it
            return ssl.ALERT_DESCRIPTION_HANDSHAKE_FAILURE
        try:
            ctx = self._latest()
            if ctx is not self.context:
                sslobj.context = ctx
        except Exception:  # never abort a handshake because of a reload problem
            log.exception("TLS reload failed; keeping the previous certificate")

    def _latest(self) -> ssl.SSLContext:
        cfg = self._provider() if self._provider is not None else self._cfg
        with self._lock:
            if cfg.broken or not cfg.tls_enabled:
                return self._current  # refused in _on_handshake
            state = cfg.tls_file_state()
            if state == self._state:
                return self._current
            self._state = state
            try:
                new = cfg.build_ssl_context()
            except WebConfigError as e:
                log.error("%s; keeping the previous certificate", e)
                return self._current
            if cfg._shape() != self._shape:
                log.warning("web config: client_auth_type, TLS versions and cipher suites apply "
                            "after a restart; new certificates apply now")
            self._current = new
            log.info("TLS material reloaded from %s", ", ".join(str(p) for p in cfg.tls_files()))
            return new


class WebConfigWatcher:
    """Follows a web-config file: ``current()`` re-parses it when it changed on disk.

    Use ``current`` as the provider for ``auth_middleware`` and ``ssl_context()`` for TCPSite::

        watcher = WebConfigWatcher(path)            # raises WebConfigError at start
        app = web.Application(middlewares=[auth_middleware(watcher.current)])
        site = web.TCPSite(runner, host, 9632, ssl_context=watcher.ssl_context())
    """

    def __init__(self, path: str | os.PathLike[str] | None, *, min_check_interval: float = 0.0) -> None:
        self.path = Path(path) if path else None
        # 0: the file is stat()ed on every request, so a change of users applies to the very next
        # request (no window where a removed user still gets in)
        self._min_check = min_check_interval
        self._lock = threading.Lock()
        self._config = WebConfig.load(self.path) if self.path else WebConfig.empty()
        self._serving_tls = self._config.tls_enabled
        self._stamp = self._stat()
        self._checked = time.monotonic()

    def _stat(self) -> tuple[int, int, int] | None:
        if self.path is None:
            return None
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def current(self) -> WebConfig:
        if self.path is None:
            return self._config
        now = time.monotonic()
        if now - self._checked < self._min_check:
            return self._config
        with self._lock:
            self._checked = now
            stamp = self._stat()
            if stamp == self._stamp:
                return self._config
            self._stamp = stamp
            # fail closed, as exporter-toolkit does (it re-reads the file per request and per
            # handshake): an unreadable, empty or invalid file, or one that drops TLS while TLS
            # is served, refuses every request (500) and handshake until the file is fixed
            try:
                cfg = WebConfig.load(self.path)
                if stamp is not None and stamp[1] == 0:
                    raise WebConfigError(f"web config {self.path}: empty file")
                if self._serving_tls and not cfg.tls_enabled:
                    raise WebConfigError(f"web config {self.path}: tls_server_config no longer "
                                         "enables TLS while TLS is served (restart to serve plain HTTP)")
            except WebConfigError as e:
                log.error("%s; refusing all requests until it is fixed", e)
                self._config = WebConfig.refusing(str(e), self.path)
                return self._config
            self._config = cfg
            log.info("web config %s reloaded", self.path)
            return self._config

    def ssl_context(self) -> ssl.SSLContext | None:
        return self._config.ssl_context(self.current)


# ----------------------------------------------------------------------------------------------
# Basic auth, security headers, rate limit (aiohttp middleware)
# ----------------------------------------------------------------------------------------------

_fake_hash: bytes | None = None


def _fake_hash_for_unknown_users() -> bytes:
    """A real cost-10 hash checked for unknown users, so timing does not reveal which users exist."""
    global _fake_hash
    if _fake_hash is None:
        _fake_hash = bcrypt.hashpw(b"fakepassword", bcrypt.gensalt(10))
    return _fake_hash


class _AuthCache:
    """Bounded LRU of bcrypt results keyed by sha256(user, hash, password) (no plaintext kept)."""

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._items: OrderedDict[bytes, bool] = OrderedDict()

    def get(self, key: bytes) -> bool | None:
        v = self._items.get(key)
        if v is not None:
            self._items.move_to_end(key)
        return v

    def set(self, key: bytes, ok: bool) -> None:
        self._items[key] = ok
        self._items.move_to_end(key)
        while len(self._items) > self._size:
            self._items.popitem(last=False)


def _bcrypt_ok(password: bytes, hashed: bytes) -> bool:
    try:
        # bcrypt >= 5 raises for > 72 bytes; Go (exporter-toolkit) compares the first 72
        return bcrypt.checkpw(password[:BCRYPT_MAX_PASSWORD], hashed)
    except ValueError:  # password > 72 bytes (bcrypt>=5) or malformed hash
        return False


def _parse_basic(header: str) -> tuple[str, bytes] | None:
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "basic" or not token:
        return None
    try:
        raw = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = raw.partition(b":")
    if not sep:
        return None
    try:
        return user.decode("utf-8"), password
    except UnicodeDecodeError:
        return None


def _peer_sans(request: web.Request) -> set[str]:
    transport = request.transport
    cert = transport.get_extra_info("peercert") if transport is not None else None
    sans: set[str] = set()
    for kind, value in (cert or {}).get("subjectAltName", ()):
        if kind == "IP Address":
            try:
                value = str(ipaddress.ip_address(value.strip()))
            except ValueError:
                pass
        sans.add(value)
    return sans


class _TokenBucket:
    def __init__(self) -> None:
        self._tokens = 0.0
        self._last = time.monotonic()
        self._params: tuple[float, int] | None = None

    def allow(self, interval: float, burst: int) -> bool:
        now = time.monotonic()
        if self._params != (interval, burst):
            self._params = (interval, burst)
            self._tokens = float(burst)
            self._last = now
        self._tokens = min(float(burst), self._tokens + (now - self._last) / interval)
        self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def auth_middleware(webconfig_provider: Callable[[], WebConfig]) -> Any:
    """aiohttp middleware: rate limit, client SAN allow-list, basic auth, security headers.

    ``webconfig_provider`` is called per request (e.g. ``WebConfigWatcher.current``).  Wrong or
    missing credentials get ``401`` with ``WWW-Authenticate: Basic`` and the bare status text;
    nothing about the user or the reason is sent or logged.
    """
    cache = _AuthCache()
    bcrypt_lock = asyncio.Lock()  # one bcrypt at a time, as exporter-toolkit does
    bucket = _TokenBucket()

    def _plain(status: int, reason: str, cfg: WebConfig, extra: dict[str, str] | None = None) -> web.Response:
        resp = web.Response(status=status, text=reason + "\n", content_type="text/plain")
        resp.headers.update(cfg.headers)
        if extra:
            resp.headers.update(extra)
        return resp

    async def _check(cfg: WebConfig, user: str, password: bytes) -> bool:
        hashed = cfg.users.get(user)
        known = hashed is not None
        if hashed is None:
            hashed = await asyncio.to_thread(_fake_hash_for_unknown_users)
        key = hashlib.sha256(b"\0".join((user.encode(), hashed, password))).digest()
        ok = cache.get(key)
        if ok is None:
            async with bcrypt_lock:
                ok = await asyncio.to_thread(_bcrypt_ok, password, hashed)
            cache.set(key, ok)
        # bcrypt.checkpw compares the digests in constant time; unknown users cost one bcrypt too
        return ok and known

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        cfg = webconfig_provider()
        if cfg.broken:
            return _plain(500, "Internal Server Error", cfg)
        rl = cfg.rate_limit
        if rl.burst > 0 and rl.interval_seconds > 0 and not bucket.allow(rl.interval_seconds, rl.burst):
            return _plain(429, "Too Many Requests", cfg)
        if cfg.allowed_sans and not (cfg.allowed_sans & _peer_sans(request)):
            return _plain(403, "Forbidden", cfg)
        if cfg.users:
            creds = _parse_basic(request.headers.get("Authorization", ""))
            if creds is None or not await _check(cfg, *creds):
                return _plain(401, "Unauthorized", cfg, {"WWW-Authenticate": "Basic"})
        try:
            resp = await handler(request)
        except web.HTTPException as exc:
            exc.headers.update(cfg.headers)
            raise
        if not resp.prepared:
            resp.headers.update(cfg.headers)
        return resp

    return middleware
