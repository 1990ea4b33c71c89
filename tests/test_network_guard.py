"""The test suite's network guard (tests/netguard/uge_netguard.py): a connection past loopback is
refused before the system call, in the pytest process and in every process the tests start, and
the refusal names the test and the address."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import uge_netguard  # noqa: I001  (tests/netguard, put on sys.path by tests/conftest.py)

from tests.conftest import NETGUARD_LOG

# documentation-only networks (RFC 5737): nothing answers there; a real connect would hang
BLACKHOLE = ("192.0.2.1", 9)
METADATA = ("169.254.169.254", 80)


@pytest.fixture
def private_log(tmp_path, monkeypatch):
    """Refusals this test provokes on purpose go to a log of its own, not the suite's."""
    log = tmp_path / "refusals.jsonl"
    monkeypatch.setenv(uge_netguard.LOG_ENV, str(log))
    return log


def _lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_the_suite_runs_with_the_guard_installed_here_and_handed_to_children():
    assert os.environ[uge_netguard.LOG_ENV] == str(NETGUARD_LOG)
    assert uge_netguard.HERE in os.environ["PYTHONPATH"].split(os.pathsep)
    env = subprocess.Popen.__init__.__name__  # the wrapper that hands the guard to env= children
    assert env == "_guarded_popen_init"


@pytest.mark.parametrize("kind", [socket.SOCK_DGRAM, socket.SOCK_STREAM])
def test_a_connect_past_loopback_is_refused_before_the_system_call(private_log, kind):
    s = socket.socket(socket.AF_INET, kind)
    s.settimeout(30)
    try:
        t0 = time.monotonic()
        with pytest.raises(uge_netguard.NetworkGuardError, match=r"192\.0\.2\.1"):
            s.connect(BLACKHOLE)
        assert time.monotonic() - t0 < 5  # refused at once, not after a connect timeout
        # the kernel never saw a connect: a connect (even a failed UDP or TCP one) binds the socket
        # to a local address and port
        assert s.getsockname() == ("0.0.0.0", 0)
    finally:
        s.close()
    (line,) = _lines(private_log)
    assert "test_a_connect_past_loopback_is_refused_before_the_system_call" in line["test"]
    assert "192.0.2.1" in line["address"] and line["event"] == "socket.connect"


def test_sendto_and_a_lookup_of_another_host_are_refused(private_log):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        with pytest.raises(uge_netguard.NetworkGuardError):
            s.sendto(b"x", METADATA)
    with pytest.raises(uge_netguard.NetworkGuardError):
        socket.getaddrinfo("metadata.google.internal", 80)
    assert [x["event"] for x in _lines(private_log)] == ["socket.sendto", "socket.getaddrinfo"]


def test_loopback_and_unix_sockets_pass():
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    accepted: list = []
    t = threading.Thread(target=lambda: accepted.append(srv.accept()[0]))
    t.start()
    with socket.create_connection(("localhost", port), timeout=5):
        pass
    t.join(5)
    for conn in accepted:
        conn.close()
    srv.close()
    assert accepted
    with socket.socket(socket.AF_UNIX) as u, pytest.raises(FileNotFoundError):
        u.connect("/nonexistent/socket")
    for host in ("127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1", "localhost", "0.0.0.0"):
        assert uge_netguard.loopback_host(host), host
    for host in ("169.254.169.254", "10.0.0.1", "192.0.2.1", "2001:db8::1", "example.com", None):
        assert not uge_netguard.loopback_host(host), host


@pytest.mark.parametrize("how", ["inherited", "explicit env"])
def test_a_child_process_is_guarded_too_and_names_the_test(private_log, how):
    code = ("import socket\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
            "try:\n"
            "    s.connect(('192.0.2.1', 9))\n"
            "except PermissionError as e:\n"
            "    print('refused', type(e).__name__, s.getsockname())\n")
    env = None if how == "inherited" else {"PATH": "/usr/bin:/bin"}  # an env= without the guard's variables
    if env is not None:
        env[uge_netguard.LOG_ENV] = str(private_log)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert r.stdout.strip() == "refused NetworkGuardError ('0.0.0.0', 0)", r.stdout + r.stderr
    (line,) = _lines(private_log)
    assert "test_a_child_process_is_guarded_too_and_names_the_test" in line["test"]
    assert line["pid"] != os.getpid() and "192.0.2.1" in line["address"]
