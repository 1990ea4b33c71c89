"""Issue 37, item 8: files the daemon re-reads at run time, swapped for a FIFO or a device.  The
web config, its TLS files, an upstream password file: each is read only when it is a regular
file, bounded and never blocking (a FIFO froze the server, /healthz included; /dev/zero took it to
949 MiB), and a changed web config is re-read off the event loop."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from pathlib import Path

from exporter.serve.webconfig import config as webconfig_config
from exporter.serve.webconfig.config import WebConfig
from exporter.serve.webconfig.model import WebConfigError
from exporter.serve.webconfig.watch import WebConfigWatcher
from exporter.sources.context import SourceContext
from exporter.sources.upstream import UpstreamSource
from tests.bounded import in_thread, run_bounded
from tests.test_webconfig_tls import tls_files  # noqa: F401 - the session fixture (openssl PKI)

GOOD = "basic_auth_users:\n  u: $2b$04$0123456789012345678901u0ZxjHBpYV0PVMEuxGuZPuoxx9HWAm2\n"


def _in_thread(fn, timeout: float = 15):  # noqa: ANN001, ANN202
    t, box = in_thread(fn)
    t.join(timeout)
    return t.is_alive(), box


def _unblock(fifo: Path) -> None:
    """Let a reader stuck on the FIFO go (the code before the fix opened it blocking)."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    except OSError:
        pass


def test_a_fifo_in_place_of_the_web_config_refuses_instead_of_freezing(tmp_path):
    path = tmp_path / "web.yml"
    path.write_text(GOOD)
    watcher = WebConfigWatcher(path)
    assert not watcher.current().broken
    path.unlink()
    os.mkfifo(path)
    try:
        hung, box = _in_thread(watcher.current)
        assert not hung, "the re-read of the web config blocks on a FIFO"  # before the fix: for ever
        assert box[0].broken and "not a regular file" in box[0].broken
    finally:
        _unblock(path)


def test_dev_zero_in_place_of_the_web_config_is_not_read():
    code = ("import os, sys, tempfile\n"
            "from exporter.serve.webconfig.watch import WebConfigWatcher\n"
            "d = tempfile.mkdtemp(); p = os.path.join(d, 'web.yml')\n"
            f"open(p, 'w').write({GOOD!r})\n"
            "w = WebConfigWatcher(p)\n"
            "os.unlink(p); os.symlink('/dev/zero', p)\n"
            "print('BROKEN', w.current().broken)\n")
    got = run_bounded(code, timeout=60, mem=700 << 20)  # before the fix: /dev/zero read until killed
    assert got.ok and "BROKEN" in got.out and "not a regular file" in got.out, got.out[-2000:]


def test_a_changed_web_config_is_re_read_off_the_event_loop(tmp_path, monkeypatch):
    path = tmp_path / "web.yml"
    path.write_text(GOOD)
    watcher = WebConfigWatcher(path)
    path.write_text(GOOD + "rate_limit:\n  burst: 5\n  interval: 1s\n")
    threads: list = []
    real = WebConfig.load

    def load(p):  # noqa: ANN001, ANN202
        threads.append(threading.current_thread())
        return real(p)
    monkeypatch.setattr(webconfig_config.WebConfig, "load", staticmethod(load))

    async def request() -> tuple[threading.Thread, WebConfig]:
        return threading.current_thread(), await watcher.current_async()
    loop_thread, cfg = asyncio.run(request())
    assert not cfg.broken and cfg.rate_limit.burst == 5
    assert threads and loop_thread not in threads


def test_tls_files_as_fifos_fail_the_reload_at_once(tmp_path, tls_files):  # noqa: F811
    for f in ("server.pem", "server.key"):
        shutil.copy(tls_files[f], tmp_path / f)
    cert_fifo = tmp_path / "fifo.pem"
    os.mkfifo(cert_fifo)
    path = tmp_path / "web.yml"
    path.write_text(f"tls_server_config:\n  cert_file: {cert_fifo}\n  key_file: {tmp_path / 'server.key'}\n")
    try:
        hung, box = _in_thread(lambda: WebConfig.load(path))
        assert not hung, "loading the web config blocks on a FIFO certificate"
        assert isinstance(box[0], WebConfigError) and "not a regular file" in str(box[0]), box
    finally:
        _unblock(cert_fifo)


def test_an_upstream_password_file_as_a_fifo_fails_at_once(tmp_path):
    fifo = tmp_path / "password"
    os.mkfifo(fifo)
    opts = {"targets": [{"name": "t", "url": "http://127.0.0.1:1/metrics", "exporter": "dcgm-exporter",
                         "basic_auth": {"username": "u", "password_file": str(fifo)}}]}
    try:
        hung, box = _in_thread(lambda: UpstreamSource(SourceContext(options=opts)))
        assert not hung, "reading the password file blocks on a FIFO"
        assert isinstance(box[0], Exception) and "not a regular file" in str(box[0]), box
    finally:
        _unblock(fifo)

