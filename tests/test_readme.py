"""The README's configuration example is a valid configuration (it is what users copy)."""

from __future__ import annotations

import re
from pathlib import Path

from exporter.daemon import Daemon, Settings

REPO = Path(__file__).resolve().parent.parent


def test_readme_config_example_validates(tmp_path):
    text = (REPO / "README.md").read_text()
    m = re.search(r"## Configuration\n\n```yaml\n(.*?)```", text, re.S)
    assert m, "README lost its configuration example"
    cfg = tmp_path / "config.yaml"
    cfg.write_text(m.group(1))
    daemon = Daemon(Settings(config_path=cfg))
    daemon.load()  # raises ConfigError naming file, line and field when invalid
    assert daemon.config.collector("nvml").options_dict()["processes"] == "series"
    assert daemon.config.indicators.contention.bandwidth_utilization_percent == 85


def test_readme_names_the_two_commands():
    text = (REPO / "README.md").read_text()
    assert "make run" in text and "make test" in text
