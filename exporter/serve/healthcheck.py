"""``python -m exporter.serve.healthcheck``: the container HEALTHCHECK.

GETs ``/healthz`` of the exporter running as PID 1 (the image's ENTRYPOINT) at the address its own
command line configures: the first ``--web.listen-address`` (default ``:9632``; a wildcard host is
asked on loopback), over HTTPS when its ``--web.config.file`` enables TLS.  Healthy (exit 0) when
the server answers HTTP (200, or 401 when basic auth protects every path) or, with client
certificates required, completes its side of the TLS handshake; exit 1 otherwise.
"""

from __future__ import annotations

import http.client
import ssl
import sys
from pathlib import Path


def exporter_argv(pid: int = 1) -> list[str]:
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def target(argv: list[str]) -> tuple[str, int, bool]:
    """(host, port, tls) the exporter with this command line listens on."""
    from ..run.argparsing import DEFAULT_PORT, build_parser

    # argv[0] is the interpreter or the console script; flags start at the first '--'
    flags = argv[next((i for i, a in enumerate(argv) if a.startswith("--")), len(argv)):]
    args, _ = build_parser().parse_known_args(flags)
    host, port = (args.listen or [(None, DEFAULT_PORT)])[0]
    if host in (None, "", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    tls = False
    if args.web_config is not None:
        from .webconfig import WebConfigWatcher

        tls = WebConfigWatcher(args.web_config).ssl_context() is not None
    return host, port, tls


def check(host: str, port: int, tls: bool, timeout: float = 4.0) -> bool:
    if tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # our own server on loopback: liveness, not identity
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(host, port, timeout=timeout,
                                                                       context=ctx)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/healthz")
        status = conn.getresponse().status
    except ssl.SSLError:
        return tls  # the server answered the handshake but wants a client certificate
    except OSError:
        return False
    finally:
        conn.close()
    return status in (200, 401)


def main(argv: list[str] | None = None) -> int:
    """``python -m exporter.serve.healthcheck [--pid N]`` (default PID 1, the container's exporter)."""
    args = sys.argv[1:] if argv is None else argv
    pid = int(args[args.index("--pid") + 1]) if "--pid" in args else 1
    try:
        host, port, tls = target(exporter_argv(pid))
    except (OSError, SystemExit, Exception) as exc:  # noqa: BLE001 - a health check must answer
        print(f"healthcheck: cannot read the exporter's command line: {exc}", file=sys.stderr)
        return 1
    ok = check(host, port, tls)
    if not ok:
        print(f"healthcheck: no answer from {'https' if tls else 'http'}://{host}:{port}/healthz",
              file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
