"""Import aiohttp's server without the client TLS set-up aiohttp does at import time.

``aiohttp/__init__`` imports the client, and ``aiohttp.connector`` builds two default client
``SSLContext`` objects when imported, each parsing the system CA bundle (OpenSSL's
``set_default_verify_paths``): about 80-100 ms of CPU and 2-3 MB of RSS at every start, measured
on the 2-core bench box.  This program never uses those contexts: its HTTPS clients (upstream
targets, the Kubernetes API) use urllib with contexts of their own, and the aiohttp client only
asks the plain-HTTP cloud metadata services.

So the serving path imports aiohttp with the CA loading skipped: aiohttp's two default client
contexts then trust no certificate at all, and an aiohttp client request over TLS without its own
``ssl=`` context fails verification (fails closed) instead of trusting the system store.  The
``ssl`` module is restored before this returns; contexts made anywhere else are the real ones.
Nothing else runs meanwhile (called once, before the sources and listeners start).
"""

from __future__ import annotations

import ssl
import sys


def import_aiohttp_web() -> None:
    """``import aiohttp.web`` (and the client it pulls in) without loading the CA bundle twice."""
    if "aiohttp" in sys.modules or "set_default_verify_paths" in ssl.SSLContext.__dict__:
        # imported already (tests, an embedding program), or an ssl module this was not written
        # for: the plain import
        import aiohttp.web  # noqa: F401
        return
    real_default_context = ssl.create_default_context

    def context_without_cas(purpose: ssl.Purpose = ssl.Purpose.SERVER_AUTH, *, cafile=None,
                            capath=None, cadata=None) -> ssl.SSLContext:
        # what create_default_context makes for a client, minus the CA store: verifies (and so
        # refuses) every certificate
        return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)

    ssl.create_default_context = context_without_cas  # type: ignore[assignment]
    ssl.SSLContext.set_default_verify_paths = lambda self: None  # type: ignore[method-assign]
    try:
        import aiohttp.web  # noqa: F401
    finally:
        ssl.create_default_context = real_default_context
        del ssl.SSLContext.set_default_verify_paths  # the C method of _ssl._SSLContext again
