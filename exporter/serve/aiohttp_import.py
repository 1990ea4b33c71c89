"""Import aiohttp's server without aiohttp's client, which this program's serving path never uses.

``aiohttp/__init__`` imports the whole client (``aiohttp.client``, ``connector``, ``client_reqrep``,
``client_ws``, ... about 20 modules: ~0.2 s of CPU and a few MB of RSS at every start, measured on
the 2-core bench box), and ``aiohttp.connector`` builds two default client ``SSLContext`` objects
when imported, each parsing the system CA bundle (OpenSSL's ``set_default_verify_paths``: another
80-100 ms and 2-3 MB).  The server modules (``aiohttp.web`` and what it imports) need nothing of
the package's ``__init__`` but ``__version__``.

So the serving path puts the ``aiohttp`` package in place without running its ``__init__`` yet and
imports ``aiohttp.web`` into it.  The first access to any other name of the package (``import
aiohttp; aiohttp.ClientSession``, ``from aiohttp import ClientTimeout``: the cloud metadata probe)
runs the real ``__init__`` into that same module, at once and whole, so every caller sees the
package aiohttp documents.  Should an aiohttp release need more of its ``__init__`` for the server
modules, the plain import is done instead (the same package, only slower to start).

The client, loaded through a name of the package (``aiohttp.ClientSession``: this program's only
way), loads with the CA loading skipped (a direct ``import aiohttp.connector`` goes through the
import system instead, and loads it as the plain import does): aiohttp's two default client
contexts then trust no certificate at all, and an aiohttp client request over TLS without its own
``ssl=`` context fails verification (fails closed) instead of trusting the system store.  This
program's HTTPS clients (upstream targets, the Kubernetes API) use urllib with contexts of their
own; the aiohttp client only asks the plain-HTTP cloud metadata services.  The ``ssl`` module is
restored before the import returns; contexts made anywhere else are the real ones.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import ssl
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import TypeVar

T = TypeVar("T")
_lock = threading.RLock()


def import_aiohttp_web() -> None:
    """``import aiohttp.web``, leaving aiohttp's client to load on first use (without CA loading)."""
    if "aiohttp" in sys.modules or "set_default_verify_paths" in ssl.SSLContext.__dict__:
        # imported already (tests, an embedding program), or an ssl module this was not written
        # for: the plain import
        import aiohttp.web  # noqa: F401
        return
    spec = importlib.util.find_spec("aiohttp")
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        _without_client_cas(_plain_import)
        return
    version = _init_version(spec.origin)
    if version is None:
        _without_client_cas(_plain_import)
        return
    package = importlib.util.module_from_spec(spec)
    package.__version__ = version  # what aiohttp.http reads of the package (the Server header)
    package.__getattr__ = _completer(package, spec)  # type: ignore[attr-defined]
    sys.modules["aiohttp"] = package
    try:
        import aiohttp.web  # noqa: F401
    except ImportError:
        # this aiohttp's server modules want more of its __init__: start again, the plain way
        for name in [m for m in sys.modules if m == "aiohttp" or m.startswith("aiohttp.")]:
            del sys.modules[name]
        _without_client_cas(_plain_import)


_VERSION = re.compile(r'^__version__ = "([^"\\]+)"$', re.M)


def _init_version(origin: str | None) -> str | None:
    """``__version__`` as aiohttp's ``__init__`` sets it (its first line), read from the file."""
    try:
        with open(origin or "", encoding="utf-8") as fh:
            m = _VERSION.search(fh.read(4096))
    except (OSError, UnicodeDecodeError):
        return None
    return m.group(1) if m else None


def _plain_import() -> None:
    import aiohttp.web  # noqa: F401


def _completer(package: ModuleType, spec) -> Callable[[str], object]:
    """The package's ``__getattr__`` until its ``__init__`` ran: runs it (once), then answers."""
    state = {"running": False, "done": False}

    def complete(name: str) -> object:
        with _lock:  # another thread asking meanwhile waits here for the whole package
            if state["running"]:  # a lookup from inside __init__ itself: not there yet
                raise AttributeError(f"module 'aiohttp' has no attribute {name!r}")
            if state["done"]:  # this thread waited while another ran __init__
                return getattr(package, name)
            if importlib.util.find_spec(f"aiohttp.{name}") is not None:
                # a submodule (``from . import hdrs`` in the server modules, ``from aiohttp import
                # connector``): imported alone, without the CA loading
                return _without_client_cas(lambda: importlib.import_module(f"aiohttp.{name}"))
            state["running"] = True
            try:  # __getattr__ stays ours while __init__ runs: a lookup from another thread waits
                _without_client_cas(lambda: spec.loader.exec_module(package))
                state["done"] = True
            finally:
                state["running"] = False
            if package.__dict__.get("__getattr__") is complete:  # the real __init__ defines none
                del package.__getattr__
        return getattr(package, name)

    return complete


def _without_client_cas(load: Callable[[], T]) -> T:
    """Run ``load`` with ``ssl.create_default_context`` and ``set_default_verify_paths`` not loading
    the CA store in this thread; both restored after.  Other threads (the client may load while
    an upstream or Kubernetes thread makes a context of its own) get the real functions meanwhile."""
    if "set_default_verify_paths" in ssl.SSLContext.__dict__:  # patched already (nested)
        return load()
    real_default_context = ssl.create_default_context
    real_verify_paths = ssl.SSLContext.set_default_verify_paths
    owner = threading.get_ident()

    def default_context(purpose: ssl.Purpose = ssl.Purpose.SERVER_AUTH, *, cafile=None, capath=None,
                        cadata=None) -> ssl.SSLContext:
        if threading.get_ident() != owner:
            return real_default_context(purpose, cafile=cafile, capath=capath, cadata=cadata)
        # what create_default_context makes for a client, minus the CA store: verifies (and so
        # refuses) every certificate
        return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)

    def verify_paths(self: ssl.SSLContext) -> None:
        if threading.get_ident() != owner:
            real_verify_paths(self)

    ssl.create_default_context = default_context  # type: ignore[assignment]
    ssl.SSLContext.set_default_verify_paths = verify_paths  # type: ignore[method-assign]
    try:
        return load()
    finally:
        ssl.create_default_context = real_default_context
        del ssl.SSLContext.set_default_verify_paths  # the C method of _ssl._SSLContext again
