"""``WebConfigWatcher``: follows the web config file; an invalid new file refuses everything (fail
closed), a valid looser one is refused and the stricter config in force keeps serving (with the
file's user list, so a user it removes or whose password it changes is out at once)."""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import threading
import time
from pathlib import Path

from ...render.server_stats import STATS
from .config import WebConfig
from .model import _TLS_VERSIONS, WebConfigError
from .tls import ReloadingTLS

log = logging.getLogger("exporter.serve.webconfig")


class WebConfigWatcher:
    """Follows a web-config file: ``current()`` re-parses it when it changed on disk.

    Use ``current`` as the provider for ``auth_middleware`` and ``ssl_context()`` for TCPSite::

        watcher = WebConfigWatcher(path)            # raises WebConfigError at start
        app = web.Application(middlewares=[auth_middleware(watcher.current_async)])
        site = web.TCPSite(runner, host, 9632, ssl_context=watcher.ssl_context())
    """

    def __init__(self, path: str | os.PathLike[str] | None, *, min_check_interval: float = 0.0) -> None:
        self.path = Path(path) if path else None
        # 0: the file is stat()ed on every request, so a change of users applies to the very next
        # request (no window where a removed user still gets in)
        self._min_check = min_check_interval
        self._lock = threading.Lock()
        self._config = WebConfig.load(self.path) if self.path else WebConfig.empty()
        self._enforced = self._config  # the last good config: a reload may not loosen it
        self._refused = ""  # why the last looser file was refused (logged once per reason)
        STATS.web_config = self.path is not None
        self._tls: ReloadingTLS | None = None
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

    def stale(self) -> bool:
        """Whether ``current`` would re-read the file (a ``stat``: never blocks on its content)."""
        if self.path is None or time.monotonic() - self._checked < self._min_check:
            return False
        return self._stat() != self._stamp

    async def current_async(self) -> WebConfig:
        """``current`` for the request path: a re-read (the file changed) runs in a thread, off the
        event loop, so that no file put in the web config's place holds up the server (issue 37:
        a FIFO froze it, /healthz included); an unchanged file is answered at once."""
        if not self.stale():
            return self.current()
        return await asyncio.to_thread(self.current)

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
            # handshake): an unreadable, empty or invalid file refuses every request (500) and
            # handshake until the file is fixed
            try:
                cfg = WebConfig.load(self.path)
            except WebConfigError as e:
                log.error("%s; refusing all requests until it is fixed", e)
                STATS.reloads["invalid"] += 1
                self._config = WebConfig.refusing(str(e), self.path)
                self._refused = ""
                return self._config
            # a valid change may tighten access at once but never loosen it at run time: the
            # stricter config in force keeps serving (a file read in the middle of a non-atomic
            # rewrite is cut short, and a cut-short file drops settings); a restart applies it
            weaker = loosened(self._enforced, cfg)
            if weaker:
                STATS.reloads["refused_looser"] += 1
                # what the file tightens in its users still applies: a user it removes (or whose
                # password it changes) must not keep access because something else was loosened
                users = cfg.users and cfg.users != self._enforced.users
                if weaker != self._refused:  # once per reason, not once per rewrite of the file
                    log.warning("web config %s: %s at run time is refused; the stricter config in force "
                                "keeps serving (restart to apply it)%s", self.path, weaker,
                                "; its basic_auth_users apply now" if users else "")
                self._refused = weaker
                if users:
                    self._enforced = self._enforced.with_users_of(cfg)
                self._config = self._enforced
                return self._config
            self._config = self._enforced = cfg
            self._refused = ""
            STATS.reloads["applied"] += 1
            if cfg.tls_enabled and self._tls is None:
                log.warning("web config %s turns TLS on: the listener started without it and serves plain "
                            "HTTP until a restart, so every request is refused (403) meanwhile", self.path)
            else:
                log.info("web config %s reloaded", self.path)
            return self._config

    def ssl_context(self) -> ssl.SSLContext | None:
        """The listening context (certificates rotate on every handshake), or None without TLS."""
        if not self._config.tls_enabled:
            return None
        if self._tls is None:
            self._tls = ReloadingTLS(self._config, self.current)
        return self._tls.context

    def context_for_new_connection(self) -> ssl.SSLContext:
        """The context a new connection is created with: the current file's client-certificate
        policy, TLS versions and ciphers, which OpenSSL copies when the connection is created
        (SniffingTLSSite's ``context_provider``)."""
        if self._tls is None:
            self.ssl_context()
        assert self._tls is not None, "TLS is not enabled"
        return self._tls.for_new_connection()


# how strongly each client_auth_type checks the client (RequestClientCert is served as none)
_CLIENT_AUTH_RANK = {"NoClientCert": 0, "RequestClientCert": 0, "RequireAnyClientCert": 1,
                     "VerifyClientCertIfGiven": 1, "RequireAndVerifyClientCert": 2}


def loosened(old: WebConfig, new: WebConfig) -> str:
    """What ``new`` drops of ``old``'s protection ("" when nothing): all users, TLS, the
    client-certificate requirement, the client SAN allow-list, TLS versions, cipher suites or
    curves, a security header (removed or changed: a value cannot be ranked), or the rate limit."""
    if old.users and not new.users:
        return "removing basic_auth_users (turning basic auth off)"
    if old.tls_enabled and not new.tls_enabled:
        return "turning TLS off (tls_server_config no longer enables it)"
    for name, value in old.headers.items():
        if new.headers.get(name) != value:
            return f"{'changing' if name in new.headers else 'removing'} the {name} header"
    rate = _rate_loosened(old, new)
    if rate or not (old.tls_enabled and new.tls_enabled):
        return rate
    if _CLIENT_AUTH_RANK[new.tls.client_auth_type] < _CLIENT_AUTH_RANK[old.tls.client_auth_type]:
        return (f"weakening client_auth_type from {old.tls.client_auth_type} to "
                f"{new.tls.client_auth_type}")
    if old.allowed_sans and not new.allowed_sans:
        return "removing client_allowed_sans"
    if _TLS_VERSIONS[new.tls.min_version] < _TLS_VERSIONS[old.tls.min_version]:
        return f"lowering min_version from {old.tls.min_version} to {new.tls.min_version}"
    for field in ("cipher_suites", "curve_preferences"):
        was, now = getattr(old.tls, field), getattr(new.tls, field)
        if was and (not now or set(now) - set(was)):  # empty: every default allowed
            return f"{'removing' if not now else 'widening'} {field}"
    return ""


def _rate_loosened(old: WebConfig, new: WebConfig) -> str:
    """The rate limit turned off, or allowing more (a larger burst or a shorter interval)."""
    was, now = old.rate_limit, new.rate_limit
    if not (was.burst > 0 and was.interval_seconds > 0):
        return ""
    if not (now.burst > 0 and now.interval_seconds > 0):
        return "removing rate_limit"
    if now.burst > was.burst or now.interval_seconds < was.interval_seconds:
        return "raising rate_limit"
    return ""
