"""Each setting is described once, in the model that validates it (``Field(description=...)``):
docs/configuration.md and ``--help-config`` are generated from there, and a setting without a
description fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel, Field

from exporter.config import config_model
from exporter.run.config_reference import render, sections, undescribed

REPO = Path(__file__).resolve().parent.parent


def test_docs_configuration_md_is_up_to_date():
    actual = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert actual == render(), "docs/configuration.md is out of date: run `make docs`"


def test_every_setting_has_a_description():
    assert undescribed() == []


def test_every_setting_is_in_the_reference():
    """Every leaf of the configuration, at its path: the collectors' options, lists of targets
    and the price table included."""
    text = render()
    paths = [(path, name) for path, _, _, rows in sections(config_model())
             for name, _ in rows]
    assert len(paths) > 150
    for path, name in paths:
        section = text.index(f"## `{path}`\n" if path else "## top level\n")
        end = text.find("\n## ", section + 1)
        body = text[section:end if end > 0 else None]
        assert f"| `{name}` |" in body or "The settings of `" in body, (path, name)
    for path in ("collectors.upstream.options.targets[].tls", "indicators.cost.prices[]", "exporters.otlp.tls",
                 "enrich.kubernetes", "indicators.state"):
        assert f"## `{path}`\n" in text, path


def test_the_reference_shows_types_defaults_and_descriptions():
    class Inner(BaseModel):
        """An inner section."""

        depth: int = Field(3, description="how deep | with a pipe")

    class Outer(BaseModel):
        name: str = Field(description="required, no default")
        every: list[str] = Field(["a"], description="a list")
        inner: Inner | None = Field(None, description="not shown: the model's docstring is")
        items: list[Inner] = Field([], description="a list of sections")
        bare: bool = False
        pinned: str = Field("x", alias="pin", description="as the file spells it")

    text = render(Outer)
    assert "| `name` | string | required | required, no default |" in text
    assert '| `every` | list of string | `["a"]` | a list |' in text
    assert "## `inner`\n\nAn inner section.\n" in text
    assert "| `depth` | integer | `3` | how deep \\| with a pipe |" in text
    assert "## `items[]`\n\nAn inner section.\n\nThe settings of `inner`." in text
    assert '| `pin` | string | `"x"` | as the file spells it |' in text
    assert undescribed(Outer) == ["bare"]


def test_help_config_prints_the_reference():
    out = subprocess.run([sys.executable, "-m", "exporter", "--help-config"], capture_output=True, text=True,
                         timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout == render()
