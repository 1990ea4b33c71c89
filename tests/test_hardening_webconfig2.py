"""Issue 26, findings 8 and 15 and the Server header: the web config fails closed for every
content that is not a valid config (whitespace, comments, null, ``---``, ``basic_auth_users:``,
a file cut short by a non-atomic rewrite), a run-time change may tighten access but never loosen
it (a looser file is refused and the stricter config keeps serving), and a tightened
client-certificate policy applies at once (new handshakes and kept-alive connections).  Real TLS,
the listener and middleware wired as ``exporter/cli.py`` does, under asyncio and uvloop."""

from __future__ import annotations

import asyncio
import ssl

import aiohttp
import bcrypt
import pytest
from aiohttp import web

from exporter.render.server_stats import STATS
from exporter.serve.listeners import SniffingTLSSite, guard_connections
from exporter.serve.server import make_app
from exporter.serve.webconfig import WebConfig, WebConfigError, WebConfigWatcher, auth_middleware
from tests.test_webconfig_tls import basic, client_ctx, tls_cfg, tls_files, write_cfg  # noqa: F401

HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()
LOOPS = ["asyncio", "uvloop"]  # uvloop is a dependency (cli.py serves on it)


def _run(loop_kind: str, coro) -> None:
    if loop_kind == "uvloop":
        import uvloop
        uvloop.run(coro)
    else:
        asyncio.run(coro)
NOT_A_CONFIG = ["", "\n", "   \n  \n", "# a comment only\n", "null\n", "~\n", "---\n", "--- # c\n...\n",
                "{}\n", "basic_auth_users:\n", "basic_auth_users: {}\n", "basic_auth_users: null\n"]


class _Served:
    def __init__(self, runner: web.AppRunner, url: str) -> None:
        self.runner, self.url = runner, url


async def _serve(watcher: WebConfigWatcher) -> _Served:
    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(text="up 1\n")
    app = web.Application(middlewares=[auth_middleware(watcher.current)])
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    guard_connections(runner)
    ctx = watcher.ssl_context()
    if ctx is None:
        site: web.BaseSite = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return _Served(runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/metrics")
    # as cli.py wires it (getattr: the same test runs against code without the provider)
    provider = getattr(watcher, "context_for_new_connection", None)
    tls = SniffingTLSSite(runner, "127.0.0.1", 0, ssl_context=ctx,
                          **({"context_provider": provider} if provider else {}))
    await tls.start()
    return _Served(runner, f"https://127.0.0.1:{tls.port}/metrics")


async def _status(url: str, ctx: ssl.SSLContext | None = None, headers: dict | None = None) -> int | str:
    """The status, or "refused" when the handshake or the connection failed."""
    try:
        async with aiohttp.ClientSession() as s, s.get(url, ssl=ctx if ctx is not None else True,
                                                       headers=headers) as r:
            await r.read()
            return r.status
    except (aiohttp.ClientError, ssl.SSLError, OSError):
        return "refused"


@pytest.mark.parametrize("text", NOT_A_CONFIG)
def test_not_a_config_is_refused_at_start(tmp_path, text):
    with pytest.raises(WebConfigError, match="no settings|no users"):
        WebConfig.load(write_cfg(tmp_path, text))


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_plain_http_basic_auth_never_turns_off_by_rewriting_the_file(tmp_path, loop_kind):
    async def go() -> None:
        good = f"basic_auth_users:\n  u: '{HASH}'\n"
        p = write_cfg(tmp_path, good)
        srv = await _serve(WebConfigWatcher(p))
        try:
            assert await _status(srv.url) == 401
            for text in NOT_A_CONFIG:  # not a config: everything refused until it is fixed
                p.write_text(text)
                assert await _status(srv.url) == 500, text  # never 200 without credentials
                assert await _status(srv.url, headers=basic("u", "s3cret")) == 500, text
                p.write_text(good)
                assert await _status(srv.url) == 401
                assert await _status(srv.url, headers=basic("u", "s3cret")) == 200
            # a valid config without users: refused, the users in force keep being asked for
            p.write_text("http_server_config: {headers: {X-Frame-Options: deny}}\n")
            assert await _status(srv.url) == 401
            assert await _status(srv.url, headers=basic("u", "s3cret")) == 200
        finally:
            await srv.runner.cleanup()
    _run(loop_kind, go())


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_a_file_cut_short_mid_rewrite_never_serves_without_auth(tmp_path, tls_files, loop_kind):  # noqa: F811
    """Every prefix of the file (as a reader sees it during a non-atomic rewrite): no request
    without a client certificate or without credentials gets a 200."""
    async def go() -> None:
        good = tls_cfg(tls_files, f"  client_auth_type: RequireAndVerifyClientCert\n"
                                  f"  client_ca_file: {tls_files['clientca.pem']}\n"
                                  f"  client_allowed_sans: [scraper.example]\n"
                                  f"basic_auth_users:\n  u: '{HASH}'\n  v: '{HASH}'\n")
        p = write_cfg(tmp_path, good)
        srv = await _serve(WebConfigWatcher(p))
        with_cert, without = client_ctx(tls_files, "client"), client_ctx(tls_files)
        try:
            assert await _status(srv.url, with_cert, basic("u", "s3cret")) == 200
            cuts = sorted({good.find("\n", i) + 1 for i in range(0, len(good), 7)} | set(range(0, len(good), 13)))
            for cut in cuts:
                if cut in (0, len(good)):
                    continue
                p.write_text(good[:cut])
                assert await _status(srv.url, without) != 200, good[:cut]
                assert await _status(srv.url, with_cert) != 200, good[:cut]
            p.write_text(good)
            assert await _status(srv.url, with_cert, basic("u", "s3cret")) == 200
        finally:
            await srv.runner.cleanup()
    _run(loop_kind, go())


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_tightened_client_cert_policy_applies_at_once(tmp_path, tls_files, loop_kind):  # noqa: F811
    async def go() -> None:
        p = write_cfg(tmp_path, tls_cfg(tls_files))
        srv = await _serve(WebConfigWatcher(p))
        without, with_cert = client_ctx(tls_files), client_ctx(tls_files, "client")
        try:
            async with aiohttp.ClientSession() as kept:  # a keep-alive connection without a cert
                async with kept.get(srv.url, ssl=without) as r:
                    assert r.status == 200
                p.write_text(tls_cfg(tls_files, "  client_auth_type: RequireAndVerifyClientCert\n"
                                                f"  client_ca_file: {tls_files['clientca.pem']}\n"))
                assert await _status(srv.url, without) == "refused"  # a new handshake
                assert await _status(srv.url, with_cert) == 200
                status: int | str
                try:  # the kept connection: closed, never answered 200
                    async with kept.get(srv.url, ssl=without) as r:
                        status = r.status
                except aiohttp.ClientError:
                    status = "closed"
                assert status != 200
            # loosening back at run time is refused: the stricter policy keeps serving
            p.write_text(tls_cfg(tls_files))
            assert await _status(srv.url, without) == "refused"
            assert await _status(srv.url, with_cert) == 200
        finally:
            await srv.runner.cleanup()
    _run(loop_kind, go())


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_min_version_raised_at_run_time_applies_at_once(tmp_path, tls_files, loop_kind):  # noqa: F811
    async def go() -> None:
        p = write_cfg(tmp_path, tls_cfg(tls_files))
        srv = await _serve(WebConfigWatcher(p))
        tls12 = client_ctx(tls_files, maximum_version=ssl.TLSVersion.TLSv1_2)
        try:
            assert await _status(srv.url, tls12) == 200
            p.write_text(tls_cfg(tls_files, "  min_version: TLS13\n"))
            assert await _status(srv.url, tls12) == "refused"
            assert await _status(srv.url, client_ctx(tls_files)) == 200
        finally:
            await srv.runner.cleanup()
    _run(loop_kind, go())


def _strict(files, drop: str = "") -> str:
    """TLS 1.3 only, a verified client certificate with an allowed SAN, basic auth; ``drop``
    leaves one of them out (a looser file)."""
    parts = {
        "client_auth": (f"  client_auth_type: RequireAndVerifyClientCert\n"
                        f"  client_ca_file: {files['clientca.pem']}\n"),
        "sans": "  client_allowed_sans: [scraper.example]\n",
        "min_version": "  min_version: TLS13\n",
    }
    if drop == "client_auth":  # no client certificate at all: the SAN list must go with it
        parts.pop("sans")
    tls = "".join(v for k, v in parts.items() if k != drop)
    users = "" if drop == "users" else f"basic_auth_users:\n  u: '{HASH}'\n"
    if drop == "tls":
        return users + "http_server_config: {headers: {X-Frame-Options: deny}}\n"
    return tls_cfg(files, tls) + users


LOOSER = ["users", "client_auth", "sans", "min_version", "tls"]


@pytest.mark.parametrize("loop_kind", LOOPS)
@pytest.mark.parametrize("drop", LOOSER)
def test_a_looser_file_is_refused_and_the_stricter_one_keeps_serving(tmp_path, tls_files, caplog, drop,  # noqa: F811
                                                                       loop_kind):
    """A valid file that loosens access at run time: refused, logged once, counted; the config
    in force keeps serving (no 500, no failed handshake for a client it admits); a restart applies
    it.  Before: everything was refused until the file was undone or the exporter restarted."""
    scraper, no_cert = client_ctx(tls_files, "client"), client_ctx(tls_files)
    tls12 = client_ctx(tls_files, "client", maximum_version=ssl.TLSVersion.TLSv1_2)
    intruder = client_ctx(tls_files, "intruder")  # a verified certificate without the allowed SAN
    creds = basic("u", "s3cret")

    async def go() -> None:
        p = write_cfg(tmp_path, _strict(tls_files))
        srv = await _serve(WebConfigWatcher(p))
        before = dict(STATS.reloads)
        try:
            assert await _status(srv.url, scraper, creds) == 200
            for text in (_strict(tls_files, drop), _strict(tls_files, drop) + "# rewritten\n"):
                p.write_text(text)  # twice: counted each time, logged once
                assert await _status(srv.url, scraper, creds) == 200  # still served, never 500
                assert await _status(srv.url, scraper) == 401  # users still asked for
                assert await _status(srv.url, no_cert, creds) == "refused"  # client cert still required
                assert await _status(srv.url, intruder, creds) in ("refused", 403)  # SANs still checked
                assert await _status(srv.url, tls12, creds) == "refused"  # TLS 1.3 still required
            assert STATS.reloads["refused_looser"] - before["refused_looser"] == 2
            assert STATS.reloads["invalid"] == before["invalid"]
        finally:
            await srv.runner.cleanup()
        logged = [r for r in caplog.records if "at run time is refused" in r.getMessage()]
        assert len(logged) == 1 and "stricter config in force keeps serving" in logged[0].getMessage()
        restarted = await _serve(WebConfigWatcher(p))  # a restart applies the looser file
        try:
            looser = {"users": (scraper, None), "client_auth": (no_cert, creds), "sans": (intruder, creds),
                      "min_version": (tls12, creds), "tls": (None, creds)}[drop]
            assert await _status(restarted.url, *looser) == 200
        finally:
            await restarted.runner.cleanup()
    caplog.set_level("INFO", logger="exporter.serve.webconfig")
    _run(loop_kind, go())


@pytest.mark.asyncio
async def test_no_server_header_discloses_versions(tmp_path):
    from exporter.run.daemon import Daemon, Settings
    app = make_app(Daemon(Settings(simulate="demo")))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        for raw in (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", b"BROKEN\x00 / HTTP/1.1\r\n\r\n"):
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(raw)
            head = (await asyncio.wait_for(r.read(4096), 10)).split(b"\r\n\r\n")[0]
            w.close()
            server = [h for h in head.split(b"\r\n") if h.lower().startswith(b"server:")]
            assert all(b"python" not in h.lower() and b"aiohttp" not in h.lower() for h in server), head
    finally:
        await runner.cleanup()


@pytest.mark.asyncio
async def test_unique_wrong_passwords_never_queue_a_verified_scraper(tmp_path, monkeypatch):
    """300 clients with unique wrong passwords (each one bcrypt, one at a time, as in
    exporter-toolkit) evict only other failures: a scraper verified once is answered from the
    cache while every one of them still waits for bcrypt (held here until the scraper has its
    answer: a condition, not a race against the clock)."""
    import threading

    from exporter.serve.webconfig import auth
    p = write_cfg(tmp_path, f"basic_auth_users:\n  u: '{HASH}'\n")
    watcher = WebConfigWatcher(p)
    srv = await _serve(watcher)
    held, real = threading.Event(), auth._bcrypt_ok
    waiting = 0

    def gated(password: bytes, hashed: bytes) -> bool:
        nonlocal waiting
        waiting += 1
        held.wait(30)  # bounded: released as soon as the scraper was answered
        return real(password, hashed)
    done = 0

    async def wrong(i: int) -> None:
        nonlocal done
        async with aiohttp.ClientSession() as s, s.get(srv.url, headers=basic("u", f"no-{i}")) as r:
            assert r.status == 401
        done += 1
    try:
        assert await _status(srv.url, headers=basic("u", "s3cret")) == 200  # verified once
        await asyncio.gather(*(wrong(i) for i in range(300)))  # the first wave fills the cache
        monkeypatch.setattr(auth, "_bcrypt_ok", gated)
        done = 0
        wave = [asyncio.ensure_future(wrong(1000 + i)) for i in range(300)]
        while waiting < 1:  # the wave is in the bcrypt queue, its first check held
            await asyncio.sleep(0.005)
        answer = await asyncio.wait_for(_status(srv.url, headers=basic("u", "s3cret")), 20)
        assert answer == 200 and done == 0  # answered while the whole wave still waited
        held.set()
        await asyncio.gather(*wave)
        assert done == 300
    finally:
        held.set()
        await srv.runner.cleanup()
