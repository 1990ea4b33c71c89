"""Issue 26, review of finding 15 and the looser-file rule: every run-time change of the web config
is enforced at once or refused with the stricter config kept, never applied halfway.

- dropping or widening cipher_suites or curve_preferences, removing or changing a security
  header (HSTS, CSP), turning rate_limit off or raising it: refused like the other loosenings;
- turning TLS on at run time: the listener started plain and stays plain until a restart, so
  every plain request is refused meanwhile (before: "reloaded", and plain HTTP kept answering);
- a file that revokes a user (or changes a password) and also loosens something: the looser
  part is refused, the user part applies at once (before: refused whole, the revoked user kept
  access).
Real listeners and clients, as tests/test_hardening_webconfig2.py."""

from __future__ import annotations

import ssl

import aiohttp
import bcrypt
import pytest

from exporter.render.server_stats import STATS
from exporter.serve.webconfig import WebConfigWatcher
from tests.test_hardening_webconfig2 import HASH, LOOPS, _run, _serve, _status
from tests.test_webconfig_tls import basic, client_ctx, tls_cfg, tls_files, write_cfg  # noqa: F401

HSTS, CSP = "max-age=31536000", "default-src 'none'"
HEADERS = f"http_server_config:\n  headers:\n    Strict-Transport-Security: {HSTS}\n    Content-Security-Policy: \"{CSP}\"\n"
USERS = f"basic_auth_users:\n  u: '{HASH}'\n"


async def _headers(url: str, ctx: ssl.SSLContext | None = None) -> dict[str, str]:
    async with aiohttp.ClientSession() as s, s.get(url, ssl=ctx if ctx is not None else True,
                                                   headers=basic("u", "s3cret")) as r:
        await r.read()
        assert r.status == 200
        return dict(r.headers)


@pytest.mark.parametrize("looser", [
    USERS + f"http_server_config:\n  headers:\n    Content-Security-Policy: \"{CSP}\"\n",  # HSTS dropped
    USERS + f"http_server_config:\n  headers:\n    Strict-Transport-Security: {HSTS}\n",  # CSP dropped
    USERS + f"http_server_config:\n  headers:\n    Strict-Transport-Security: max-age=0\n"
            f"    Content-Security-Policy: \"{CSP}\"\n",  # HSTS weakened
    USERS,  # every header dropped
], ids=["hsts-dropped", "csp-dropped", "hsts-weakened", "all-dropped"])
def test_dropping_or_changing_a_security_header_is_refused(tmp_path, looser):
    async def go() -> None:
        p = write_cfg(tmp_path, USERS + HEADERS)
        srv = await _serve(WebConfigWatcher(p))
        before = STATS.reloads["refused_looser"]
        try:
            assert (await _headers(srv.url))["Strict-Transport-Security"] == HSTS
            p.write_text(looser)
            got = await _headers(srv.url)
            assert got["Strict-Transport-Security"] == HSTS and got["Content-Security-Policy"] == CSP
            assert STATS.reloads["refused_looser"] == before + 1
        finally:
            await srv.runner.cleanup()
    _run("asyncio", go())


@pytest.mark.parametrize("looser", ["", "rate_limit: {interval: 1h, burst: 100}\n",
                                    "rate_limit: {interval: 1s, burst: 2}\n"], ids=["off", "burst-up", "interval-down"])
def test_turning_the_rate_limit_off_or_up_is_refused(tmp_path, looser):
    async def go() -> None:
        p = write_cfg(tmp_path, USERS + "rate_limit: {interval: 1h, burst: 2}\n")
        srv = await _serve(WebConfigWatcher(p))
        try:
            creds = basic("u", "s3cret")
            assert [await _status(srv.url, headers=creds) for _ in range(2)] == [200, 200]
            p.write_text(USERS + looser)
            assert await _status(srv.url, headers=creds) == 429  # the limit in force still holds
        finally:
            await srv.runner.cleanup()
    _run("asyncio", go())


@pytest.mark.parametrize(("field", "before", "after"), [
    ("cipher_suites", "[TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]", None),
    ("cipher_suites", "[TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]",
     "[TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, TLS_RSA_WITH_AES_128_CBC_SHA]"),
    ("curve_preferences", "[X25519]", None),
    ("curve_preferences", "[X25519]", "[X25519, CurveP256]"),
])
def test_dropping_or_widening_ciphers_or_curves_is_refused(tmp_path, tls_files, field, before, after):  # noqa: F811
    p = write_cfg(tmp_path, tls_cfg(tls_files, f"  {field}: {before}\n"))
    watcher = WebConfigWatcher(p)
    kept = getattr(watcher.current().tls, field)
    count = STATS.reloads["refused_looser"]
    p.write_text(tls_cfg(tls_files, f"  {field}: {after}\n" if after else "  min_version: TLS12\n"))
    assert getattr(watcher.current().tls, field) == kept
    assert STATS.reloads["refused_looser"] == count + 1
    p.write_text(tls_cfg(tls_files, f"  {field}: {before}\n  min_version: TLS13\n"))  # tightening applies
    assert watcher.current().tls.min_version == "TLS13"


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_tls_turned_on_at_run_time_refuses_plain_http_until_a_restart(tmp_path, tls_files, caplog,  # noqa: F811
                                                                     loop_kind):
    async def go() -> None:
        p = write_cfg(tmp_path, USERS)
        srv = await _serve(WebConfigWatcher(p))  # a plain listener (TLS off at start)
        try:
            assert await _status(srv.url, headers=basic("u", "s3cret")) == 200
            p.write_text(tls_cfg(tls_files) + USERS)
            assert await _status(srv.url, headers=basic("u", "s3cret")) != 200  # never plain HTTP now
            assert await _status(srv.url) != 200
        finally:
            await srv.runner.cleanup()
        assert any("turns TLS on" in r.getMessage() for r in caplog.records)
        restarted = await _serve(WebConfigWatcher(p))  # a restart serves TLS
        try:
            assert await _status(restarted.url, client_ctx(tls_files), basic("u", "s3cret")) == 200
        finally:
            await restarted.runner.cleanup()
    caplog.set_level("INFO", logger="exporter.serve.webconfig")
    _run(loop_kind, go())


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_a_revoked_user_is_out_at_once_even_when_the_file_also_loosens(tmp_path, tls_files, loop_kind):  # noqa: F811
    other = bcrypt.hashpw(b"other", bcrypt.gensalt(4)).decode()
    scraper = client_ctx(tls_files, "client")
    sans = (f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {tls_files['clientca.pem']}\n"
            "  client_allowed_sans: [scraper.example]\n")

    async def go() -> None:
        p = write_cfg(tmp_path, tls_cfg(tls_files, sans) + HEADERS
                      + f"basic_auth_users:\n  u: '{HASH}'\n  v: '{HASH}'\n  w: '{HASH}'\n")
        srv = await _serve(WebConfigWatcher(p))
        try:
            for user in ("u", "v", "w"):
                assert await _status(srv.url, scraper, basic(user, "s3cret")) == 200
            # v revoked, w's password changed, and the HSTS header and the SAN list dropped
            p.write_text(tls_cfg(tls_files, sans.replace("  client_allowed_sans: [scraper.example]\n", ""))
                         + f"http_server_config:\n  headers:\n    Content-Security-Policy: \"{CSP}\"\n"
                         + f"basic_auth_users:\n  u: '{HASH}'\n  w: '{other}'\n")
            assert await _status(srv.url, scraper, basic("v", "s3cret")) == 401  # revoked at once
            assert await _status(srv.url, scraper, basic("w", "s3cret")) == 401  # old password gone
            assert await _status(srv.url, scraper, basic("w", "other")) == 200
            assert await _status(srv.url, scraper, basic("u", "s3cret")) == 200
            got = await _headers(srv.url, scraper)
            assert got["Strict-Transport-Security"] == HSTS  # the looser part: refused
            intruder = client_ctx(tls_files, "intruder")
            assert await _status(srv.url, intruder, basic("u", "s3cret")) in ("refused", 403)  # SANs kept
        finally:
            await srv.runner.cleanup()
    _run(loop_kind, go())
