"""Generate docs/metrics.md from mappings/canonical.yaml: `python -m exporter.docs > docs/metrics.md`."""

from __future__ import annotations

import sys

from .map.schema import Schema, load_schema
from .render.process_metrics import HELP as PROCESS_HELP
from .render.self_metrics import SELF, SELF_METRICS


def render(schema: Schema) -> str:
    out = [
        "# Metrics reference",
        "",
        "Generated from `mappings/canonical.yaml` by `make docs`; a test fails when this file is out",
        "of date. Every per-device series carries the labels "
        + ", ".join(f"`{x}`" for x in schema.device_labels) + ".",
        "Identity (model, driver, PCI bus id, serial) is only on `gpu_info`.",
        "",
        "| metric | type | unit | labels | description |",
        "|---|---|---|---|---|",
    ]
    for name, m in schema.metrics.items():
        if m.internal:
            continue  # evidence inputs of the indicators, never served
        labels = ", ".join([f"`{x}`" for x in m.labels] + [f"`{x}`?" for x in m.optional_labels])
        help_text = " ".join(m.help.split()).replace("|", "\\|")
        if m.variant_of is not None:
            help_text += f" *`{m.variant_of}` in {m.unit} (x {m.derive.scale:g}), for every source that reports it.*"
        elif m.derive is not None:
            ops = f" {'/' if m.derive.op == 'ratio' else 'x'} ".join(f"`{o}`" for o in m.derive.operands_text)
            help_text += f" *Derived when no source reports it: {ops} x {m.derive.scale:g}.*"
        out.append(f"| `{name}` | {m.type} | {m.unit or '-'} | {labels or '-'} | {help_text} |")
    out += ["", "`label?` = optional label, present where the hardware has that dimension.", "",
            "## Exporter self-metrics", "", "| metric | type | description |", "|---|---|---|"]
    for name, (typ, help_text) in SELF_METRICS.items():
        out.append(f"| `{SELF + name}` | {typ} | {help_text} |")
    for name, (typ, help_text) in PROCESS_HELP.items():  # the names every exporter uses
        out.append(f"| `{name}` | {typ} | {help_text} |")
    return "\n".join(out) + "\n"


def main() -> int:
    sys.stdout.write(render(load_schema()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
