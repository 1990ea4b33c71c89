#!/usr/bin/env python3
"""How long the exporter takes from SIGTERM to exit (a supervisor's stop), N tries.

    .venv/bin/python scripts/measure-sigterm.py [N]

Each try starts the simulated node on a free port, waits for /readyz plus one second of polling,
sends SIGTERM and times the exit.  Prints the sorted times and the maximum.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one() -> float:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "--simulate", "--web.listen-address",
                             f"127.0.0.1:{port}", "--poll.interval", "250ms"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(1.0)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        return time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    times = sorted(round(one(), 3) for _ in range(n))
    print(f"SIGTERM -> exit, {n} tries (s): {times}  max {max(times)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
