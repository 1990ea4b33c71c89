"""Each setting is described once, in the model that validates it (``Field(description=...)``):
docs/configuration.md and ``--help-config`` are generated from there, and a setting without a
description fails here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from exporter.config import config_model
from exporter.run.config_reference import MARKER, default_text, field_at, fill, render, sections, undescribed
from exporter.sources.options import Duration as OptionDuration

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
        period: OptionDuration = Field(15.0, description="a collector option's duration")

    text = render(Outer)
    assert "| `name` | string | required | required, no default |" in text
    assert '| `every` | list of string | `["a"]` | a list |' in text
    assert "## `inner`\n\nAn inner section.\n" in text
    assert "| `depth` | integer | `3` | how deep \\| with a pipe |" in text
    assert "## `items[]`\n\nAn inner section.\n\nThe settings of `inner`." in text
    assert '| `pin` | string | `"x"` | as the file spells it |' in text
    assert "| `period` | duration | `15.0` | a collector option's duration |" in text
    assert undescribed(Outer) == ["bare"]


def test_help_config_prints_the_reference():
    out = subprocess.run([sys.executable, "-m", "exporter", "--help-config"], capture_output=True, text=True,
                         timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout == render()


# ------------------------------------------------- prose quotes a setting instead of restating it

def _gen_setting_docs():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_setting_docs", REPO / "scripts" / "gen-setting-docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quoted_settings_in_the_docs_are_up_to_date():
    """docs/detection.md quotes the hold-over rule and the defaults from the model; `make docs`
    fills them, and a block that differs from the model fails here."""
    gen = _gen_setting_docs()
    docs = gen.documents()
    assert REPO / "docs" / "detection.md" in docs
    for path in docs:
        text = path.read_text(encoding="utf-8")
        assert fill(text) == text, f"{path.relative_to(REPO)}: a quoted setting is out of date: run `make docs`"
    detection = (REPO / "docs" / "detection.md").read_text(encoding="utf-8")
    holdover = field_at("indicators.state.client_holdover_seconds").description
    assert ("<!-- setting: indicators.state.client_holdover_seconds -->" + " ".join(holdover.split())
            + "<!-- /setting -->") in detection
    assert gen.main(["--check"]) == 0


def test_fill_quotes_descriptions_and_defaults_from_the_model():
    class Inner(BaseModel):
        hold_seconds: float = Field(3.0, description="a rule  | in\n two lines")
        long_seconds: float = Field(21600.0, description="six hours")
        bar_percent: float = Field(85.0, description="a bar")
        drop_fraction: float = Field(0.2, description="a fraction")
        limit_bytes: int = Field(768 << 20, description="a size")
        rows: int = Field(1_000_000, description="a count")
        bare: int = 1

    class Outer(BaseModel):
        inner: Inner = Inner()

    text = ("x <!-- setting: inner.hold_seconds -->stale<!-- /setting --> (<!-- default: inner.hold_seconds -->"
            "<!-- /default -->)\n<!-- default: inner.long_seconds -->?<!-- /default -->"
            " <!-- default: inner.bar_percent --><!-- /default --> <!-- default: inner.drop_fraction --><!-- /default -->"
            " <!-- default: inner.limit_bytes --><!-- /default --> <!-- default: inner.rows --><!-- /default -->")
    assert fill(text, Outer) == (
        "x <!-- setting: inner.hold_seconds -->a rule \\| in two lines<!-- /setting --> (<!-- default: "
        "inner.hold_seconds -->3 s<!-- /default -->)\n<!-- default: inner.long_seconds -->6 h<!-- /default -->"
        " <!-- default: inner.bar_percent -->85 %<!-- /default --> <!-- default: inner.drop_fraction -->20 %"
        "<!-- /default --> <!-- default: inner.limit_bytes -->768 MiB<!-- /default --> <!-- default: inner.rows -->"
        "1,000,000<!-- /default -->")
    for bad in ("inner.nope", "inner", "inner.bar_percent.x", "inner.bare"):
        with pytest.raises(KeyError):
            fill(f"<!-- setting: {bad} --><!-- /setting -->", Outer)
    assert default_text("indicators.state.client_holdover_seconds") == "3 s"
    assert default_text("indicators.rootcause.power_clock_drop_fraction") == "20 %"


def _leaf_defaults() -> dict[str, object]:
    """Every setting's name (its last key) with a static default, and the default."""
    return {name: field.default for _, _, _, rows in sections(config_model()) for name, field in rows
            if field.default is not None and not isinstance(field.default, (bool, str, tuple, list))}


def test_detection_md_restates_no_setting_default_by_hand():
    """A setting named in the prose is followed by a quoted default, never by a number written by
    hand: `drop_confirm_seconds` (900 s) would go stale when the default changes."""
    text = MARKER.sub("", (REPO / "docs" / "detection.md").read_text(encoding="utf-8"))
    leaves = _leaf_defaults()
    restated = [m[0] for m in re.finditer(r"`([\w.]+)` \(\d[^)]*\)?", text) if m[1].rsplit(".", 1)[-1] in leaves]
    assert restated == [], "quote the default (<!-- default: PATH --><!-- /default -->, make docs): " + repr(restated)


def test_settings_named_in_detection_md_and_help_texts_exist():
    """A dotted setting path in docs/detection.md or a canonical HELP names a real setting, so
    renaming one fails here instead of leaving a dangling reference on /metrics."""
    from exporter.map.schema import load_schema

    texts = [(REPO / "docs" / "detection.md").read_text(encoding="utf-8")]
    texts += [" ".join(m.help.split()) for m in load_schema().metrics.values()]
    named = {p.rstrip(".") for t in texts for p in re.findall(r"\bindicators\.\w+\.\w+", t)}
    named |= {m for t in texts for m in MARKER.findall(t) for m in [m[1]]}
    assert "indicators.state.client_holdover_seconds" in named
    for path in sorted(named):
        try:
            field_at(path)
        except KeyError as e:  # a section (indicators.cost.prices) is a fine thing to name
            assert "is a section" in str(e), e


def test_settings_a_help_names_by_their_key_are_in_the_sections_it_names():
    """A HELP that points at a settings section (indicators.baseline) may name its keys bare
    (compare_seconds, deviation_sigma): each such key is a setting of a section the HELP names."""
    from exporter.map.schema import load_schema

    indicators = config_model().model_fields["indicators"].annotation
    suffix = re.compile(r"_(seconds|percent|fraction|bins|sigma|clean|coefficient|ratio|factor|points|reasons|"
                        r"stddev|dollars|step|slowdown|samples)$")
    checked = 0
    schema = load_schema()
    for name, metric in schema.metrics.items():
        text = " ".join(metric.help.split())
        named = set(re.findall(r"\bindicators\.(\w+)", text))
        if not named:
            continue
        keys = {k for section in named for k in indicators.model_fields[section].annotation.model_fields}
        for token in re.findall(r"(?<![\w.])([a-z][a-z0-9]*(?:_[a-z0-9]+)+)\b", text):
            if token.startswith(("gpu_", "unified_gpu")) or token in schema.metrics or not suffix.search(token):
                continue
            assert token in keys, f"{name}: HELP names {token!r}, no setting of indicators.{sorted(named)}"
            checked += 1
    assert checked > 20
