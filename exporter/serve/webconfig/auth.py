"""Basic auth (bcrypt), security headers and the rate limit, as one aiohttp middleware."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import inspect
import ipaddress
import logging
import ssl
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import bcrypt
from aiohttp import web

from .config import WebConfig
from .model import _TLS_VERSIONS, BCRYPT_MAX_PASSWORD

log = logging.getLogger("exporter.serve.webconfig")

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


class _LRU:
    def __init__(self, size: int) -> None:
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


class _AuthCache:
    """bcrypt results keyed by sha256(user, hash, password) (no plaintext kept), in two bounded
    LRUs: successes and failures.  Wrong passwords, however many and however unique, evict only
    other failures, so a scraper verified once never waits behind them in the bcrypt queue
    (exporter-toolkit keeps one 100-entry cache for both)."""

    def __init__(self, size: int = 256, ok_size: int = 64) -> None:
        self._ok = _LRU(ok_size)
        self._bad = _LRU(size)

    def get(self, key: bytes) -> bool | None:
        return True if self._ok.get(key) else self._bad.get(key)

    def set(self, key: bytes, ok: bool) -> None:
        (self._ok if ok else self._bad).set(key, ok)


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


_TLS_VERSION_OF = {"TLSv1": ssl.TLSVersion.TLSv1, "TLSv1.1": ssl.TLSVersion.TLSv1_1,
                   "TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


def _meets_tls_policy(cfg: WebConfig, request: web.Request) -> bool:
    """Whether the request's TLS connection was made under a policy at least as strict as the
    current one (a verified client certificate where one is required, min_version).  A plain
    request while the config says TLS (turned on at run time: the listener started without it
    and only a restart makes it a TLS one) never is."""
    if not cfg.tls_enabled:
        return True
    transport = request.transport
    sslobj = transport.get_extra_info("ssl_object") if transport is not None else None
    if sslobj is None:
        return False
    if cfg.tls.client_auth_type == "RequireAndVerifyClientCert" and not transport.get_extra_info("peercert"):
        return False
    version = _TLS_VERSION_OF.get(sslobj.version() or "", ssl.TLSVersion.TLSv1)
    return version >= _TLS_VERSIONS[cfg.tls.min_version]


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


def auth_middleware(webconfig_provider: Callable[[], WebConfig | Awaitable[WebConfig]]) -> Any:
    """aiohttp middleware: rate limit, client SAN allow-list, basic auth, security headers.

    ``webconfig_provider`` is called per request (``WebConfigWatcher.current_async``, which
    re-reads a changed file off the event loop; a plain function returning the config is taken
    too).  Wrong or
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
            # an unknown user with the fake hash's password is a failure too: only real
            # successes enter (and can evict entries of) the success cache
            ok = ok and known
            cache.set(key, ok)
        # bcrypt.checkpw compares the digests in constant time; unknown users cost one bcrypt too
        return ok and known

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        got = webconfig_provider()
        cfg = await got if inspect.isawaitable(got) else got
        if cfg.broken:
            return _plain(500, "Internal Server Error", cfg)
        if not _meets_tls_policy(cfg, request):
            # a keep-alive connection made before the client-certificate policy or min_version
            # was tightened: closed without an answer, so the client (Go's transport retries an
            # idempotent request) reconnects under the policy in force now
            if request.transport is not None:
                request.transport.abort()
            return _plain(403, "Forbidden", cfg)
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
