"""Which naming generation ("schema") an upstream target serves, and what follows from it.

A vendor exporter's upgrade can rename its series (dcgm-exporter 4.9 ships DCGM 4.7 names) and,
for a name that kept its spelling, change its unit (``DCGM_FI_DEV_GPU_UTIL_RATIO`` is field 203
in 0-100 % under DCGM 4.6, a 0-1 ratio under DCGM 4.7).  The mapping file lists the schemas,
most recent first, each with markers (a raw name, a raw-name prefix, a label name on a series)
that exist from that generation on; the last one is the oldest.  A marker proves a lower bound
only: DCGM keeps old names as aliases, so a 4.9 exporter with a custom collector CSV may serve
any mix of older names, and a name of generation G says "G or newer", never "exactly G".

A raw field whose unit depends on the generation has one rule per schema
(``DCGM_FI_DEV_GPU_UTIL_RATIO{schema="dcgm-4.7"}``).  The evidence is weighed per host behind a
target (the series' host label: one exporter, one version; a federating target may mix
versions), and what it rules out is remembered:

- the names and marker labels of the host's series give the lower bound (or the operator's
  ``schema`` pin of the target fixes the schema);
- every value of a dependent field rules out the schemas whose reading it cannot be: outside a
  rule's ``valid`` range after its scale (a ratio above 1), or a fraction where the rule says
  ``integer`` (DCGM INT64 fields).  NaN, blanks (``invalid``) and values no schema can read are no
  evidence (the mapper skips and counts them);
- a schema ruled out stays out while the host serves the same names and marker labels (an
  upgrade changes them) and the target keeps answering (``Memory``, kept by the source): a
  saturated GPU at exactly 1.0 keeps the unit its 0.45 proved an hour ago, and the report does
  not churn;
- the HELP text (dcgm-exporter copies it from its collector CSV) is a lower bound like a name,
  for this scrape only and only among the schemas the names and values still allow: a CSV
  written for an older generation keeps its text on a newer exporter, so a ``unit_help`` match
  proves only "at least the oldest schema read in that unit".  A "%" text therefore never reads
  1 as 1 %, while a "ratio" text breaks that tie; a text naming a unit the names and values rule
  out is ignored and reported (``help_conflicts``, logged by the source).

A field is read with the oldest schema left when every schema left gives one canonical value
for every value seen; otherwise it is skipped this scrape and counted as ``unit_ambiguous``.
The reported schema is the oldest one the evidence still allows (a lower bound that only rises
while the target serves the same names and HELP texts), or the file's ``schema_ambiguous`` once the evidence contradicts itself (values only one
unit can have next to values only the other can, or names against values): then nothing is
picked, and the host stays ambiguous until its names change or the target fails.  ``unknown``
lists the metric names that no rule maps and ``not_mapped`` does not list, so an operator sees
an upgrade that added or renamed fields.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# ``cm`` below is a compiled mapping file (exporter.map.mapping.CompiledMapping: ``rules``,
# ``schemas``, ``not_mapped``, ``schema_ambiguous``, ``schema_dependent``, ``schema_markers``),
# handed over by the daemon; a source does not import the mapping side (tests/test_layering.py),
# so it is read by attribute

MAX_HOSTS = 1024  # hosts remembered per target (their names come from the target's labels)
# per host behind one target: (its names and marker labels, the schemas its evidence ruled out)
Memory = dict[str, tuple[frozenset[str], frozenset[str]]]


@dataclass(frozen=True, slots=True)
class Resolution:
    """What one scrape of one host was recognised as."""

    schema: str  # reported in upstream_schema_info ("" when the mapping lists no schemas)
    chosen: dict[str, str] = field(default_factory=dict)  # dependent field -> schema read with
    skipped: frozenset[str] = frozenset()  # dependent fields whose unit is not proven
    ruled_out: frozenset[str] = frozenset()  # schemas to remember as ruled out
    help_conflicts: frozenset[str] = frozenset()  # fields whose HELP names a unit ruled out


@dataclass(slots=True)
class Group:
    """What one host behind a target served in one scrape."""

    names: set[str] = field(default_factory=set)  # raw fields, with and without selector labels
    labels: set[str] = field(default_factory=set)  # label names on its series
    values: dict[str, list[float]] = field(default_factory=dict)  # dependent field -> values


@dataclass(frozen=True, slots=True)
class TargetResolution:
    """One scrape of a target: per host, and what to remember for the next scrape."""

    schemas: tuple[str, ...]  # the schemas reported, one per distinct host result
    chosen: dict[tuple[str, str], str]  # (host, dependent field) -> schema read with
    skipped: frozenset[str]
    help_conflicts: frozenset[str]
    memory: Memory


def qualify(field: str, schema: str) -> str:
    """``name`` -> ``name{schema="S"}``; ``name{a="x"}`` -> ``name{a="x",schema="S"}``."""
    if field.endswith("}"):
        return f'{field[:-1]},schema="{schema}"}}'
    return f'{field}{{schema="{schema}"}}'


def group_by_host(hosts: Mapping[str, str], readings: Iterable[tuple[str, str, float, Any]],
                  label_names: Mapping[str, set[str]], dependent: frozenset[str]) -> dict[str, Group]:
    """The readings of one scrape per host (``hosts``: identity ref -> host label value)."""
    groups: dict[str, Group] = {}
    for ref, fld, value, _ in readings:
        host = hosts.get(ref, "")
        group = groups.get(host)
        if group is None:
            group = groups[host] = Group(labels=set(label_names.get(host, ())))
        group.names.add(fld)
        if fld.endswith("}"):
            group.names.add(fld.partition("{")[0])
        if fld in dependent:
            group.values.setdefault(fld, []).append(value)
    return groups


def resolve_target(cm: Any, groups: Mapping[str, Group], helps: Mapping[str, str], pin: str,
                   memory: Memory) -> TargetResolution:
    """``resolve`` for each host of a scrape, with what ``memory`` (the previous scrape's) kept
    for it; the memory returned holds the hosts of this scrape only."""
    markers = cm.schema_markers if cm is not None else frozenset()
    new: Memory = {}
    chosen: dict[tuple[str, str], str] = {}
    schemas: set[str] = set()
    skipped: set[str] = set()
    conflicts: set[str] = set()
    for host, group in groups.items():
        fingerprint = frozenset(group.names) | frozenset("label:" + lbl for lbl in group.labels & markers)
        kept = memory.get(host)
        ruled_out = kept[1] if kept is not None and kept[0] == fingerprint else frozenset()
        res = resolve(cm, group.names, group.labels, group.values, helps, pin, ruled_out)
        if len(new) < MAX_HOSTS:
            new[host] = (fingerprint, res.ruled_out)
        chosen.update(((host, fld), s) for fld, s in res.chosen.items())
        schemas.add(res.schema)
        skipped |= res.skipped
        conflicts |= res.help_conflicts
    return TargetResolution(tuple(sorted(schemas - {""})), chosen, frozenset(skipped), frozenset(conflicts), new)


def _lower_bound(cm: Any, names: set[str], labels: set[str]) -> int:
    for i, schema in enumerate(cm.schemas):
        if (names.intersection(schema.names) or labels.intersection(schema.labels)
                or any(n.startswith(p) for p in schema.prefixes for n in names)):
            return i
    return len(cm.schemas) - 1


def resolve(cm: Any, names: Iterable[str], label_names: Iterable[str], values: Mapping[str, list[float]],
            helps: Mapping[str, str], pin: str = "", ruled_out: frozenset[str] = frozenset()) -> Resolution:
    """The schema of one host's scrape and the schema each dependent field in ``values`` is read with.

    ``values``: the values of the scrape per schema-dependent raw field; ``helps``: HELP text
    per metric name; ``pin``: the target's ``schema`` option ("" = recognise); ``ruled_out``:
    the schemas earlier scrapes of this host ruled out (not used with a pin)."""
    if cm is None or not cm.schemas:
        return Resolution("")
    order = [s.name for s in cm.schemas]
    if pin:
        possible = [pin] if pin in order else []  # checked at load; fail closed regardless
    else:
        lowest = _lower_bound(cm, set(names), set(label_names))
        possible = [s for s in order[: lowest + 1] if s not in ruled_out]
    evidence = {fld: _evidence(cm, fld, order, vals) for fld, vals in values.items()}
    for fld, vals in evidence.items():
        possible = [s for s in possible if all(_fits(r, v) for r in _rules(cm, fld, s) for v in vals)]
    chosen: dict[str, str] = {}
    skipped: set[str] = set()
    conflicts: set[str] = set()
    reported = possible
    for fld, vals in evidence.items():
        left = possible
        said = _help_says(cm, fld, order, "" if pin else helps.get(fld.partition("{")[0], ""))
        if said and possible and said.isdisjoint(possible):
            conflicts.add(fld)  # e.g. a "%" text carried over into a 4.9 CSV: ignored
        elif said:  # the text proves "at least the oldest schema read in the unit it names"
            oldest = max(order.index(s) for s in said)
            left = [s for s in possible if order.index(s) <= oldest]
            reported = [s for s in reported if order.index(s) <= oldest] or reported
        if left and _one_reading(cm, fld, left, vals):
            chosen[fld] = left[-1]
        else:
            skipped.add(fld)
    remember = ruled_out if pin else frozenset(order).difference(possible)
    return Resolution(reported[-1] if reported else cm.schema_ambiguous, chosen, frozenset(skipped),
                      remember, frozenset(conflicts))


def _rules(cm: Any, fld: str, schema: str) -> tuple:
    return cm.rules.get(qualify(fld, schema), ())


def _evidence(cm: Any, fld: str, order: list[str], vals: list[float]) -> list[float]:
    """The distinct values of ``fld`` that are evidence: finite, not a blank of any of its rules,
    and readable under at least one schema (a value no schema can read is junk, not a vote)."""
    blanks = frozenset().union(*(r.invalid for s in order for r in _rules(cm, fld, s)))
    out = []
    for v in sorted({v for v in vals if math.isfinite(v) and v not in blanks}):
        if any(all(_fits(r, v) for r in _rules(cm, fld, s)) for s in order):
            out.append(v)
    return out


def _help_says(cm: Any, fld: str, order: list[str], help_text: str) -> set[str]:
    """The schemas whose ``unit_help`` the HELP text matches."""
    if not help_text:
        return set()
    return {s for s in order if any(r.unit_help is not None and r.unit_help.search(help_text)
                                    for r in _rules(cm, fld, s))}


def _fits(rule: Any, raw: float) -> bool:
    if rule.integer and raw != int(raw):
        return False
    value = raw * rule.scale + rule.offset
    return rule.valid is None or rule.valid[0] <= value <= rule.valid[1]


def _one_reading(cm: Any, fld: str, schemas: list[str], vals: list[float]) -> bool:
    """Every schema left gives the same canonical series and values for what was seen (0 % is
    0 as a ratio too)."""
    if not schemas:
        return False

    def outputs(schema: str) -> tuple:
        return tuple((r.metric, r.fixed, tuple(v * r.scale + r.offset for v in vals))
                     for r in _rules(cm, fld, schema))
    first = outputs(schemas[0])
    return all(outputs(s) == first for s in schemas[1:])


def dropped(cm: Any, fields: Iterable[str]) -> set[str]:
    """Metric names among ``fields`` that ``cm``'s ``not_mapped`` lists (dropped on purpose) and
    no rule maps."""
    if cm is None:
        return set()
    names = {f.partition("{")[0] for f in fields}
    return names - unknown(cm, names) - {raw.partition("{")[0] for raw in cm.rules}


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
