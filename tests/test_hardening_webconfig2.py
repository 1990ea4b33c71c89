"""Issue 26, findings 8 and 15 and the Server header: the web config fails closed for every
content that is not a valid config (whitespace, comments, null, ``---``, ``basic_auth_users:``,
a file cut short by a non-atomic rewrite), a run-time change may tighten access but never loosen
it, and a tightened client-certificate policy applies at once (new handshakes and kept-alive
connections).  Real TLS, the listener and middleware wired as ``exporter/cli.py`` does."""

from __future__ import annotations

import asyncio
import ssl

import aiohttp
import bcrypt
import pytest
from aiohttp import web

from exporter.serve.listeners import SniffingTLSSite, guard_connections
from exporter.serve.server import make_app
from exporter.serve.webconfig import WebConfig, WebConfigError, WebConfigWatcher, auth_middleware
from tests.test_webconfig_tls import basic, client_ctx, tls_cfg, tls_files, write_cfg  # noqa: F401

HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()
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


@pytest.mark.asyncio
async def test_plain_http_basic_auth_never_turns_off_by_rewriting_the_file(tmp_path):
    good = f"basic_auth_users:\n  u: '{HASH}'\n"
    p = write_cfg(tmp_path, good)
    srv = await _serve(WebConfigWatcher(p))
    try:
        assert await _status(srv.url) == 401
        for text in NOT_A_CONFIG + ["http_server_config: {headers: {X-Frame-Options: deny}}\n"]:
            p.write_text(text)
            assert await _status(srv.url) == 500, text  # never 200 without credentials
            assert await _status(srv.url, headers=basic("u", "s3cret")) == 500, text
            p.write_text(good)
            assert await _status(srv.url) == 401
            assert await _status(srv.url, headers=basic("u", "s3cret")) == 200
    finally:
        await srv.runner.cleanup()


@pytest.mark.asyncio
async def test_a_file_cut_short_mid_rewrite_never_serves_without_auth(tmp_path, tls_files):  # noqa: F811
    """Every prefix of the file (as a reader sees it during a non-atomic rewrite): no request
    without a client certificate or without credentials gets a 200."""
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


@pytest.mark.asyncio
async def test_tightened_client_cert_policy_applies_at_once(tmp_path, tls_files):  # noqa: F811
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
        # loosening back at run time is refused (restart to apply), never "no client cert"
        p.write_text(tls_cfg(tls_files))
        assert await _status(srv.url, without) != 200
        assert await _status(srv.url, with_cert) != 200
    finally:
        await srv.runner.cleanup()


@pytest.mark.asyncio
async def test_min_version_raised_at_run_time_applies_at_once(tmp_path, tls_files):  # noqa: F811
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
async def test_unique_wrong_passwords_never_queue_a_verified_scraper(tmp_path):
    """300 clients with unique wrong passwords (each one bcrypt, one at a time, as in
    exporter-toolkit) evict only other failures: a scraper verified once is answered from the
    cache while they wait, not after them."""
    # cost 7 (~14 ms a check here): the wave queues ~4 s, so arrivals outrun the checks on a busy box
    cost = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(7)).decode()
    p = write_cfg(tmp_path, f"basic_auth_users:\n  u: '{cost}'\n")
    watcher = WebConfigWatcher(p)
    arrived = 0

    class Counting:  # counts the requests that reached the middleware
        def current(self) -> WebConfig:
            nonlocal arrived
            arrived += 1
            return watcher.current()

        def __getattr__(self, name):
            return getattr(watcher, name)
    srv = await _serve(Counting())  # type: ignore[arg-type]
    done = 0

    async def wrong(i: int) -> None:
        nonlocal done
        async with aiohttp.ClientSession() as s, s.get(srv.url, headers=basic("u", f"no-{i}")) as r:
            assert r.status == 401
        done += 1
    try:
        assert await _status(srv.url, headers=basic("u", "s3cret")) == 200  # verified once
        await asyncio.gather(*(wrong(i) for i in range(300)))  # the first wave fills the cache
        done, before = 0, arrived
        wave = [asyncio.ensure_future(wrong(1000 + i)) for i in range(300)]
        while arrived < before + 300:  # the whole wave waits in the bcrypt queue
            await asyncio.sleep(0.005)
        assert await _status(srv.url, headers=basic("u", "s3cret")) == 200
        assert done < 150, done  # answered while most of the wave still waited, not after it
        await asyncio.gather(*wave)
    finally:
        await srv.runner.cleanup()
