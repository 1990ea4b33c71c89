"""Metric names and selectors referenced by a PromQL expression, for checking rules and dashboards.

Not a PromQL parser: good enough for the expressions we ship.  It removes string literals, label
matcher blocks, range/subquery brackets, label lists of by/without/on/ignoring/group_left/
group_right, durations, numbers and Grafana variables, then keeps the identifiers that are neither
keywords nor followed by "(" (function and aggregation calls).  `promtool check rules` proves the
syntax separately (see `grafana_expr_to_promql`).
"""

from __future__ import annotations

import re

KEYWORDS = frozenset({
    "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
    "group_right", "inf", "nan", "atan2",
})
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_GRAFANA_VAR = re.compile(r"\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*|\[\[[^\]]*\]\]")
_DURATION = re.compile(r"\b\d+(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*\b")
_NUMBER = re.compile(r"\b0x[0-9a-fA-F]+\b|(?<![A-Za-z_:])\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_NAME_MATCHER = re.compile(r'__name__\s*=\s*"([^"]*)"')
_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)?\s*\{([^{}]*)\}")
_LABEL_NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.*?)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$", re.S)

# What Grafana substitutes before a query reaches Prometheus; durations are picked to be valid.
_GRAFANA_SUBSTITUTIONS = {
    "$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h", "${__range}": "1h",
    "$__interval_ms": "60000", "$__range_s": "3600", "$__range_ms": "3600000",
}


def strip_grafana_variables(expr: str) -> str:
    """Replace Grafana's built-in interval variables by durations and other variables by `.*`."""
    for var in sorted(_GRAFANA_SUBSTITUTIONS, key=len, reverse=True):
        expr = expr.replace(var, _GRAFANA_SUBSTITUTIONS[var])
    return _GRAFANA_VAR.sub(".*", expr)


def grafana_expr_to_promql(expr: str) -> str:
    """A dashboard query as Prometheus would receive it with every variable set to All."""
    return strip_grafana_variables(expr)


def metric_names(expr: str) -> set[str]:
    """Metric names (including recording rule names) an expression reads."""
    names = set(_NAME_MATCHER.findall(expr))
    text = _STRING.sub('""', strip_grafana_variables(expr))
    text = _MATCHERS.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    previous = None
    while previous != text:  # label lists may follow one another: on (a) group_left (b)
        previous = text
        text = _LABEL_LIST.sub(" ", text)
    text = _DURATION.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    for match in _IDENT.finditer(text):
        word = match.group(0)
        if word.lower() in KEYWORDS:
            continue
        if text[match.end():].lstrip().startswith("("):
            continue  # function or aggregation call
        names.add(word)
    return names


def selectors(expr: str) -> list[tuple[str, frozenset[str]]]:
    """(metric name, label names used in its matchers) for every `name{...}` selector."""
    text = _STRING.sub('""', strip_grafana_variables(expr))
    out = []
    for match in _SELECTOR.finditer(text):
        name = match.group(1)
        if not name or name.lower() in KEYWORDS:
            continue
        labels = frozenset(_LABEL_NAME.findall(match.group(2))) - {"__name__"}
        out.append((name, labels))
    return out


def variable_query_names(query: str) -> set[str]:
    """Metric names of a Grafana Prometheus variable query (label_values(expr, label) or PromQL)."""
    match = _LABEL_VALUES.match(query)
    if match:
        return metric_names(match.group(1))
    return metric_names(query)


# ---------------------------------------------------------------------------------------------
# Names our rules and dashboards may reference besides the canonical ones.

# Exporter self-metrics (served by the daemon, not listed in canonical.yaml).
SELF_METRICS = frozenset({
    "unified_gpu_exporter_source_up",
    "unified_gpu_exporter_source_errors_total",
    "unified_gpu_exporter_device_up",
    "unified_gpu_exporter_build_info",
})

# node_exporter and kube-state-metrics series shown by the Temporal Correlation panels.
CORRELATION_METRICS = frozenset({
    "node_cpu_seconds_total",
    "node_network_receive_bytes_total",
    "node_network_transmit_bytes_total",
    "node_disk_reads_completed_total",
    "node_disk_writes_completed_total",
    "node_disk_read_time_seconds_total",
    "node_disk_write_time_seconds_total",
    "kube_pod_info",
})

# Series the scraper writes itself or other exporters on the node write (node liveness): the
# absence alerts (deploy/prometheus/rules/unified-gpu-exporter.absence.yml) read these, never a
# value of the exporter they watch.
TARGET_HEALTH_METRICS = frozenset({"up", "kube_node_info"})

# Indicator metrics referenced before they were added to mappings/canonical.yaml.  Empty: all of
# them (gpu_memory_contention ... gpu_contention_cost_dollars_total) are in canonical.yaml now.
# The lead removes this list after integration; a test fails if a listed name is already there.
PENDING_INDICATOR_NAMES: frozenset[str] = frozenset()

# Labels that Prometheus target relabeling or the exporter's enrichment may add to any GPU series.
TARGET_LABELS = frozenset({
    "instance", "job", "node", "cluster", "cloud", "region", "zone", "instance_type", "instance_id",
    "namespace", "pod", "container", "workload", "exporter_namespace", "exporter_pod",
})


def load_canonical(path) -> dict[str, frozenset[str]]:
    """canonical.yaml -> {metric sample name: label names a selector on it may use}."""
    import yaml

    doc = yaml.safe_load(open(path, encoding="utf-8"))
    common = set(doc.get("device_labels", [])) | set(doc.get("instance_labels", []))
    return {
        name: frozenset(common | set(spec.get("labels", [])) | set(spec.get("optional_labels", [])))
        for name, spec in doc["metrics"].items()
    }
