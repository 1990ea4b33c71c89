"""The test suite's network guard: no test, and no process a test starts, reaches past loopback.

Installed as a Python audit hook (``sys.addaudithook``) in the pytest process by tests/conftest.py
and, through ``PYTHONPATH`` and ``UGE_NETGUARD_LOG`` in the environment of every child, by
``sitecustomize.py`` beside this file in each Python process the tests start (daemons, workers,
fleet nodes).  The hook runs before the system call: a ``connect``, ``sendto`` or ``sendmsg`` to
an address outside 127.0.0.0/8 and ::1 (or a name lookup of anything but this host) raises
``NetworkGuardError`` and nothing leaves the machine.  Each refusal is also appended to the log
named by ``UGE_NETGUARD_LOG`` as one JSON line (pid, test, event, address), because a daemon may
swallow the exception: conftest fails the test that was running, by name, and the session.

Not covered: processes that are not Python (Prometheus, Alertmanager, chromium), which the tests
start with loopback-only targets and flags, and Python started with ``-I`` / ``-E`` (the profile
import worker, which opens no socket).
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import sys

LOG_ENV = "UGE_NETGUARD_LOG"
TEST_ENV = "PYTEST_CURRENT_TEST"
HERE = os.path.dirname(os.path.abspath(__file__))
_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}


class NetworkGuardError(PermissionError):
    """A test (or a process it started) tried to reach an address outside loopback."""


def loopback_host(host: object) -> bool:
    """True for an address (or name) that stays on this machine."""
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    if not isinstance(host, str):
        return False
    name = host.split("%", 1)[0].strip("[]").rstrip(".").lower()
    if name in _LOCAL_NAMES or name.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    # 0.0.0.0 / :: as a destination is this host on Linux
    return ip.is_loopback or ip.is_unspecified


def _own_names() -> set[str]:
    try:
        name = socket.gethostname().lower()
    except OSError:
        return set()
    return {name, name.split(".", 1)[0]}


def _record(event: str, address: object) -> str:
    test = os.environ.get(TEST_ENV, "").rsplit(" (", 1)[0] or "(outside a test)"
    line = {"pid": os.getpid(), "test": test, "event": event, "address": repr(address),
            "argv": " ".join(sys.argv)[:300]}
    path = os.environ.get(LOG_ENV)
    if path:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
            try:
                os.write(fd, (json.dumps(line) + "\n").encode())
            finally:
                os.close(fd)
        except OSError:
            pass
    return f"network guard: {test} tried {event} to {address!r}: tests may only talk to loopback"


def _hook(event: str, args: tuple) -> None:
    if event in ("socket.connect", "socket.sendto", "socket.sendmsg"):
        sock, address = args[0], args[1]
        if address is None or getattr(sock, "family", None) not in (socket.AF_INET, socket.AF_INET6):
            return
        host = address[0] if isinstance(address, tuple) and address else address
        if not loopback_host(host):
            raise NetworkGuardError(_record(event, address))
    elif event == "socket.getaddrinfo":
        host = args[0]
        if host in (None, "", b""):
            return
        text = host.decode("ascii", "replace") if isinstance(host, bytes) else str(host)
        if loopback_host(text):
            return
        try:
            ipaddress.ip_address(text.split("%", 1)[0].strip("[]"))
            return  # a numeric address resolves without asking anyone; its connect is checked
        except ValueError:
            pass
        if text.rstrip(".").lower() in _OWN:
            return
        raise NetworkGuardError(_record(event, host))


_OWN: set[str] = set()
_installed = False


def install() -> None:
    """Add the hook to this process (once; audit hooks cannot be removed)."""
    global _installed
    if _installed:
        return
    _OWN.update(_own_names())
    sys.addaudithook(_hook)
    _installed = True


def child_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with what a child needs to install the guard itself."""
    log = env.get(LOG_ENV) or os.environ.get(LOG_ENV)  # a test may hand a child a log of its own
    if not log:
        return env
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if HERE not in parts:
        parts.insert(0, HERE)
    named = {TEST_ENV: os.environ[TEST_ENV]} if TEST_ENV in os.environ and TEST_ENV not in env else {}
    return {**env, **named, LOG_ENV: log, "PYTHONPATH": os.pathsep.join(parts)}
