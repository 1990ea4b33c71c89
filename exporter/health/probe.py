"""``unified-gpu-exporter health --node``: a node-problem-detector custom plugin.

It asks the local exporter (``/metrics`` over loopback by default), judges each GPU with
``definition.judge`` and answers the way NPD reads a plugin: exit 0 (ok), 1 (a problem of the
checked classes) or 2 (unknown: the exporter is down, slow, answers garbage or lists no GPU),
with one short line on stdout as the condition's message.  The whole request has one deadline
(``--timeout``, below NPD's own ``timeout``), so the plugin never hangs on a stopped or
stalled exporter; the body is bounded while it is read.

``--nfd-features FILE`` also writes a node-feature-discovery feature file (node labels with no
RBAC for the writer; off unless asked), replaced atomically, with an expiry so the labels go
when the writer stops.
"""

from __future__ import annotations

import argparse
import http.client
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from ..http_deadline import Deadline, opener
from .definition import CLASSES, METRICS, OK, judge, node_state

DEFAULT_URL = "http://127.0.0.1:9632/metrics"  # the exporter's default port (tests check it)
MAX_BODY = 64 << 20
EXIT = {"ok": 0, "degraded": 1, "failed": 1}
UNKNOWN = 2
MAX_MESSAGE = 240


class Unknown(Exception):
    """The exporter's answer cannot be judged."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="unified-gpu-exporter health",
        description="Judge the node's GPUs from the local exporter: exit 0 ok, 1 problem, 2 unknown "
                    "(a node-problem-detector custom plugin; docs/health.md).")
    p.add_argument("--node", action="store_true", required=True,
                   help="judge this node's GPUs (the only mode for now)")
    p.add_argument("--url", default=DEFAULT_URL, help=f"the exporter's metrics URL (default {DEFAULT_URL})")
    p.add_argument("--timeout", type=float, default=4.0,
                   help="seconds for the whole request, below NPD's timeout (default 4)")
    p.add_argument("--check", action="append", choices=list(CLASSES), metavar="CLASS",
                   help=f"only this problem class (repeatable; {', '.join(CLASSES)}); default: all")
    p.add_argument("--nfd-features", type=Path, metavar="FILE",
                   help="also write node-feature-discovery labels to FILE (off by default)")
    return p


def fetch(url: str, timeout: float) -> str:
    if not url.startswith(("http://", "https://")):
        raise Unknown(f"--url must be http(s), got {url[:60]!r}")
    deadline = Deadline(timeout)

    def refuse(code: int, new: str) -> Exception:
        return Unknown(f"exporter redirected ({code})")

    try:
        req = urllib.request.Request(url, headers={"Accept": "text/plain;version=0.0.4"})
        with opener(deadline, None, refuse).open(req, timeout=deadline.remaining()) as resp:
            data = resp.read(MAX_BODY + 1)
        if len(data) > MAX_BODY:
            raise Unknown(f"exporter answer above {MAX_BODY >> 20} MiB")
        return data.decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        raise Unknown(f"exporter answered HTTP {exc.code}") from None
    except (OSError, urllib.error.URLError, ValueError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        # the deadline's timer, or the socket timeout set to the time left, whichever came first
        if deadline.expired or isinstance(reason, TimeoutError) or time.monotonic() >= deadline.at:
            raise Unknown(f"exporter did not answer within {timeout:g}s") from None
        raise Unknown(f"exporter unreachable: {str(reason)[:80]}") from None
    finally:
        deadline.cancel()


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples of the families the definition reads (other lines are not parsed)."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = tuple(m + c for m in METRICS for c in ("{", " "))
    kept = "".join(line + "\n" for line in text.splitlines() if line.startswith(wanted))
    try:
        return [(s.name, dict(s.labels), float(s.value))
                for fam in text_string_to_metric_families(kept) for s in fam.samples]
    except ValueError as exc:
        raise Unknown(f"exporter answer does not parse: {str(exc)[:60]}") from None


def check(url: str, timeout: float, classes: list[str]) -> tuple[int, str, dict]:
    """(exit code, message, per-GPU health) of one check."""
    try:
        gpus = judge(samples(fetch(url, timeout)))
    except Unknown as exc:
        return UNKNOWN, f"unknown: {exc}", {}
    except Exception as exc:  # noqa: BLE001 - a crash must read as "unknown" (2), never as a problem (1)
        return UNKNOWN, f"unknown: {type(exc).__name__}: {str(exc)[:80]}", {}
    if not gpus:
        return UNKNOWN, "unknown: the exporter lists no GPU", {}
    state, messages = node_state(gpus, classes)
    if state == OK:
        return 0, f"ok: {len(gpus)} GPU{'s' if len(gpus) != 1 else ''} healthy", gpus
    return EXIT[state], "; ".join(messages), gpus


def write_features(path: Path, gpus: dict, now: float) -> None:
    """node-feature-discovery labels (feature.node.kubernetes.io/<key>), expiring in 10 minutes."""
    state, _ = node_state(gpus)
    lines = [f"# +expiry-time={time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(now + 600))}",
             f"gpu-health={state}"]
    for cls in CLASSES:
        if node_state(gpus, [cls])[0] != OK:
            lines.append(f"gpu-health-{cls}=true")
    fd, tmp = tempfile.mkstemp(prefix=".gpu-health.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    code, message, gpus = check(args.url, max(0.1, args.timeout), args.check or list(CLASSES))
    if args.nfd_features is not None and gpus:
        try:
            write_features(args.nfd_features, gpus, time.time())
        except OSError as exc:
            print(f"warning: {args.nfd_features}: {exc.strerror or exc}", file=sys.stderr)
    print(message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE - 3] + "...")
    return code
