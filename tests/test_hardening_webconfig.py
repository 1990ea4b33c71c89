"""Issue 20: the web config fails closed (empty/unreadable file while TLS is served refuses
handshakes and requests), bcrypt hashes are validated at load as exporter-toolkit does, passwords
over 72 bytes compare like Go's bcrypt, TLS-1.3-only cipher_suites and duplicate keys refused."""

from __future__ import annotations

import asyncio
import ssl

import bcrypt
import pytest

from exporter.serve.webconfig import WebConfig, WebConfigError, WebConfigWatcher
from tests.test_webconfig_tls import basic, client_ctx, get, serve, tls_cfg, tls_files, write_cfg  # noqa: F401

HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()


@pytest.mark.parametrize("bad", [
    HASH[:4] + "99" + HASH[6:],          # cost 99
    HASH[:4] + "03" + HASH[6:],          # cost 3 (below Go's MinCost)
    "$2$" + HASH[4:],                    # no minor version letter
    "$2x$" + HASH[4:],                   # unknown minor version
])
def test_bcrypt_cost_and_prefix_refused_at_load(tmp_path, bad):
    with pytest.raises(WebConfigError, match="bcrypt"):
        WebConfig.load(write_cfg(tmp_path, f"basic_auth_users:\n  u: '{bad}'\n"))


def test_duplicate_keys_refused(tmp_path):
    p = write_cfg(tmp_path, f"basic_auth_users:\n  u: '{HASH}'\n  u: '{HASH}'\n")
    with pytest.raises(WebConfigError, match="duplicate key"):
        WebConfig.load(p)


def test_tls13_only_cipher_suites_refused(tmp_path, tls_files):  # noqa: F811
    p = write_cfg(tmp_path, tls_cfg(tls_files, "  cipher_suites: [TLS_AES_128_GCM_SHA256]\n"))
    with pytest.raises(WebConfigError, match="only TLS 1.3 suites"):
        WebConfig.load(p)
    p = write_cfg(tmp_path, tls_cfg(tls_files, "  min_version: TLS13\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n"))
    assert WebConfig.load(p).tls_enabled


@pytest.mark.asyncio
async def test_long_password_compares_first_72_bytes(tmp_path, tls_files):  # noqa: F811
    long_pw = "p" * 100
    hashed = bcrypt.hashpw(long_pw.encode()[:72], bcrypt.gensalt(4)).decode()
    srv = await serve(WebConfigWatcher(write_cfg(tmp_path, tls_cfg(tls_files, f"basic_auth_users:\n  u: '{hashed}'\n"))))
    ctx = client_ctx(tls_files)
    try:
        assert (await get(srv.url, ctx, basic("u", long_pw)))[0] == 200
        assert (await get(srv.url, ctx, basic("u", "p" * 72 + "different-tail")))[0] == 200  # as Go
        assert (await get(srv.url, ctx, basic("u", "q" * 100)))[0] == 401
    finally:
        await srv.runner.cleanup()


@pytest.mark.asyncio
async def test_empty_web_config_refuses_handshakes_and_requests(tmp_path, tls_files):  # noqa: F811
    p = write_cfg(tmp_path, tls_cfg(tls_files, f"basic_auth_users:\n  u: '{HASH}'\n"))
    good = p.read_text()
    srv = await serve(WebConfigWatcher(p))
    ctx = client_ctx(tls_files)
    try:
        assert (await get(srv.url, ctx))[0] == 401
        assert (await get(srv.url, ctx, basic("u", "s3cret")))[0] == 200
        p.write_text("")  # emptied (or mid-rewrite): never "no TLS, no auth"
        with pytest.raises((ssl.SSLError, OSError)):
            await get(srv.url, ctx)
        p.write_text("basic_auth_users: {}\n")  # valid, but drops TLS while TLS is served
        with pytest.raises((ssl.SSLError, OSError)):
            await get(srv.url, ctx)
        p.write_text(good)  # restored: auth applies to the very next request
        assert (await get(srv.url, ctx))[0] == 401
        assert (await get(srv.url, ctx, basic("u", "s3cret")))[0] == 200
    finally:
        await srv.runner.cleanup()


@pytest.mark.asyncio
async def test_open_keepalive_connection_gets_500_when_file_breaks(tmp_path, tls_files):  # noqa: F811
    import aiohttp
    p = write_cfg(tmp_path, tls_cfg(tls_files, f"basic_auth_users:\n  u: '{HASH}'\n"))
    srv = await serve(WebConfigWatcher(p))
    ctx = client_ctx(tls_files)
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(srv.url, ssl=ctx, headers=basic("u", "s3cret")) as r:
                assert r.status == 200
            p.write_text("")
            # the same (kept-alive) TLS connection: refused at the HTTP layer
            async with s.get(srv.url, ssl=ctx, headers=basic("u", "s3cret")) as r:
                assert r.status == 500
    finally:
        await srv.runner.cleanup()
    await asyncio.sleep(0)
