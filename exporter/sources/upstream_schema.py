"""Which naming generation ("schema") an upstream target serves, and what follows from it.

A vendor exporter's upgrade can rename its series (dcgm-exporter 4.9 ships DCGM 4.7 names) and,
for a name that kept its spelling, change its unit (``DCGM_FI_DEV_GPU_UTIL_RATIO`` is field 203
in 0-100 % under DCGM 4.6, a 0-1 ratio under DCGM 4.7).  The mapping file lists the schemas,
most recent first, each with markers (a raw name, a raw-name prefix, a label name on a series)
that exist from that generation on; the last one is the oldest.  A marker proves a lower bound
only: DCGM keeps old names as aliases, so a 4.9 exporter with a custom collector CSV may serve
any mix of older names, and a name of generation G says "G or newer", never "exactly G".

A raw field whose unit depends on the generation has one rule per schema
(``DCGM_FI_DEV_GPU_UTIL_RATIO{schema="dcgm-4.7"}``).  Per scrape ``resolve`` reads it with a unit
only when every signal agrees:

- the names and labels (the lower bound), or the operator's ``schema`` pin of the target;
- the HELP text the target serves for it (dcgm-exporter copies it from its collector CSV): a
  rule's ``unit_help`` pattern that matches rules the other readings out (not with a pin: the
  operator's word beats a copied help text);
- every value of it in the scrape: a value outside a rule's ``valid`` range after its scale (a
  ratio above 1), or a fraction where the rule says ``integer`` (DCGM INT64 fields), rules that
  reading out, pin or not.

What is left must give one canonical value for every value seen (then the field is read with
the oldest schema left); otherwise the field is skipped this scrape, counted as
``unit_ambiguous`` and the target's schema is reported as the file's ``schema_ambiguous``.
``unknown`` lists the metric names that no rule maps and ``not_mapped`` does not list, so an
operator sees an upgrade that added or renamed fields.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# ``cm`` below is a compiled mapping file (exporter.map.mapping.CompiledMapping: ``rules``,
# ``schemas``, ``not_mapped``, ``schema_ambiguous``), handed over by the daemon; a source does not
# import the mapping side (tests/test_layering.py), so it is read by attribute

_SCHEMA_SELECTOR = re.compile(r'(?:,|(?<=\{))schema="([^"\\]*)"(?=[,}])')


@dataclass(frozen=True, slots=True)
class Resolution:
    """What one scrape of a target was recognised as."""

    schema: str  # reported in upstream_schema_info ("" when the mapping lists no schemas)
    chosen: dict[str, str] = field(default_factory=dict)  # dependent field -> schema read with
    skipped: frozenset[str] = frozenset()  # dependent fields whose unit is not proven


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


def _lower_bound(cm: Any, names: set[str], labels: set[str]) -> int:
    for i, schema in enumerate(cm.schemas):
        if (names.intersection(schema.names) or labels.intersection(schema.labels)
                or any(n.startswith(p) for p in schema.prefixes for n in names)):
            return i
    return len(cm.schemas) - 1


def resolve(cm: Any, names: Iterable[str], label_names: Iterable[str],
            values: Mapping[str, list[float]], helps: Mapping[str, str], pin: str = "") -> Resolution:
    """The schema of one scrape and the schema each dependent field in ``values`` is read with.

    ``values``: the values of the scrape per schema-dependent raw field; ``helps``: HELP text
    per metric name; ``pin``: the target's ``schema`` option ("" = recognise)."""
    if cm is None or not cm.schemas:
        return Resolution("")
    order = [s.name for s in cm.schemas]
    if pin:
        candidates = [pin] if pin in order else []  # checked at load; fail closed regardless
    else:
        candidates = order[: _lower_bound(cm, set(names), set(label_names)) + 1]
    viable = list(candidates)
    for fld in sorted(values):
        allowed = _allowed(cm, fld, order, values[fld], "" if pin else helps.get(fld.partition("{")[0], ""))
        viable = [s for s in viable if s in allowed]
    chosen: dict[str, str] = {}
    skipped: set[str] = set()
    for fld, vals in values.items():
        if viable and _one_reading(cm, fld, viable, vals):
            chosen[fld] = viable[-1]
        else:
            skipped.add(fld)
    if skipped or not candidates:
        return Resolution(cm.schema_ambiguous, chosen, frozenset(skipped))
    return Resolution(viable[-1], chosen)


def _allowed(cm: Any, fld: str, order: list[str], vals: list[float], help_text: str) -> set[str]:
    """The schemas whose reading of ``fld`` the HELP text and every value allow."""
    rules = {s: cm.rules.get(qualify(fld, s), ()) for s in order}
    if help_text:
        said = {s for s, rs in rules.items() if any(r.unit_help is not None and r.unit_help.search(help_text)
                                                    for r in rs)}
        if said:  # the text names a unit: the readings in other units are out
            rules = {s: rs for s, rs in rules.items() if s in said}
    return {s for s, rs in rules.items() if all(_fits(r, v) for r in rs for v in vals)}


def _fits(rule: Any, raw: float) -> bool:
    if raw in rule.invalid or not math.isfinite(raw):
        return True  # a blank is no evidence (the mapper skips it)
    if rule.integer and raw != int(raw):
        return False
    value = raw * rule.scale + rule.offset
    return rule.valid is None or rule.valid[0] <= value <= rule.valid[1]


def _one_reading(cm: Any, fld: str, schemas: list[str], vals: list[float]) -> bool:
    """Every schema left gives the same canonical series and values for what was seen (0 % is
    0 as a ratio too)."""
    def outputs(schema: str) -> tuple:
        return tuple((r.metric, r.fixed, tuple(None if v in r.invalid else v * r.scale + r.offset for v in vals))
                     for r in cm.rules.get(qualify(fld, schema), ()))
    first = outputs(schemas[0])
    return all(outputs(s) == first for s in schemas[1:])


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
