"""What a task holds (``/proc/<pid>/status``) and the environment a helper process is started
with: shared by the import worker (``importers/spawn.py``) and the counting process."""

from __future__ import annotations

import os


def child_env() -> dict[str, str]:
    """A helper's environment: empty but ``LD_LIBRARY_PATH`` (an interpreter that needs it)."""
    lib = os.environ.get("LD_LIBRARY_PATH")
    return {"LD_LIBRARY_PATH": lib} if lib else {}


def capabilities(pid: str = "thread-self") -> dict[str, int]:
    """CapInh, CapPrm, CapEff, CapBnd, CapAmb of a task (``/proc/<pid>/status``)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Cap"):
                    key, _, value = line.partition(":")
                    out[key] = int(value.strip() or "0", 16)
    except (OSError, ValueError):
        pass
    return out
