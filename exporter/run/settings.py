"""``Settings``: what the daemon is started with, resolved from flags and the config file path.

Its own module, below everything that reads it (``loading``, ``collector_policy``, the daemon),
so none of them imports the daemon back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Settings:
    """Everything the daemon needs, resolved from flags and the config file."""

    config_path: Path | None = None
    sysfs: Path = Path("/sys")
    procfs: Path = Path("/proc")
    poll_interval: float | None = None        # flag wins over config
    fast_interval: float | None = None
    collectors: dict[str, bool] = field(default_factory=dict)  # --[no-]collector.<name>
    simulate: str | None = None               # scenario name or file
    simulate_phase: str | None = None         # held until stopped
    simulate_host: str | None = None          # seeds the simulated UUIDs (default: host name)
    state_dir: Path | None = None
    mappings_dir: Path | None = None
