"""``WebConfigWatcher``: follows the web config file; a bad new file refuses, fail closed."""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from pathlib import Path

from .model import WebConfig, WebConfigError

log = logging.getLogger("exporter.webconfig")


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
