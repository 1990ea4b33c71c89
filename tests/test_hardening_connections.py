"""Issue 20, High 3: slow and idle clients cannot stop a scraper (header timeout, connection cap
that evicts idle/slow connections, open-files soft limit raised to the hard limit)."""

from __future__ import annotations

import asyncio
import resource
import socket

import pytest
from aiohttp import web

from exporter.serve.server import ConnectionGuard, guard_connections
from tests.e2e_util import http_get, wait_until
from tests.reliability_util import ExporterProcess

SLOW = 2000


def _soft_limit(pid: int) -> int:
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                return int(line.split()[3])
    raise AssertionError("no open-files line")


def test_two_thousand_slow_connections_do_not_stop_a_scraper(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < SLOW + 512:
        pytest.skip(f"open-files hard limit {hard} is below {SLOW + 512}: cannot open the slow clients")
    # the exporter starts with the 1024 soft limit a systemd service gets by default
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:
        exp = ExporterProcess(["--simulate", "--web.max-connections", "256"], tmp_path)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else soft, hard))
    socks: list[socket.socket] = []
    try:
        assert _soft_limit(exp.pid) == (hard if hard != resource.RLIM_INFINITY else _soft_limit(exp.pid))
        assert _soft_limit(exp.pid) > 1024
        for _ in range(SLOW):
            s = socket.socket()
            s.settimeout(5)
            try:
                s.connect(("127.0.0.1", exp.port))
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # never finished
            except OSError:
                s.close()
                continue
            socks.append(s)
        assert len(socks) >= SLOW * 0.9

        def scraped():
            r = http_get(exp.url + "/metrics", timeout=5.0)
            return r.status == 200 and b"unified_gpu_exporter_source_up" in r.body
        wait_until(scraped, timeout=30, what="a scrape through 2,000 slow connections")
        # the slow clients beyond the cap were closed by the exporter, not kept
        closed = 0
        for s in socks:
            s.setblocking(False)
            try:
                if s.recv(1) == b"":
                    closed += 1
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
        assert closed >= SLOW - 256 - 64, closed
        assert exp.proc.poll() is None
    finally:
        for s in socks:
            s.close()
        exp.stop()


async def _serve(guard_kw: dict) -> tuple[web.AppRunner, ConnectionGuard, int]:
    async def ok(_req):
        return web.Response(text="ok")
    app = web.Application()
    app.router.add_get("/", ok)
    runner = web.AppRunner(app, keepalive_timeout=5.0)
    await runner.setup()
    guard = guard_connections(runner, **guard_kw)
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, guard, port


async def _closed(reader: asyncio.StreamReader, deadline: float) -> bool:
    try:
        async with asyncio.timeout(deadline):
            return await reader.read(100) == b""
    except TimeoutError:
        return False


def test_unfinished_request_head_is_closed_after_the_header_timeout():
    async def go():
        runner, guard, port = await _serve({"header_timeout": 0.3})
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET / HTTP/1.1\r\nHost: x\r\n")  # the blank line never comes
            assert await _closed(r, 10.0)
            assert guard.timed_out == 1
            # a complete request on a fresh connection is answered and kept alive
            r2, w2 = await asyncio.open_connection("127.0.0.1", port)
            w2.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await r2.readline()).startswith(b"HTTP/1.1 200")
            w2.close()
        finally:
            await runner.cleanup()
    asyncio.run(go())


def test_cap_evicts_oldest_idle_connection_never_a_busy_one():
    async def go():
        runner, guard, port = await _serve({"max_connections": 4, "header_timeout": 30})
        try:
            idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
            await asyncio.sleep(0)
            scraper = await asyncio.open_connection("127.0.0.1", port)
            scraper[1].write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await asyncio.wait_for(scraper[0].readline(), 10)).startswith(b"HTTP/1.1 200")
            assert await _closed(idle[0][0], 10.0)  # the oldest idle one made room
            assert guard.evicted >= 1
            assert guard.open_connections <= 4
            for _, w in idle:
                w.close()
        finally:
            await runner.cleanup()
    asyncio.run(go())


def test_tls_site_answers_plain_http_with_400_and_caps_silent_clients(tmp_path):
    import ssl
    import subprocess
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-keyout", str(tmp_path / "k.pem"),
                    "-out", str(tmp_path / "c.pem")], check=True, capture_output=True, timeout=60)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    from exporter.serve.server import SniffingTLSSite

    async def go():
        async def ok(_req):
            return web.Response(text="ok")
        app = web.Application()
        app.router.add_get("/", ok)
        runner = web.AppRunner(app)
        await runner.setup()
        guard_connections(runner, max_connections=8)
        site = SniffingTLSSite(runner, "127.0.0.1", 0, ssl_context=ctx, header_timeout=30)
        await site.start()
        try:
            silent = [await asyncio.open_connection("127.0.0.1", site.port) for _ in range(20)]
            r, w = await asyncio.open_connection("127.0.0.1", site.port)
            w.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            data = await asyncio.wait_for(r.read(), 10)
            assert data.startswith(b"HTTP/1.0 400 Bad Request")
            assert site.plain_http_refused == 1
            closed = [await _closed(sr, 5.0) for sr, _ in silent[:10]]
            assert sum(closed) >= 10 - 8  # beyond the cap the oldest silent ones were closed
            client = ssl.create_default_context(cafile=str(tmp_path / "c.pem"))
            r2, w2 = await asyncio.open_connection("127.0.0.1", site.port, ssl=client,
                                                   server_hostname="localhost")
            w2.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await asyncio.wait_for(r2.readline(), 10)).startswith(b"HTTP/1.1 200")
            w2.close()
            for _, sw in silent:
                sw.close()
        finally:
            await runner.cleanup()
    asyncio.run(go())
