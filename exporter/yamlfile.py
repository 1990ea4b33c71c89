"""Load YAML files into pydantic models with errors that name file, line and field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)

# libyaml's parser (the C extension PyYAML ships in its wheels) composes the same node graph, with
# the same marks, about ten times faster; constructing stays the pure-Python SafeConstructor, so
# the loaded values are identical.  Without the extension, the pure-Python parser.
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class ConfigError(Exception):
    """A configuration, mapping or scenario file is invalid.  ``str()`` is the user-facing text."""


# Nodes a document may hold once its aliases are expanded.  Aliases share one node while
# composed; constructing (or walking) the document expands them, so a few hundred bytes of nested
# aliases ("billion laughs") would become gigabytes.  The size is computed on the composed graph,
# with each distinct node counted once per reference, before anything is expanded.
MAX_EXPANDED_NODES = 1_000_000


def _expanded_size(root: yaml.Node, limit: int) -> int:
    """Node count of the document with aliases expanded; raises ConfigError past ``limit`` or on
    a recursive alias.  Memoised per node, so the cost is linear in the composed size."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        known = sizes.get(key)
        if known is not None:
            return known
        if key in active:
            raise ConfigError(f"{node.start_mark.line + 1}: recursive YAML alias")
        active.add(key)
        total = 1
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                total += size(k) + size(v)
                if total > limit:
                    break
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                total += size(item)
                if total > limit:
                    break
        active.discard(key)
        if total > limit:
            raise ConfigError(f"{node.start_mark.line + 1}: YAML aliases expand to more than "
                              f"{limit} nodes (refused before expansion)")
        sizes[key] = total
        return total

    return size(root)


def _walk(node: yaml.Node, path: tuple, lines: dict[tuple, int]) -> None:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.ScalarNode):
        try:
            node.value.encode("utf-8")
        except UnicodeEncodeError:
            # e.g. "\ud800": a lone surrogate passes YAML but can never be exported
            raise ConfigError(f"{node.start_mark.line + 1}: {format_loc(path)}: "
                              "not valid UTF-8 (lone surrogate escape)") from None
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            # complex keys (lists, maps) are rejected later by validation; keep paths hashable
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else repr(key_node.value)
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                if key in seen:
                    raise ConfigError(f"{key_node.start_mark.line + 1}: "
                                      f"{format_loc(path + (key,))}: duplicate key (first at line "
                                      f"{seen[key]})")
                seen[key] = key_node.start_mark.line + 1
            _walk(value_node, path + (key,), lines)
            # errors about a key point at the key's line, not the value's first line
            lines[path + (key,)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, path + (i,), lines)


def load_yaml(path: Path, text: str | None = None) -> tuple[Any, dict[tuple, int]]:
    """Parse one YAML document; return the data and a map from field path to line number."""
    if text is None:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    loader = None
    try:
        loader = _SafeLoader(text)
        node = loader.get_single_node()
        if node is None:
            return None, {}
        _expanded_size(node, MAX_EXPANDED_NODES)
        lines: dict[tuple, int] = {}
        _walk(node, (), lines)
        data = loader.construct_document(node)
    except ConfigError as exc:
        raise ConfigError(f"{path}:{exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: YAML nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: invalid YAML: {problem}") from exc
    finally:
        if loader is not None:
            loader.dispose()
    return data, lines


def line_of(lines: dict[tuple, int], loc: tuple) -> int | None:
    """The line of the deepest known prefix of a field path."""
    loc = tuple(loc)
    while loc:
        if loc in lines:
            return lines[loc]
        loc = loc[:-1]
    return lines.get(())


def format_loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


_NOISE = re.compile(r"^(Value error, |Assertion failed, )")
# a model validator's message that starts with the dotted field path it is about
_NAMED = re.compile(r"\A([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+): (.*)\Z", re.S)


def validation_message(path: Path, lines: dict[tuple, int], exc: ValidationError,
                       prefix: tuple = ()) -> str:
    """Render every pydantic error as ``file:line: field: message`` lines (up to 100)."""
    out = []
    errors = exc.errors()
    for err in errors[:100]:
        # pydantic adds the union/model tag names to loc; keep only the data path parts
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        msg = _NOISE.sub("", err["msg"])
        named = _NAMED.match(msg) if not loc else None
        if named:  # a model's own check naming the field it is about ("metrics.x.derive: ...")
            loc, msg = tuple(named.group(1).split(".")), named.group(2)
        loc = prefix + loc
        line = line_of(lines, loc)
        where = f"{path}:{line}" if line else str(path)
        out.append(f"{where}: {format_loc(loc)}: {msg}")
    if len(errors) > 100:
        out.append(f"{path}: ... and {len(errors) - 100} more errors")
    return "\n".join(out)


def load_model(path: Path, model: type[M], text: str | None = None) -> M:
    data, lines = load_yaml(path, text)
    if data is None:
        data = {}
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_message(path, lines, exc)) from None
