"""Every self-metric of the exporter, declared once: name, type, help, labels and scope.

From these declarations the exposition renders them (``exposition.py``), docs/metrics.md lists
them (``exporter/docs.py``, ``make docs``) and the series filter knows their names.  A
per-source counter (``scope="source"``, type counter) needs nothing else but the line that
counts it, ``stats.counter(name)[label_value] += n`` on the runner's ``SourceStats``
(exporter/model.py): it is rendered per source from 0 (with ``always``'s label values), and a
reload carries it (``SourceStats.carry_from`` copies every field).  tests/test_self_metrics.py
checks every declared counter on a real daemon: bumped, reloaded, never back.

The per-source gauges are what the runner knows of the source (``SourceStats``: up, state,
polls, ...) or what its last poll reported (``PollResult.self_samples``, ``from_poll``); the
exposition renders each as its help says.  The process-wide ones are the exporter's own (the
renderer, the reload, the pipeline's CPU) and those of optional parts (the OTLP push, the web
config, the HPC job mapping), each counted where it happens and declared here.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..enrich import hpc_jobs
from . import otlp_stats, server_stats

SELF = "unified_gpu_exporter_"  # every self-metric's prefix


@dataclass(frozen=True)
class SelfMetric:
    name: str                     # after SELF
    type: str                     # gauge | counter
    help: str
    labels: tuple[str, ...] = ()  # per source: beyond `source`, which every one has
    scope: str = "process"        # source: one series (set) per enabled source
    always: tuple[str, ...] = ()  # a per-source counter's label values exported from 0
    from_poll: bool = False       # a per-source gauge the source reports (PollResult.self_samples)

    def __post_init__(self) -> None:
        if self.type not in ("gauge", "counter") or self.scope not in ("process", "source"):
            raise ValueError(f"{self.name}: type {self.type!r}, scope {self.scope!r}")
        if self.type == "counter" and not self.name.endswith("_total"):
            raise ValueError(f"{self.name}: a counter's name ends in _total")
        if self.scope == "source" and self.type == "counter":
            if len(self.labels) > 1:
                raise ValueError(f"{self.name}: a per-source counter has at most one label beyond source")
            if not self.labels:  # one series per source, from 0
                object.__setattr__(self, "always", ("",))

    @property
    def counted(self) -> bool:
        """Rendered from ``SourceStats.counts``, carried by a reload with them."""
        return self.scope == "source" and self.type == "counter"


def _source(name: str, typ: str, help_text: str, *labels: str, **kw) -> SelfMetric:
    return SelfMetric(name, typ, help_text, labels, "source", **kw)


def _optional(help_table: dict[str, tuple[str, str]], labels: dict[str, tuple[str, ...]]) -> list[SelfMetric]:
    """The declarations of an optional part's self-metrics (its module's help table)."""
    return [SelfMetric(n, t, h, labels.get(n, ())) for n, (t, h) in help_table.items()]


# in exposition and docs order
DECLARED: tuple[SelfMetric, ...] = (
    SelfMetric("build_info", "gauge",
               "Version of unified-gpu-exporter, the Python running it and the canonical "
               "metric schema it serves (mappings/canonical.yaml version), value 1.",
               ("version", "python_version", "schema_version")),
    _source("source_up", "gauge", "1 when the source's last poll succeeded within its timeout, else 0."),
    _source("source_enabled", "gauge",
            "1 per source that is enabled, with its state (up; down: enabled and "
            "failing; absent: on by default but its backend is not on this node, no "
            "source_up series; starting) and the reason it is not up.", "state", "reason"),
    _source("source_poll_duration_seconds", "gauge", "Duration of the source's last completed poll in seconds."),
    _source("source_last_success_timestamp_seconds", "gauge",
            "Unix time of the source's last successful poll. Values are polled at the source's "
            "interval, not collected at scrape time."),
    # timeout and exception: every source can have them, exported from 0 so rate() and alerts
    # see the first one
    _source("source_errors_total", "counter",
            "Errors per source by kind (timeout, exception, malformed_value, "
            "not_supported, read_error, device_lost, parse_error, "
            "profiling_unavailable, unit_ambiguous, ...).", "kind", always=("timeout", "exception")),
    _source("source_series", "gauge", "Canonical series produced by the source's last poll."),
    _source("device_up", "gauge", "1 while the device answers its source; 0 after it was lost, or while its source "
                                  "is down (source_up 0: nothing is known of it).", "vendor", "gpu", "uuid"),
    SelfMetric("render_duration_seconds", "gauge", "Time spent rendering the last exposition, in seconds."),
    SelfMetric("render_errors_total", "counter",
               "Renders that failed; the exposition then holds only self-metrics and "
               "/readyz is not ready until a render succeeds."),
    SelfMetric("invalid_utf8_replaced_total", "counter",
               "Label values and texts that were not valid UTF-8 and were "
               "exported with U+FFFD in place of the bad code points."),
    SelfMetric("config_last_reload_successful", "gauge", "1 if the last configuration (re)load succeeded."),
    SelfMetric("config_last_reload_success_timestamp_seconds", "gauge",
               "Unix time of the last successful configuration (re)load."),
    _source("upstream_schema_info", "gauge",
            "Value 1 per upstream target that answered its last poll and naming "
            "generation (schema) its hosts' series were recognised as (the oldest "
            "the evidence allows; mappings/upstream/<exporter>.yaml, schemas); e.g. "
            "dcgm-ambiguous when names and values contradict each other "
            "(source_errors_total{kind=\"unit_ambiguous\"} counts the values skipped).",
            "target", "exporter", "schema", from_poll=True),
    _source("upstream_unknown_fields", "gauge",
            "Metric names of an upstream target, in its last poll, that no "
            "mapping knows (an upgrade that added or renamed fields); the "
            "first ones are logged.", "target", "exporter", from_poll=True),
    _source("upstream_dropped_fields", "gauge",
            "Metric names of an upstream target, in its last poll, that the "
            "mapping drops on purpose (not_mapped; the reason per name is in "
            "docs/dcgm-migration.md \"Dropped\"); logged once per change.", "target", "exporter", from_poll=True),
    _source("privilege_separated", "gauge",
            "1 when the source's /proc scan runs in the separate counting process "
            "that alone holds CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH (docs/privileges.md), "
            "0 when it runs in the serving process (which then holds no capability either).", from_poll=True),
    SelfMetric("stage_cpu_seconds_total", "counter",
               "CPU seconds spent per stage of the pipeline (poll, map, fast_poll, "
               "fast_map per source; indicators, render), as of the last render; "
               "event_loop is the event loop thread outside those stages (asyncio, "
               "HTTP serving), other the rest of process_cpu_seconds_total (helper "
               "threads, hand-offs between threads): the rows add up to it.", ("stage", "source")),
    *_optional(otlp_stats.HELP, {"otlp_exports_total": ("result",)}),  # with exporters.otlp enabled
    *_optional(server_stats.HELP, {"web_config_reloads_total": ("result",)}),  # a web config / connection guard
    *_optional(hpc_jobs.HELP, {"hpc_job_files_refused_total": ("reason",)}),  # with enrich.hpc_jobs
)

BY_NAME: dict[str, SelfMetric] = {m.name: m for m in DECLARED}
if len(BY_NAME) != len(DECLARED):
    raise ValueError("a self-metric is declared twice")
# name -> (type, help), in declaration order (what dashboards, rules and the series filter check)
SELF_METRICS: dict[str, tuple[str, str]] = {m.name: (m.type, m.help) for m in DECLARED}
# the per-source counters: rendered from SourceStats.counts, carried by a reload
SOURCE_COUNTERS: tuple[SelfMetric, ...] = tuple(m for m in DECLARED if m.counted)
# self-metrics a source reports itself (PollResult.self_samples): a source cannot invent families
SOURCE_SELF_METRICS = frozenset(m.name for m in DECLARED if m.from_poll)
