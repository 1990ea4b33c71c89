"""docs/otel.md from mappings/canonical.yaml and mappings/otel.yaml:
``python -m exporter.otlp.docs > docs/otel.md`` (``make docs``; a test fails on drift)."""

from __future__ import annotations

import sys

from ..map.schema import Schema, load_schema
from .naming import OtelMapping, Resolved, Skip, load_mapping
from .resource import CLOUD_ATTRIBUTES, ENV_ATTRIBUTES

GUIDE = "docs/otel-guide.md"


def _attrs(metric: str, r: Resolved, schema: Schema, mapping: OtelMapping) -> str:
    m = schema.metrics[metric]
    parts = ["component: " + ", ".join(
        [f"`hw.type`={r.component.type}", f"`hw.id`=`<gpu>/{r.component.type}/{{{r.component.id_label}}}`",
         "`hw.parent`"])] if r.component else []
    parts += [f"`{k}`={v}" for k, v in sorted(r.set.items())]
    for label in [*m.labels, *m.optional_labels]:
        if label in r.without:  # such series take another rule
            continue
        attr = r.attribute(label, mapping.namespace)
        if not attr:
            continue
        values = r.values.get(label)
        vmap = " (" + ", ".join(f"{a}->{b}" for a, b in values.items()) + ")" if values else ""
        opt = "?" if label in m.optional_labels else ""
        parts.append(f"`{attr}`{opt}{vmap}")
    return ", ".join(parts) or "-"


PARTS = [
    "## Whole GPU and its parts", "",
    "A convention metric (`hw.*`) has the whole-GPU points only, so that the points of one `hw.id`",
    "add up (or average) to the GPU: summing `hw.gpu.memory.usage` or `hw.errors` over a GPU's",
    "attributes counts nothing twice. The series of a part of a GPU (a MIG instance, a power",
    "domain, an AMD RAS block: the rows above with `where no ...` on the convention name) go to",
    "the same name of ours without `hw.`: `gpu.memory.usage` and `gpu.memory.limit` per",
    "`gpu.mig.gpu_instance`, `gpu.power` and `gpu.energy` per `gpu.power.domain`, `gpu.errors` per",
    "`gpu.ras.block`. Where a source reports only the parts (AMD ECC counts per block on a",
    "virtual machine), the GPU's value is their sum; the convention metric has no point then.",
]
ERRORS = [
    "## hw.errors", "",
    "`hw.errors` counts the GPU's memory ECC/RAS errors since the driver loaded, `error.type` =",
    "`corrected` or `uncorrected` (the two values the GPU refinement of `hw.errors` recommends), or",
    "`deferred` (AMD: an uncorrectable error whose handling the hardware deferred; AMD counts it",
    "apart from both). Other error counts are ours, because they would count one fault twice in",
    "a sum of `hw.errors`: XID events (`gpu.xid.errors`; an uncorrected ECC error also raises",
    "XID 48), interconnect link errors (`gpu.interconnect.errors`; a CRC error and the replay it",
    "causes are both counted) and PCIe replays (`gpu.pcie.replays`, link-level retries).", "",
    "Not sent: `hw.firmware_version` (Recommended for GPU metrics; the exporter does not collect",
    "firmware versions).",
]


def render(schema: Schema, mapping: OtelMapping) -> str:
    out = [
        "# OpenTelemetry names (OTLP push)",
        "",
        "Generated from `mappings/canonical.yaml` and `mappings/otel.yaml` by `make docs`; a test fails",
        "when this file is out of date. How to enable the push, wire a Collector and what the",
        f"conventions cannot express: [{GUIDE.split('/')[-1]}]({GUIDE.split('/')[-1]}).",
        "",
        f"Names follow the OpenTelemetry semantic conventions **{mapping.semconv}** (schema URL",
        f"`{mapping.schema_url}` on every push; `semconv` in `mappings/otel.yaml` is the one place",
        "the version is written). The hardware conventions (`hw.*`) have status **Development**: a",
        "later version may rename them. What no convention covers is ours, under "
        f"`{mapping.namespace}*`.",
        "",
        "Every point of a GPU carries its identity: "
        + ", ".join(f"`{k}`=`{v}`" for k, v in mapping.identity.items())
        + f" (`hw.id` falls back to `{mapping.id_fallback}`"
          " without a uuid; empty values are left off). A *component* point (a sensor or a fan of"
          " the GPU) has `hw.type` of that component, its own `hw.id` and the GPU's `hw.id` as"
          " `hw.parent`. A label not named below becomes `" + mapping.namespace + "<label>`; pod"
          " labels copied by pod attribution (`label_<key>`) become `k8s.pod.label.<key>`.",
        "Temporality is cumulative for every sum and histogram.",
        "",
        "| canonical | OTel name | instrument | unit | x | attributes |",
        "|---|---|---|---|---|---|",
    ]
    for metric, mdef in schema.metrics.items():
        if mdef.internal:
            continue
        entry = mapping.entry(metric, schema)
        if isinstance(entry, Skip):
            out.append(f"| `{metric}` | - | - | - | - | {entry.skip} |")
            continue
        for r in mapping.rules(metric, schema):
            when = [f"{k} in {'/'.join(sorted(v))}" for k, v in r.when.items()]
            when += [f"no {'/'.join(sorted(r.without))}"] if r.without else []
            name = f"`{r.name}`" + (f" (where {'; '.join(when)})" if when else "")
            out.append(f"| `{metric}` | {name} | {r.instrument} | `{r.unit}` | {r.scale:g} | "
                       f"{_attrs(metric, r, schema, mapping)} |")
    out += ["", "`attribute?`: present where the canonical label is (optional labels).", "", *PARTS, "",
            *ERRORS, "", "## hw.status", "",
            "`hw.status` (UpDownCounter, `1`): one point per GPU and `hw.state` "
            "(ok, degraded, failed, predicted_failure), 1 for the GPU's state. The first rule that "
            "matches gives the state, else ok:", ""]
    for s in mapping.status:
        w = s.when
        labels = "{" + ",".join(f'{k}="{v}"' for k, v in w.labels.items()) + "}" if w.labels else ""
        cond = f"== {w.equals:g}" if w.equals is not None else f"> {w.above:g}"
        out.append(f"- `{s.state}`: `{w.metric}{labels}` {cond}")
    out += ["", "## Resource", "",
            "`service.name`=unified-gpu-exporter, `service.version`, `host.name`; from the cloud enricher: "
            + ", ".join(f"`{a}` ({k})" for k, a in CLOUD_ATTRIBUTES.items())
            + "; from the environment (Kubernetes downward API): "
            + ", ".join(f"`{a}` (${v})" for v, a in ENV_ATTRIBUTES.items())
            + ", or `enrich.kubernetes.node_name`; the config's static `labels` as they are named; "
              "`exporters.otlp.resource_attributes` last (they win).", ""]
    return "\n".join(out)


def main() -> int:
    schema = load_schema()
    sys.stdout.write(render(schema, load_mapping(schema)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
