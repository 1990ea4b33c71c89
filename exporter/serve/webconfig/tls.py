"""TLS for the web config: the server context, and certificate rotation on every handshake."""

from __future__ import annotations

import logging
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ... import safefile
from .model import _GO_CIPHER_SUITES, _TLS_VERSIONS, TLSServerConfig, WebConfigError

log = logging.getLogger("exporter.serve.webconfig")
MAX_TLS_FILE_BYTES = 1 << 20  # a certificate chain, a key or a CA bundle


class TLSConfig(Protocol):
    """What a context is built from: a loaded web config (``config.WebConfig``) satisfies it."""

    path: Path | None
    tls: TLSServerConfig
    broken: str

    @property
    def tls_enabled(self) -> bool: ...

    def resolve(self, name: str) -> Path: ...

    def tls_files(self) -> tuple[Path, ...]: ...

    def tls_file_state(self) -> tuple[Any, ...]: ...

    def tls_shape(self) -> tuple[Any, ...]: ...


def build_ssl_context(cfg: TLSConfig) -> ssl.SSLContext:
    """A fresh server context from the current files (no reloading)."""
    t = cfg.tls
    where = f"web config {cfg.path}" if cfg.path else "web config"
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
    try:  # the files read as regular files only, bounded, never blocking (a FIFO in their place)
        if t.cert_file:
            safefile.load_pem_chain(ctx, safefile.read_named(cfg.resolve(t.cert_file), MAX_TLS_FILE_BYTES),
                                    safefile.read_named(cfg.resolve(t.key_file), MAX_TLS_FILE_BYTES))
        else:
            safefile.load_pem_chain(ctx, t.cert.encode(), t.key.encode())
    except (OSError, ssl.SSLError) as e:
        raise WebConfigError(f"{where}: tls_server_config.cert_file/key_file: "
                             f"cannot load certificate and key: {_describe(e)}") from None
    if t.client_auth_type in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert"):
        try:
            if t.client_ca_file:
                ca = safefile.read_named(cfg.resolve(t.client_ca_file), MAX_TLS_FILE_BYTES)
                ctx.load_verify_locations(cadata=ca.decode("ascii", "replace"))
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


def _describe(e: BaseException) -> str:
    if isinstance(e, ssl.SSLError):
        return e.reason or str(e)
    if isinstance(e, OSError):
        return f"{e.strerror or e}" + (f": {e.filename}" if e.filename else "")
    return str(e)


class ReloadingTLS:
    """One listening SSLContext whose sni_callback swaps in rebuilt contexts after rotation."""

    def __init__(self, cfg: TLSConfig, provider: Callable[[], TLSConfig] | None) -> None:
        self._cfg = cfg
        self._provider = provider
        self._lock = threading.Lock()
        self._shape = cfg.tls_shape()
        self.context = build_ssl_context(cfg)
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
            if ctx is not _ctx:  # rotated certificates: this very handshake uses them
                sslobj.context = ctx
        except Exception:  # never abort a handshake because of a reload problem
            log.exception("TLS reload failed; keeping the previous certificate")

    def for_new_connection(self) -> ssl.SSLContext:
        """The context to create a new connection with (the latest; OpenSSL copies the client
        certificate policy, versions and ciphers from it, which a swap in the SNI callback
        cannot change).  A broken config gives the listening one: its handshake is refused."""
        try:
            return self._latest()
        except Exception:
            log.exception("TLS reload failed; keeping the previous context")
            return self._current

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
                new = build_ssl_context(cfg)
            except WebConfigError as e:
                log.error("%s; keeping the previous certificate", e)
                return self._current
            if cfg.tls_shape() != self._shape:
                self._shape = cfg.tls_shape()
                log.info("web config: client_auth_type, TLS versions and cipher suites changed: "
                         "they apply to new connections; connections made under a weaker "
                         "client-certificate policy are closed at their next request")
            new.sni_callback = self._on_handshake
            self._current = new
            log.info("TLS material reloaded from %s", ", ".join(str(p) for p in cfg.tls_files()))
            return new
