"""A GPU's health: ok, degraded or failed, with the reasons, from the exporter's own series.

One definition, used by the node-problem-detector plugin (``probe.py``) and checked by tests
against the two other places that judge a GPU:

- the OTLP push's ``hw.status`` (``status:`` in mappings/otel.yaml): every rule there gives the
  same verdict here (``predicted_failure``, uncorrectable ECC, is ``failed`` here: the alert says
  "drain it", and a scheduler has no "predicted" state);
- the alert rules (deploy/prometheus/rules/unified-gpu-exporter.health.yml): the critical XID
  codes and the temperature thresholds are the alerts' own.

A node-problem-detector plugin sees one scrape, not a history, so the judgement is of the
current values: a critical XID or an uncorrectable ECC error counted since the exporter (or the
driver) started keeps the GPU ``failed`` until the GPU is reset and the exporter restarted, which
is what the runbooks ask for; a temperature or a link is judged as it is now (the alerts add
``for:`` durations; node-problem-detector's conditions have their own flap handling).

Each problem class is one NodeCondition in deploy/kubernetes/components/node-problem-detector.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

OK, DEGRADED, FAILED = "ok", "degraded", "failed"
_RANK = {OK: 0, DEGRADED: 1, FAILED: 2}

# XID codes that mean the GPU, not the application, is in trouble (the GPUXidCritical alert's):
# 48 double-bit ECC, 62 micro-controller halt, 64 row-remap recording failure, 74 NVLink error,
# 79 fallen off the bus, 95 uncontained ECC error, 119/120 GSP RPC timeout / error
CRITICAL_XIDS = frozenset({"48", "62", "64", "74", "79", "95", "119", "120"})
# sensor -> degrees C above which the GPU runs hot (the GPUTemperatureHigh alert's thresholds)
TEMPERATURE_LIMITS = {"gpu": 85.0, "edge": 85.0, "memory": 95.0, "junction": 100.0}
# throttle reasons that are heat (the GPUThrottling alert's thermal ones)
THERMAL_THROTTLE = frozenset({"hw_thermal", "sw_thermal", "thermal", "prochot"})

# problem class -> (NodeCondition type, what it covers); the order is the report's
CLASSES: dict[str, tuple[str, str]] = {
    "lost": ("GPULost", "the GPU no longer answers its driver (device_up 0)"),
    "xid": ("GPUXidCritical", "an XID error that means a hardware or driver failure"),
    "ecc": ("GPUEccUncorrectable", "uncorrectable memory (ECC/RAS) errors"),
    "remap": ("GPURowRemapFailure", "a failed (or pending) memory row remap"),
    "link": ("GPUPcieLinkDegraded", "a PCIe link below the width it supports"),
    "thermal": ("GPUThermal", "a temperature above its threshold or thermal throttling"),
}

# the series the definition reads (the probe parses only these families)
METRICS = ("unified_gpu_exporter_device_up", "gpu_xid_errors_total", "gpu_ecc_errors_total",
           "gpu_memory_remapped_rows", "gpu_pcie_link_width", "gpu_pcie_link_max_width",
           "gpu_temperature_celsius", "gpu_throttle_active", "gpu_info")

Labels = dict[str, str]
GpuKey = tuple[str, str, str]  # (vendor, gpu, uuid)


@dataclass
class Problem:
    cls: str
    state: str
    message: str


@dataclass
class GpuHealth:
    key: GpuKey
    problems: list[Problem] = field(default_factory=list)

    @property
    def state(self) -> str:
        return max((p.state for p in self.problems), key=_RANK.__getitem__, default=OK)

    def name(self) -> str:
        vendor, gpu, uuid = self.key
        return f"{vendor} GPU {gpu}" + (f" ({uuid[:16]})" if uuid else "")


def _key(labels: Labels) -> GpuKey:
    return labels.get("vendor", ""), labels.get("gpu", ""), labels.get("uuid", "")


def _labels(key: GpuKey) -> Labels:
    return dict(zip(("vendor", "gpu", "uuid"), key, strict=True))


def judge(samples: Iterable[tuple[str, Labels, float]]) -> dict[GpuKey, GpuHealth]:
    """Each GPU's health from ``(name, labels, value)`` samples of one scrape.  A GPU is known
    from ``gpu_info`` or ``device_up``; the rules below are the definition."""
    gpus: dict[GpuKey, GpuHealth] = {}
    width: dict[GpuKey, float] = {}
    max_width: dict[GpuKey, float] = {}
    xids: dict[GpuKey, set[str]] = {}

    def problem(labels: Labels, cls: str, state: str, message: str) -> None:
        h = gpus.setdefault(_key(labels), GpuHealth(_key(labels)))
        if all(p.message != message for p in h.problems):
            h.problems.append(Problem(cls, state, message))

    for name, labels, value in samples:
        if value != value:  # NaN: no reading, no verdict
            continue
        key = _key(labels)
        if name in ("gpu_info", "unified_gpu_exporter_device_up"):
            gpus.setdefault(key, GpuHealth(key))
        if name == "unified_gpu_exporter_device_up" and value == 0:
            problem(labels, "lost", FAILED, "lost (does not answer its driver)")
        elif name == "gpu_xid_errors_total" and labels.get("xid") in CRITICAL_XIDS and value > 0:
            xids.setdefault(key, set()).add(labels["xid"])
        elif name == "gpu_ecc_errors_total" and labels.get("severity") == "uncorrected" and value > 0:
            problem(labels, "ecc", FAILED, "uncorrectable ECC errors")
        elif name == "gpu_memory_remapped_rows" and value > 0 and labels.get("state") == "failure":
            problem(labels, "remap", FAILED, "row remap failed")
        elif name == "gpu_memory_remapped_rows" and value > 0 and labels.get("state") == "pending":
            problem(labels, "remap", DEGRADED, "row remap pending (needs a GPU reset)")
        elif name == "gpu_pcie_link_width" and not labels.get("gpu_instance"):
            width[key] = min(value, width.get(key, value))
        elif name == "gpu_pcie_link_max_width":
            max_width[key] = max(value, max_width.get(key, value))
        elif name == "gpu_temperature_celsius":
            limit = TEMPERATURE_LIMITS.get(labels.get("sensor", ""))
            if limit is not None and value > limit:
                problem(labels, "thermal", DEGRADED, f"{labels['sensor']} {value:.0f} C > {limit:.0f} C")
        elif name == "gpu_throttle_active" and value == 1 and labels.get("reason") in THERMAL_THROTTLE:
            problem(labels, "thermal", DEGRADED, f"thermal throttling ({labels['reason']})")
    for key, codes in xids.items():
        problem(_labels(key), "xid", FAILED,
                "critical XID " + ",".join(sorted(codes, key=int)))
    for key, w in width.items():
        if key in max_width and 0 < w < max_width[key]:
            problem(_labels(key), "link", DEGRADED,
                    f"PCIe link x{w:.0f} of x{max_width[key]:.0f}")
    return gpus


def node_state(gpus: dict[GpuKey, GpuHealth], classes: Iterable[str] = CLASSES) -> tuple[str, list[str]]:
    """The node's state for ``classes`` (the worst GPU's) and one message per GPU with a problem."""
    wanted = set(classes)
    state, messages = OK, []
    for h in sorted(gpus.values(), key=lambda g: (g.key[0], g.key[1].zfill(8), g.key[2])):
        mine = [p for p in h.problems if p.cls in wanted]
        if not mine:
            continue
        worst = max((p.state for p in mine), key=_RANK.__getitem__)
        state = max(state, worst, key=_RANK.__getitem__)
        messages.append(f"{h.name()} {worst}: " + "; ".join(p.message for p in mine))
    return state, messages
