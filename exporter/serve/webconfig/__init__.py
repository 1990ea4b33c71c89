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
  It fails closed: an unreadable or invalid file, or one with no settings (empty, whitespace,
  comments, ``null``, ``---``, ``basic_auth_users:`` with no users) refuses every request (500)
  and handshake until fixed.  A valid change that loosens access (basic auth or TLS off, a weaker
  ``client_auth_type``, no ``client_allowed_sans``, a lower ``min_version``: what a file read
  half-rewritten looks like) is refused: the stricter config in force keeps serving (logged once
  per reason, counted in ``web_config_reloads_total{result="refused_looser"}``) until a restart.
* ``WebConfigWatcher.context_for_new_connection()`` gives each new TLS connection a context
  built from the current file (``SniffingTLSSite(context_provider=...)``), so a tightened
  client-certificate policy, TLS versions and ciphers apply to the next handshake; the middleware
  closes an open connection made under a weaker policy at its next request.
* ``WebConfig.ssl_context(provider)`` returns ONE listening ``ssl.SSLContext`` whose
  ``sni_callback`` runs during every TLS handshake (OpenSSL calls it after the ClientHello even
  when the client sent no SNI); it stats cert/key/CA files and, when one changed, switches the
  connection to a freshly built context (``ssl_object.context = new``).  Certificates, keys and
  client CAs therefore rotate without a restart, with a plain ``web.TCPSite`` too; settings that
  OpenSSL copies when a connection is created apply there only through the per-connection
  context above.

Python's ``ssl`` cannot express every Go TLS option:

* ``RequestClientCert`` (request, never verify) is served as "no client certificate": the
  certificate would never be used for anything.  ``RequireAnyClientCert`` (require but do not
  verify) cannot be expressed and is rejected with an error that names the secure alternative.
* ``cipher_suites``: Go names are mapped to OpenSSL names for TLS <= 1.2; TLS 1.3 suites are
  accepted and ignored (as Go ignores them); names outside Go's ``tls.CipherSuites()`` are errors.
* ``curve_preferences`` is validated and ignored (OpenSSL's defaults are used).
* ``http2`` is validated and ignored (aiohttp serves HTTP/1.1).
"""

from . import auth, tls
from .auth import auth_middleware
from .config import WebConfig
from .model import WebConfigError
from .watch import WebConfigWatcher

__all__ = [
    "WebConfig",
    "WebConfigError",
    "WebConfigWatcher",
    "auth",
    "auth_middleware",
    "tls",
]
