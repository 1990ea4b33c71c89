"""Issue 26, findings 6 and 7: idle keep-alive connections and stalled TLS handshakes count in
the connection cap and are evicted to make room; a connection in a request never is.  Real
aiohttp server and real TLS on loopback, under asyncio and uvloop."""

from __future__ import annotations

import asyncio
import ssl
import subprocess

import pytest
from aiohttp import web

from exporter.render.server_stats import STATS
from exporter.serve import listeners
from exporter.serve.listeners import SniffingTLSSite, guard_connections

LOOPS = ["asyncio"]
try:
    import uvloop
    LOOPS.append("uvloop")
except ImportError:  # pragma: no cover - uvloop is a dependency
    uvloop = None


def _run(loop_kind: str, coro) -> None:
    if loop_kind == "uvloop":
        uvloop.run(coro)
    else:
        asyncio.run(coro)


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", str(d / "k.pem"), "-out", str(d / "c.pem")],
                   check=True, capture_output=True, timeout=60)
    return d / "c.pem", d / "k.pem"


async def _app_runner(release: asyncio.Event | None = None) -> web.AppRunner:
    async def ok(_req):
        return web.Response(text="ok")

    async def hold(_req):  # a request in progress until the test releases it
        assert release is not None
        await release.wait()
        return web.Response(text="held")
    app = web.Application()
    app.router.add_get("/", ok)
    app.router.add_get("/hold", hold)
    runner = web.AppRunner(app, keepalive_timeout=120.0)  # aiohttp itself would not close them
    await runner.setup()
    return runner


async def _get(reader, writer, path: str = "/") -> bytes:
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    status = await asyncio.wait_for(reader.readline(), 10)
    length = 0
    while (line := await asyncio.wait_for(reader.readline(), 10)) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    await asyncio.wait_for(reader.readexactly(length), 10)
    return status


async def _closed_by_server(reader: asyncio.StreamReader, timeout: float) -> bool:
    try:
        async with asyncio.timeout(timeout):
            while True:
                data = await reader.read(4096)
                if data == b"":
                    return True
    except TimeoutError:
        return False
    except (ConnectionError, OSError):
        return True


async def _count_closed(readers, want: int, timeout: float) -> int:
    """How many of ``readers`` the server closed, waiting up to ``timeout`` for ``want``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    closed: set[int] = set()
    while len(closed) < want and loop.time() < deadline:
        for i, r in enumerate(readers):
            if i not in closed and (r.at_eof() or r.exception() is not None):
                closed.add(i)
        await asyncio.sleep(0.05)
    return len(closed)


async def _drainer(reader: asyncio.StreamReader) -> None:
    with_suppressed = (ConnectionError, OSError, asyncio.CancelledError)
    try:
        while await reader.read(4096):
            pass
    except with_suppressed:
        pass


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_idle_keepalive_connections_are_evicted_for_scrapes(loop_kind):
    cap = 8

    async def go():
        runner = await _app_runner()
        guard = guard_connections(runner, max_connections=cap, header_timeout=30)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            idle = []
            for _ in range(cap):  # each answered once, then kept open and silent
                r, w = await asyncio.open_connection("127.0.0.1", port)
                assert (await _get(r, w)).startswith(b"HTTP/1.1 200")
                idle.append((r, w))
            ok = 0
            for _ in range(20):
                r, w = await asyncio.open_connection("127.0.0.1", port)
                try:
                    ok += (await _get(r, w)).startswith(b"HTTP/1.1 200")
                except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
                    pass
                w.close()
                assert guard.open_connections <= cap
            assert ok == 20
            assert guard.evicted >= 1
            assert [await _closed_by_server(r, 5.0) for r, _ in idle[:1]] == [True]
            for _, w in idle:
                w.close()
        finally:
            await runner.cleanup()
    _run(loop_kind, go())


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_connection_in_a_request_is_never_evicted(loop_kind):
    cap = 4

    async def go():
        release = asyncio.Event()
        runner = await _app_runner(release)
        guard = guard_connections(runner, max_connections=cap, header_timeout=30)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            held = []
            for _ in range(cap):
                r, w = await asyncio.open_connection("127.0.0.1", port)
                w.write(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
                held.append((r, w))
            while guard.open_connections < cap or not all(c.busy for c in guard._open.values()):
                await asyncio.sleep(0.02)
            r, w = await asyncio.open_connection("127.0.0.1", port)
            assert (await _get(r, w)).startswith(b"HTTP/1.1 200")  # admitted over the cap
            w.close()
            assert guard.evicted == 0
            release.set()
            for r, _ in held:
                assert (await asyncio.wait_for(r.readline(), 10)).startswith(b"HTTP/1.1 200")
            for _, w in held:
                w.close()
        finally:
            await runner.cleanup()
    _run(loop_kind, go())


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_stalled_tls_handshakes_count_in_the_cap(loop_kind, cert):
    """Clients that send one byte of a ClientHello are evicted long before the 30 s handshake
    timeout once the cap is reached, and a real TLS scrape goes through."""
    cap, attackers = 8, 40
    crt, key = cert
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(crt, key)

    async def go():
        runner = await _app_runner()
        guard = guard_connections(runner, max_connections=cap, header_timeout=30)
        site = SniffingTLSSite(runner, "127.0.0.1", 0, ssl_context=ctx, header_timeout=30)
        await site.start()
        try:
            stalled = []
            for _ in range(attackers):
                r, w = await asyncio.open_connection("127.0.0.1", site.port)
                w.write(b"\x16")  # the first byte of a TLS record, and nothing more
                stalled.append((r, w))
            closed = await _count_closed([r for r, _ in stalled], attackers - cap, 20.0)
            assert closed >= attackers - cap, closed
            assert guard.open_connections <= cap
            client = ssl.create_default_context(cafile=str(crt))
            ok = 0
            for _ in range(5):
                r, w = await asyncio.open_connection("127.0.0.1", site.port, ssl=client,
                                                     server_hostname="localhost")
                ok += (await _get(r, w)).startswith(b"HTTP/1.1 200")
                w.close()
            assert ok == 5
            for _, w in stalled:
                w.close()
        finally:
            await runner.cleanup()
    _run(loop_kind, go())


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_stalled_tls_handshake_below_the_cap_is_closed_at_the_handshake_timeout(loop_kind, cert):
    """One client, far below the cap, sends one byte of a ClientHello and nothing more: the
    handshake timeout alone (here 0.5 s; asyncio's default is 60 s) closes it and frees its
    place in the cap."""
    crt, key = cert
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(crt, key)

    async def go():
        runner = await _app_runner()
        guard = guard_connections(runner, max_connections=64, header_timeout=30)
        site = SniffingTLSSite(runner, "127.0.0.1", 0, ssl_context=ctx, header_timeout=0.5)
        await site.start()
        try:
            r, w = await asyncio.open_connection("127.0.0.1", site.port)
            w.write(b"\x16")  # the first byte of a TLS record: the listener starts the handshake
            while guard.open_connections < 1:
                await asyncio.sleep(0.01)
            started = asyncio.get_running_loop().time()
            assert await _closed_by_server(r, 20.0)  # not left to asyncio's 60 s default
            assert asyncio.get_running_loop().time() - started >= 0.4  # by the timeout, not at once
            while guard.open_connections:  # its place in the cap is free again
                await asyncio.sleep(0.01)
            assert guard.evicted == 0  # the timeout closed it, not the cap
            w.close()
        finally:
            await runner.cleanup()
    _run(loop_kind, go())


def test_idle_eviction_self_check_finds_the_attributes_it_reads():
    async def go():
        runner = await _app_runner()
        try:
            guard = guard_connections(runner)
            assert listeners.idle_check(runner.server._server) == "" and guard.idle_eviction
            assert STATS.eviction is True
        finally:
            await runner.cleanup()
    asyncio.run(go())


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_without_the_attributes_idle_eviction_is_off_loudly(loop_kind, monkeypatch, caplog):
    """An aiohttp whose protocol lacks what the check reads (renamed in a release): a warning,
    the self-metric says 0, and a connection after its first request is never evicted (rather
    than guessed idle); new connections are admitted over the cap instead."""
    monkeypatch.setattr(listeners, "_IDLE_ATTRS", ("_waiter", "_renamed_in_a_later_release"))
    cap = 4

    async def go():
        runner = await _app_runner()
        guard = guard_connections(runner, max_connections=cap, header_timeout=30)
        assert not guard.idle_eviction and STATS.eviction is False
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            idle = []
            for _ in range(cap):
                r, w = await asyncio.open_connection("127.0.0.1", port)
                assert (await _get(r, w)).startswith(b"HTTP/1.1 200")
                idle.append((r, w))
            r, w = await asyncio.open_connection("127.0.0.1", port)
            assert (await _get(r, w)).startswith(b"HTTP/1.1 200")  # admitted over the cap
            w.close()
            assert guard.evicted == 0
            for _, w in idle:
                w.close()
        finally:
            await runner.cleanup()
    _run(loop_kind, go())
    warned = [r for r in caplog.records if "cannot be evicted" in r.getMessage()]
    assert warned and "_renamed_in_a_later_release" in warned[0].getMessage()
    text = _exposition()
    assert "unified_gpu_exporter_idle_connection_eviction 0" in text


def _exposition() -> str:
    from exporter.map.schema import default_mappings_dir, load_schema
    from exporter.map.store import Store
    from exporter.render.exposition import Renderer
    schema = load_schema(default_mappings_dir() / "canonical.yaml")
    return Renderer(schema).render(Store()).text.decode()
