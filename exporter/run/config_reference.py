"""The configuration file's reference, generated from the models that validate it.

Each setting is described once, where it is validated: ``Field(description=...)`` in
``exporter/config.py`` and the models it includes (indicators, collector options, enrichers, the
OTLP push, the exposition filter); a section's text is its model's docstring.  From them come
docs/configuration.md (``make docs``, ``python -m exporter.run.config_reference``; a test fails
when the file is out of date) and ``--help-config``.

Prose that explains a setting quotes it rather than restating it: in a hand-written doc,
``<!-- setting: indicators.state.client_holdover_seconds -->...<!-- /setting -->`` holds that
setting's description and ``<!-- default: PATH -->...<!-- /default -->`` its default ("3 s",
"85 %"), both filled by :func:`fill` (``scripts/gen-setting-docs.py``, run by ``make docs``; a test
fails while a filled block is out of date).
"""

from __future__ import annotations

import enum
import json
import re
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from ..config import config_model

HEADER = """# Configuration reference

Generated from the configuration models (`exporter/config.py` and the models it includes) by
`make docs`; a test fails when this file is out of date. `unified-gpu-exporter --help-config` prints
the same. Every level is strict: an unknown key is an error naming file, line and field. Durations
take `250ms`, `1.5s`, `1m30s`, `1d` or a number of seconds. A section left out takes its defaults.
"""


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The models a field holds (``X``, ``X | None``, ``list[X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _is_duration(metadata: Any) -> bool:
    return any(getattr(getattr(m, "func", None), "__name__", "") in ("parse_duration", "_positive_duration")
               for m in metadata)


def _type(annotation: Any, metadata: Any = ()) -> str:
    if _is_duration(metadata):
        return "duration"
    if annotation is type(None):
        return "null"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return "duration" if _is_duration(annotation.__metadata__) else _type(args[0])
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type(a) for a in args)
    if origin in (list, tuple, set, frozenset):
        return f"list of {_type(args[0])}" if args else "list"
    if origin is dict:
        return f"map of {_type(args[1])}" if len(args) == 2 else "map"
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return "section"
        if issubclass(annotation, enum.Enum):
            return " \\| ".join(json.dumps(m.value) for m in annotation)
        return {"str": "string", "int": "integer", "float": "number", "bool": "boolean",
                "Path": "path", "PosixPath": "path"}.get(annotation.__name__, annotation.__name__)
    return str(annotation).replace("typing.", "")


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return ""
    if isinstance(value, BaseModel):
        return ""
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, (tuple, set, frozenset)):
        value = list(value)
    if isinstance(value, Path):
        value = str(value)
    return f"`{json.dumps(value)}`"


def _text(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def _doc(model: type[BaseModel]) -> str:
    doc = model.__doc__ or ""
    if doc.strip() == (BaseModel.__doc__ or "").strip():
        return ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def sections(model: type[BaseModel], path: str = "",
             about: str = "") -> Iterator[tuple[str, type[BaseModel], str, list]]:
    """(path, model, its text, [(name, field)]) per section, depth first, in field order; a
    section's text is its model's docstring, else the description of the field holding it."""
    rows, subs = [], []
    for name, field in model.model_fields.items():
        found = _models(field.annotation)
        if found:
            for sub in found:
                suffix = "[]" if typing.get_origin(field.annotation) in (list, tuple) else ""
                subs.append((f"{path}.{name}{suffix}" if path else f"{name}{suffix}", sub, field))
        else:
            rows.append((field.alias or name, field))  # as the file spells it (schema_pin: `schema`)
    yield path, model, _doc(model) or _text(about), rows
    for sub_path, sub, field in subs:
        yield from sections(sub, sub_path, field.description or "")


def undescribed(model: type[BaseModel] | None = None) -> list[str]:
    """Settings (leaf fields) without a description, by path."""
    model = model or config_model()
    return [f"{path}.{name}" if path else name
            for path, _, _, rows in sections(model) for name, field in rows if not field.description]


def render(model: type[BaseModel] | None = None) -> str:
    model = model or config_model()
    out = [HEADER]
    seen: dict[tuple, str] = {}  # the rows of a section already written (every collector's entry)
    for path, _, about, rows in sections(model):
        if not rows and not path:
            continue
        out += ["", f"## `{path}`" if path else "## top level", ""]
        if path and about:
            out += [about, ""]
        if not rows:
            out.append("Only sections below.")
            continue
        key = tuple((name, repr(field)) for name, field in rows)
        if key in seen:
            out.append(f"The settings of `{seen[key]}`.")
            continue
        seen[key] = path
        out += ["| setting | type | default | description |", "|---|---|---|---|"]
        for name, field in rows:
            out.append(f"| `{name}` | {_type(field.annotation, field.metadata)} | {_default(field)} | {_text(field.description)} |")
    return "\n".join(out) + "\n"


MARKER = re.compile(r"<!-- (?P<kind>setting|default): (?P<path>[\w.\[\]]+) -->(?P<body>.*?)<!-- /(?P=kind) -->",
                    re.S)


def field_at(path: str, model: type[BaseModel] | None = None) -> FieldInfo:
    """The setting at a dotted path (``indicators.state.min_clients``, keys as the file spells
    them, ``[]`` for a list's entries); KeyError naming the first part that is not there."""
    current: list[type[BaseModel]] = [model or config_model()]
    *sections_, leaf = path.replace("[]", "").split(".")
    for i, part in enumerate([*sections_, leaf]):
        fields = {f.alias or n: f for m in current for n, f in m.model_fields.items()}
        if part not in fields:
            raise KeyError(f"no setting {'.'.join([*sections_, leaf][:i + 1])!r} (in {path!r})")
        field = fields[part]
        if i == len(sections_):
            if _models(field.annotation):
                raise KeyError(f"{path!r} is a section, not a setting")
            return field
        current = _models(field.annotation)
        if not current:
            raise KeyError(f"{'.'.join(sections_[:i + 1])!r} is a setting, not a section (in {path!r})")
    raise AssertionError("unreachable")


def _num(value: float) -> str:
    """1000000 as "1,000,000", 0.05 as "0.05" (never an exponent)."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def default_text(path: str, model: type[BaseModel] | None = None) -> str:
    """A setting's default as prose writes it: by its unit (a duration or ``_seconds``: "900 s",
    "6 h"; ``_percent``: "85 %"; ``_fraction``: 0.2 as "20 %"; ``_bytes``: "768 MiB"), else as the
    reference shows it."""
    field = field_at(path, model)
    value = field.default
    name = path.rsplit(".", 1)[-1]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if name.endswith("_seconds") or _is_duration(field.metadata):
            return f"{_num(value / 3600)} h" if value >= 3600 and value % 3600 == 0 else f"{_num(value)} s"
        if name.endswith("_percent"):
            return f"{_num(value)} %"
        if name.endswith("_fraction"):
            return f"{_num(round(value * 100, 9))} %"
        if name.endswith("_bytes"):
            for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
                if value >= size and value % size == 0:
                    return f"{_num(value // size)} {unit}"
        return _num(value)
    return _default(field)


def fill(text: str, model: type[BaseModel] | None = None) -> str:
    """``text`` with every setting / default block filled from the model (KeyError for a path
    that names no setting, and for a setting without a description)."""
    def one(m: re.Match) -> str:
        path = m["path"]
        if m["kind"] == "default":
            body = default_text(path, model)
        else:
            body = _text(field_at(path, model).description)
            if not body:
                raise KeyError(f"{path!r} has no description to quote")
        return f"<!-- {m['kind']}: {path} -->{body}<!-- /{m['kind']} -->"
    return MARKER.sub(one, text)


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
