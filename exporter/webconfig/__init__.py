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

from . import auth, tls
from .auth import auth_middleware
from .model import WebConfig, WebConfigError
from .watch import WebConfigWatcher

__all__ = [
    "WebConfig",
    "WebConfigError",
    "WebConfigWatcher",
    "auth",
    "auth_middleware",
    "tls",
]
