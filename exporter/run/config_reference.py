"""The configuration file's reference, generated from the models that validate it.

Each setting is described once, where it is validated: ``Field(description=...)`` in
``exporter/config.py`` and the models it includes (indicators, collector options, enrichers, the
OTLP push, the exposition filter); a section's text is its model's docstring.  From them come
docs/configuration.md (``make docs``, ``python -m exporter.run.config_reference``; a test fails
when the file is out of date) and ``--help-config``.
"""

from __future__ import annotations

import enum
import json
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
    return any(getattr(getattr(m, "func", None), "__name__", "") == "parse_duration" for m in metadata)


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


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
