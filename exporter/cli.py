"""Command line, following Prometheus exporter conventions (node_exporter-style flags)."""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import signal
import sys
from pathlib import Path

from .logs import setup_logging
from .run import gctune
from .run.argparsing import DEFAULT_PORT, build_parser, settings_from
from .run.baseline_file import check_state_dir
from .run.collector_policy import counts_fdinfo, runs_collector
from .run.daemon import Daemon
from .run.loading import Loaded, prepare
from .run.oneshot import list_devices, run_once
from .run.settings import Settings
from .yamlfile import ConfigError

log = logging.getLogger("unified_gpu_exporter")
async def _serve(args: argparse.Namespace, daemon: Daemon, counter=None) -> int:
    from .serve.aiohttp_import import import_aiohttp_web

    import_aiohttp_web()  # before anything imports aiohttp: its unused client CA loading skipped
    from aiohttp import web

    from .serve.server import (
        KEEPALIVE_TIMEOUT,
        SniffingTLSSite,
        guard_connections,
        make_app,
        raise_nofile_limit,
    )

    soft, hard = raise_nofile_limit()
    log.debug("open-files limit", extra={"soft": soft, "hard": hard})
    middlewares = []
    ssl_ctx = None
    context_provider = None  # with TLS: each new connection gets the current file's policy
    if args.web_config is not None:  # validated in main(); without one: plain HTTP, no auth
        # imported only here: the TLS/basic-auth code (pydantic models, bcrypt) costs start-up
        # time and memory that a node without a web config never uses
        from .serve.webconfig import WebConfigWatcher, auth_middleware

        watcher = WebConfigWatcher(args.web_config)
        ssl_ctx = watcher.ssl_context()
        if ssl_ctx is not None:
            context_provider = watcher.context_for_new_connection
        middlewares.append(auth_middleware(watcher.current_async))
    await daemon.start()
    app = make_app(daemon, args.telemetry_path, middlewares=middlewares)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5,
                           keepalive_timeout=KEEPALIVE_TIMEOUT)
    await runner.setup()
    guard_connections(runner, args.max_connections)
    scheme = "https" if ssl_ctx is not None else "http"
    if args.systemd_socket:
        for sock in systemd_sockets():
            if ssl_ctx is not None:  # plain HTTP on the TLS port gets a 400, as from Go
                await SniffingTLSSite(runner, ssl_context=ssl_ctx, sock=sock,
                                      context_provider=context_provider).start()
            else:
                await web.SockSite(runner, sock).start()
            log.info("listening on systemd socket", extra={"address": str(sock.getsockname()),
                                                           "scheme": scheme})
    for host, port in args.listen or ([] if args.systemd_socket else [(None, DEFAULT_PORT)]):
        if ssl_ctx is not None:
            site: web.BaseSite = SniffingTLSSite(runner, host, port, ssl_context=ssl_ctx,
                                                 context_provider=context_provider)
        else:
            site = web.TCPSite(runner, host, port, reuse_address=True)
        await site.start()
        log.info("listening", extra={"address": f"{host or ''}:{port}", "scheme": scheme,
                                     "path": args.telemetry_path})
    if daemon.settings.state_dir is not None:
        log.info("baselines persist", extra={"state_dir": str(daemon.settings.state_dir)})
    else:
        log.warning("no --state.dir and no $STATE_DIRECTORY: learned baselines are lost on restart")
    if daemon.settings.simulate:
        log.warning("serving the SIMULATED node: values are synthetic",
                    extra={"scenario": daemon.settings.simulate})

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGHUP, daemon.request_reload)  # coalesced, one at a time
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    status = [0]
    if counter is not None:  # its supervisor gone: the count cannot come back; exit 1 to be restarted
        def dead() -> None:
            status[0] = 1
            stop.set()

        def on_dead() -> None:  # a poll thread's
            try:
                loop.call_soon_threadsafe(dead)
            except RuntimeError:  # the loop is closing: exiting already
                pass
        counter.on_dead = on_dead
    await stop.wait()
    log.info("shutting down")
    # the listeners close and the sources stop (baselines saved) at the same time, within one
    # second in all: a supervisor's SIGTERM is answered promptly even with a hung source
    await _bounded(asyncio.gather(runner.cleanup(), daemon.stop()), 1.0)
    return status[0]


def systemd_sockets() -> list:
    """Listening sockets handed over by systemd socket activation (LISTEN_FDS from fd 3)."""
    import os
    import socket

    if os.environ.get("LISTEN_PID", str(os.getpid())) != str(os.getpid()):
        raise ConfigError("--web.systemd-socket: LISTEN_PID is not this process")
    count = int(os.environ.get("LISTEN_FDS", "0") or 0)
    if count < 1:
        raise ConfigError("--web.systemd-socket: no sockets passed (LISTEN_FDS is unset or 0)")
    return [socket.socket(fileno=3 + i) for i in range(count)]


async def _bounded(coro, timeout: float) -> None:
    try:
        await asyncio.wait_for(coro, timeout)
    except (TimeoutError, asyncio.CancelledError):
        pass


def _run(coro) -> int:
    try:
        import uvloop  # noqa: F401

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "import":
        from .importers.cli import main as import_main

        return _quiet_broken_pipe(lambda: import_main(argv[1:]))
    if argv and argv[0] == "health":  # the node-problem-detector plugin (docs/health.md)
        from .health.probe import main as health_main

        return health_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.help_config:  # the reference generated from the configuration models
        from .run.config_reference import render

        def reference() -> int:
            sys.stdout.write(render())
            return 0
        return _quiet_broken_pipe(reference)
    if args.simulate is None:  # a real node would silently ignore them
        given = [(flag, value) for flag, value in (("--simulate.phase", args.simulate_phase),
                                                   ("--simulate.host", args.simulate_host)) if value is not None]
        if given:
            parser.error(f"{' and '.join(flag for flag, _ in given)} without --simulate: only the simulated "
                         f"node has phases and a simulated host name",
                         hint=f"add --simulate, e.g. --simulate {given[0][0]} {given[0][1]}")
    setup_logging(args.log_level, args.log_format)
    settings = settings_from(args)
    effective = None
    try:
        # read below as the serving process reads it after the drop (--check-config too: a
        # file only a capability could read would pass the check and fail at start)
        effective = _lower_effective()
        if args.state_dir is not None:
            check_state_dir(args.state_dir)  # before anything reads or writes there
        # configuration errors (file, line, field) are reported before any process or thread
        # starts; nothing here starts one (capabilities are per thread: see privsep.counter)
        loaded = prepare(settings)
        if args.web_config is not None and not (args.once or args.list_devices):
            _check_web_config(args.web_config)
        if args.check_config:
            print("configuration and mappings are valid")
            return 0
        effective = None  # lowered for good: the capabilities are dropped next
        counter = _separate(settings, loaded, serving=not (args.once or args.list_devices))
        daemon = Daemon(settings)
        daemon.load(loaded)
        if args.once:
            text, rc = _run(run_once(daemon))

            def write() -> int:
                sys.stdout.buffer.write(text)
                sys.stdout.flush()
                return rc
            return _quiet_broken_pipe(write)
        if args.list_devices:
            return _run(list_devices(daemon))
        # modules, schema, mappings and config are loaded for good: out of the cyclic
        # collector's generations, and its passes spaced out (exporter/run/gctune.py says why)
        gctune.after_load()
        return _run(_serve(args, daemon, counter))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # e.g. address in use
        print(f"error: {exc}", file=sys.stderr)
        if exc.errno == errno.EADDRINUSE:
            print("hint: another process (another exporter?) listens there: stop it, or pick another "
                  "port with --web.listen-address=:<port> (make run ARGS=\"--web.listen-address=:<port>\")",
                  file=sys.stderr)
        return 1
    finally:
        if effective:  # --check-config (or a failed start) as a call in another program: as it was
            _raise_effective(effective)


def _lower_effective() -> int:
    """Empty the effective capability set; the one it was (to raise it again: ``--check-config``)."""
    from .privsep.caps import capabilities, lower_effective

    before = capabilities().get("CapEff", 0)
    lower_effective()
    return before


def _raise_effective(effective: int) -> None:
    from .privsep.caps import capabilities, capset

    held = capabilities()
    capset(effective & held.get("CapPrm", 0), held.get("CapPrm", 0), held.get("CapInh", 0))


def _separate(settings: Settings, loaded: Loaded, serving: bool):
    """Before any thread starts: the counting process holds the count capabilities where the
    serving daemon counts DRM fdinfo clients; everywhere else (fdinfo off, ``processes: off``,
    ``--once``, ``--list-devices``) nothing needs them and they are dropped, no process started.
    OSError (fail closed, the CLI exits 1): a capability is left."""
    from importlib.util import find_spec

    from .privsep.counter import CAP_PERFMON, separate

    # Level Zero's engine groups need CAP_PERFMON: kept where that collector runs and its binding
    # is installed (docs/privileges.md); every other capability goes
    keep = CAP_PERFMON if runs_collector(settings, loaded.config, "levelzero") and find_spec("pyzes") else 0
    return separate(settings.procfs, settings.sysfs, count=serving and counts_fdinfo(settings, loaded.config),
                    keep=keep)


def _quiet_broken_pipe(fn) -> int:
    """``... | head``: the reader went away; exit like other CLI tools, without a traceback."""
    import os

    try:
        return fn()
    except BrokenPipeError:
        # stdout is broken: point it at /dev/null so the interpreter's final flush is quiet
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 1


def _check_web_config(path: Path) -> None:
    from .serve.webconfig import WebConfig, WebConfigError

    try:
        WebConfig.load(path)
    except WebConfigError as exc:
        raise ConfigError(str(exc)) from None
