#!/usr/bin/env python3
"""Render the shipped rule files with a deployment's settings: the job names of the exporter and
of node_exporter, and the runbooks' base URL (deploy/prometheus/rules-settings.yml documents them).

    scripts/gen-rules.py --settings my-settings.yml --out DIR   # DIR/<file> for every rule file
    scripts/gen-rules.py --check                                 # the shipped files use the shipped settings

The shipped files are the rendering with the shipped settings: every job selector of the exporter
is ``job=~"<exporter_job>"``, every one of node_exporter ``job=~"<node_job>"``, every runbook_url
``<runbook_base>#<alert>``; rendering replaces exactly those, checks that the result names the new
values everywhere the old ones were, and leaves the rest byte for byte.  Rule files: every
``*.yml`` of deploy/prometheus/rules and deploy/fleet/rules (``--rules DIR`` to choose).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "deploy" / "fleet"))
sys.path.insert(0, str(REPO / "scripts"))
from fleet_util import link_runbooks, runbook_base  # noqa: E402
from genfile import write_or_check  # noqa: E402

SETTINGS = REPO / "deploy" / "prometheus" / "rules-settings.yml"
RULE_DIRS = [REPO / "deploy" / "prometheus" / "rules", REPO / "deploy" / "fleet" / "rules"]
KEYS = ("exporter_job", "node_job", "runbook_base")
# the fleet's own components (deploy/fleet), named by its deployment, not by these settings
OTHER_JOBS = frozenset({"fleet-agent|fleet-central"})
_RUNBOOK = re.compile(r"runbook_url:[ \t]*'?(?P<base>[^'#\s]*)#")


def load_settings(path: Path) -> dict[str, str]:
    """The shipped settings, overridden by ``path``'s; a bad value is an error naming it."""
    shipped = yaml.safe_load(SETTINGS.read_text())
    doc = yaml.safe_load(path.read_text()) if path != SETTINGS else shipped
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a mapping with {', '.join(KEYS)}")
    unknown = sorted(set(doc) - set(KEYS))
    if unknown:
        raise ValueError(f"{path}: unknown setting(s) {unknown}; known: {', '.join(KEYS)}")
    out = {**shipped, **doc}
    for key in ("exporter_job", "node_job"):
        value = out[key]
        if not isinstance(value, str) or not value or any(c in value for c in '"\\\n{}'):
            raise ValueError(f"{path}: {key}: a non-empty regular expression without quotes, backslashes, "
                             f"braces or newlines, got {value!r}")
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"{path}: {key}: {value!r} is not a regular expression: {exc}") from None
    out["runbook_base"] = runbook_base(str(out["runbook_base"]))
    return out


def render(text: str, old: dict[str, str], new: dict[str, str], where: str) -> str:
    """``text`` (written with ``old``) with ``new``'s selectors and runbook links."""
    for key in ("exporter_job", "node_job"):
        text = text.replace(f'job=~"{old[key]}"', f'job=~"{new[key]}"')
    if "runbook_url" in text:
        text = link_runbooks(text, new["runbook_base"], where)
    return text


def check(text: str, settings: dict[str, str], where: str) -> list[str]:
    """What in ``text`` does not follow ``settings``: a job selector on `up` that is neither
    setting, a runbook link with another base."""
    problems = []
    for sel in re.findall(r'\bup\{job=~"([^"]*)"', text):
        if sel not in (settings["exporter_job"], settings["node_job"]) and sel not in OTHER_JOBS:
            problems.append(f"{where}: up{{job=~{sel!r}}} is not a setting (exporter_job or node_job)")
    for m in _RUNBOOK.finditer(text):
        if m.group("base") != settings["runbook_base"]:
            problems.append(f"{where}: runbook_url base {m.group('base')!r} is not {settings['runbook_base']!r}")
    return problems


def rule_files(dirs: list[Path]) -> list[Path]:
    return [p for d in dirs for p in sorted(d.glob("*.yml"))]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--settings", type=Path, default=SETTINGS, help="your settings (default: the shipped ones)")
    p.add_argument("--out", type=Path, help="directory for the rendered rule files")
    p.add_argument("--rules", type=Path, action="append", help="a directory of rule files (default: both shipped)")
    p.add_argument("--check", action="store_true", help="exit 1 when a shipped file does not follow the shipped settings")
    args = p.parse_args(argv)
    try:
        shipped, wanted = load_settings(SETTINGS), load_settings(args.settings)
    except (OSError, ValueError) as exc:
        p.error(str(exc))
    files = rule_files(args.rules or RULE_DIRS)
    if args.check:
        problems = [x for f in files for x in check(f.read_text(), shipped, str(f.relative_to(REPO)))]
        for x in problems:
            print(x, file=sys.stderr)
        return 1 if problems else 0
    if args.out is None:
        p.error("--out DIR is needed to render (or --check)")
    rendered = {}
    for f in files:
        text = render(f.read_text(), shipped, wanted, str(f))
        problems = check(text, wanted, str(f))
        if problems:
            p.error("; ".join(problems))
        rendered[args.out / f.name] = text
    args.out.mkdir(parents=True, exist_ok=True)
    return write_or_check(rendered, wrote="wrote {path}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
