"""Run a piece of Python in a child with hard limits, so that a test of a memory or time bomb
stays bounded (under 1 GB and its timeout) even on code that would not stop it."""

from __future__ import annotations

import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Bounded:
    rc: int | None  # None: killed at the timeout
    out: str

    @property
    def ok(self) -> bool:
        return self.rc == 0


def run_bounded(code: str, *args: str, timeout: float = 30.0, mem: int = 1 << 30,
                fsize: int = 256 << 20) -> Bounded:
    """``code`` (with ``sys.argv[1:] == args``) in a fresh interpreter: address space ``mem``,
    files it writes at most ``fsize`` bytes each (a SQLite temp file included), ``timeout`` s."""
    # the child sets its own limits first (no preexec_fn: the test process may have threads)
    head = (f"import resource\nresource.setrlimit(resource.RLIMIT_AS, ({mem}, {mem}))\n"
            f"resource.setrlimit(resource.RLIMIT_FSIZE, ({fsize}, {fsize}))\n")
    try:
        p = subprocess.run([sys.executable, "-c", head + code, *args], cwd=REPO, capture_output=True, text=True,
                           timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return Bounded(None, out)
    return Bounded(p.returncode, p.stdout + p.stderr)


def in_thread(fn) -> tuple[threading.Thread, list]:  # noqa: ANN001
    """Run ``fn`` on a daemon thread: (the thread, a list that gets its result or exception)."""
    box: list = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box.append(exc)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box
