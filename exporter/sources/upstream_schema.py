"""Which naming generation ("schema") an upstream target serves, and what follows from it.

A vendor exporter's upgrade can rename its series (dcgm-exporter 4.9 ships DCGM 4.7 names) and,
for a name that kept its spelling, change its unit (``DCGM_FI_DEV_GPU_UTIL_RATIO`` is field 203
in 0-100 % under DCGM 4.6, a 0-1 ratio under DCGM 4.7).  The mapping file lists the schemas,
most recent first, each recognised by any of its markers (a raw name, a raw-name prefix, a label
name on a series); the last one is the default.  Per scrape:

- ``detect`` names the target's schema;
- a raw field whose unit depends on the schema has rules qualified by it
  (``DCGM_FI_DEV_GPU_UTIL_RATIO{schema="dcgm-4.7"}``): ``qualify`` gives the reading that name;
- ``unknown`` lists the metric names that no rule maps and ``not_mapped`` does not list, so an
  operator sees an upgrade that added or renamed fields.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

# ``cm`` below is a compiled mapping file (exporter.map.mapping.CompiledMapping: ``rules``,
# ``schemas``, ``not_mapped``), handed over by the daemon; a source does not import the mapping
# side (tests/test_layering.py), so it is read by attribute

_SCHEMA_SELECTOR = re.compile(r'(?:,|(?<=\{))schema="([^"\\]*)"(?=[,}])')


def schema_dependent(cm: Any) -> frozenset[str]:
    """Raw fields of ``cm`` whose rules are qualified by a schema (the unqualified names)."""
    if cm is None:
        return frozenset()
    out = set()
    for raw in cm.rules:
        if 'schema="' in raw:
            base = _SCHEMA_SELECTOR.sub("", raw).replace("{,", "{")
            out.add(base[:-2] if base.endswith("{}") else base)
    return frozenset(out)


def qualify(field: str, schema: str) -> str:
    """``name`` -> ``name{schema="S"}``; ``name{a="x"}`` -> ``name{a="x",schema="S"}``."""
    if field.endswith("}"):
        return f'{field[:-1]},schema="{schema}"}}'
    return f'{field}{{schema="{schema}"}}'


def detect(cm: Any, names: Iterable[str], label_names: Iterable[str]) -> str:
    """The first schema of ``cm`` with a marker among ``names``/``label_names``, else its last
    schema; "" when the mapping lists none."""
    if cm is None or not cm.schemas:
        return ""
    names = set(names)
    labels = set(label_names)
    for schema in cm.schemas:
        if (names.intersection(schema.names) or labels.intersection(schema.labels)
                or any(n.startswith(p) for p in schema.prefixes for n in names)):
            return schema.name
    return cm.schemas[-1].name


def unknown(cm: Any, fields: Iterable[str]) -> set[str]:
    """Metric names among ``fields`` (raw fields, selector labels dropped) that no rule of ``cm``
    maps and its ``not_mapped`` does not list (an entry ending in ``*`` is a prefix)."""
    if cm is None:
        return set()
    known = {raw.partition("{")[0] for raw in cm.rules}
    exact = {n for n in cm.not_mapped if not n.endswith("*")}
    prefixes = tuple(n[:-1] for n in cm.not_mapped if n.endswith("*"))
    names = {f.partition("{")[0] for f in fields}
    return {n for n in names if n not in known and n not in exact and not n.startswith(prefixes)}
