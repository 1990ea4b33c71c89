"""``WebConfig``: one loaded and validated web config file (the file's schema is ``model``).

Above ``model`` (the pydantic schema) and ``tls`` (contexts built from a config): loading checks
the TLS material once, so a bad certificate is an error at start or reload, not at a handshake.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ... import safefile
from ...yamlfile import ConfigError, load_yaml
from .model import WebConfigError, _format_validation_error, _WebConfigFile
from .tls import ReloadingTLS, build_ssl_context

MAX_WEB_CONFIG_BYTES = 1 << 20  # inline certificates included


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

    def with_users_of(self, other: WebConfig) -> WebConfig:
        """This config with ``other``'s basic_auth_users (the user part of a refused reload)."""
        return WebConfig(self._data.model_copy(update={"basic_auth_users": other._data.basic_auth_users}),
                         self.path)

    # -- loading ---------------------------------------------------------------------------------
    @classmethod
    def empty(cls) -> WebConfig:
        return cls(_WebConfigFile(), None)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> WebConfig:
        """Read and validate the file; the TLS material is loaded once to catch errors now."""
        p = Path(path)
        try:  # a regular file only, bounded, never blocking (a FIFO or /dev/zero in its place)
            text = safefile.read_named(p, MAX_WEB_CONFIG_BYTES).decode("utf-8")
        except OSError as e:
            raise WebConfigError(f"web config {p}: cannot read file: {e.strerror or e}") from None
        except UnicodeDecodeError as e:
            raise WebConfigError(f"web config {p}: not UTF-8: {e}") from None
        try:
            # duplicate keys refused (as yaml.UnmarshalStrict does), aliases bounded
            raw, _lines = load_yaml(p, text)
        except ConfigError as e:
            raise WebConfigError(f"web config {e}") from None
        if raw is None or raw == {}:
            # an empty file, whitespace, comments, "null", "---" or "{}": a file cut short or
            # emptied by mistake must never mean "no TLS, no auth" (exporter-toolkit reads it so)
            raise WebConfigError(f"web config {p}: no settings (empty, only comments, null or "
                                 "{}); without a web config, pass no --web.config.file")
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

    def tls_shape(self) -> tuple[Any, ...]:
        t = self.tls
        return (t.client_auth_type, t.min_version, t.max_version, tuple(t.cipher_suites),
                t.prefer_server_cipher_suites)

    # -- TLS (exporter/serve/webconfig/tls.py) ----------------------------------------------------------
    def build_ssl_context(self) -> ssl.SSLContext:
        """A fresh server context from the current files (no reloading)."""
        return build_ssl_context(self)

    def ssl_context(self, provider: Callable[[], WebConfig] | None = None) -> ssl.SSLContext | None:
        """The listening context for ``web.TCPSite(ssl_context=...)``, or None without TLS.

        Every handshake checks the cert/key/CA files (and, with ``provider``, the current config)
        and moves the connection onto a freshly built context when they changed.
        """
        if not self.tls_enabled:
            return None
        return ReloadingTLS(self, provider).context
