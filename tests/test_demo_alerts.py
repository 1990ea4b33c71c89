"""The demo as a newcomer runs it (`make run` on a machine without GPUs), against a real
Prometheus with the shipped rules, a real Alertmanager with the shipped configuration (its
webhooks at the test's receiver) and a node_exporter, one full loop of its phases:

* each alert the demo is built to show fires once, in its phase, and resolves by the time its rule
  allows after the phase (``DEMO_ALERTS``); no other alert fires (``NOT_IN_THE_DEMO`` says why each
  of the others cannot);
* Alertmanager sends one notification per incident per GPU and phase (``_check_notifications``:
  one page per incident, issue 39): the driver_failure phase one source-down notification for
  the node, with its reason, and no resolved health alert; the held hardware_fault faults stay
  firing;
* every dashboard panel's query finds data at some point of the loop, or has its documented
  reason (``PANELS_WITHOUT_DATA``); the table is written next to the test's artefacts.

Time-compressed: the simulator runs its phases ``SPEED`` times faster (``simulate.speed``), every
duration of the rules (``for:``, ``keep_firing_for:``, ranges, offsets) is divided by ``SPEED`` in
the test's copy, and the node-side windows (baseline bins, persistence, reference bins) by the
same factor in the exporter's configuration.  The real ``for:`` durations are covered by the
promtool unit tests (deploy/prometheus/tests); ``test_demo_at_real_speed`` (``-m soak``) runs the
uncompressed 66-minute loop and reports the time from start to each alert.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import urllib.parse
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import yaml

from exporter.simulate import load_scenario
from tests.conftest import REPO, require_binary
from tests.e2e_util import (
    ProcessSet,
    WebhookReceiver,
    http_get,
    prom_query,
    start_alertmanager,
    start_exporter,
    start_node_exporter,
    start_prometheus,
)
from tests.promql_names import grafana_expr_to_promql
from tests.test_e2e_alerting import _dashboard_queries
from tests.test_soak import soak_only

PROM_DIR = REPO / "deploy" / "prometheus"
AM_CONFIG = REPO / "deploy" / "alertmanager" / "alertmanager.yml"
RECEIVER_BASE = "http://alert-receiver.example:9095/"
SPEED = float(os.environ.get("DEMO_SPEED", "20"))

LAG = 90.0  # scrape, evaluation and polling lag, in demo seconds


@dataclass(frozen=True)
class Shown:
    """Where an alert of the demo fires and by when it is resolved (demo seconds)."""

    phase: str  # fires in this phase: from its start to LAG after its end
    # resolved by: the start or end of this phase (default: `phase`'s end) plus `clears` (the
    # rule's windows and keep_firing_for), plus LAG
    clears: float = 0.0
    until: str | None = None
    edge: str = "end"
    held: bool = False  # a fault that holds until the GPU is reset and the exporter restarted


# alert -> where it fires in the demo (mappings/scenarios/demo.yaml) and why it resolves when
DEMO_ALERTS = {
    # contention lasts through memory_pressure; rate over 3m, then keep_firing_for 1m (issue 39:
    # within 5 minutes of the contention ending)
    "GPUMemoryContentionFraction": Shown("bandwidth_saturation", 4 * 60, until="memory_pressure"),
    "GPUMemoryContention": Shown("bandwidth_saturation", 2 * 60, until="memory_pressure"),  # keep_firing_for
    "GPUArbitrationStallsHigh": Shown("memory_pressure"),
    # the phase ends as the source goes down: unreadable, they hold (inhibited) until the GPUs are
    # read again at the end of driver_failure, cool; never resolved by the vanished series
    "GPUThrottling": Shown("thermal_throttle", 60, until="driver_failure"),  # max_over_time over 1m
    "GPUTemperatureHigh": Shown("thermal_throttle", until="driver_failure"),
    "GPUExporterSourceDown": Shown("driver_failure"),
    "GPUUnreadable": Shown("driver_failure"),  # never sent: inhibits the GPUs' alerts
    # node-side compare window, then keep_firing_for 15m; the H100 lost right after the phase
    # clears its flag only once it is back
    "GPUOwnBaselineDeviation": Shown("degraded", 16 * 60, until="gpu_lost"),
    "GPUBandwidthDropUnderLoad": Shown("degraded"),
    "GPUDeviceLost": Shown("gpu_lost"),
    # XID 13 at the phase's start: `increase(...[10m])` / a new series for 10 minutes
    "GPUXidErrors": Shown("hardware_fault", 10 * 60, edge="start"),
    # the XID 79 counted while lost and the uncorrectable ECC errors: held (issue 39)
    "GPUXidCritical": Shown("hardware_fault", held=True),
    "GPUEccUncorrectable": Shown("hardware_fault", held=True),
    "GPURowRemapFailure": Shown("hardware_fault"),
    "GPUPcieLinkDegraded": Shown("hardware_fault"),
    # the Intel GPU's job (degraded to hardware_fault): unknown more than half of 30 minutes, for
    # 10 minutes; resolved when the job ends
    "GPUContentionNotEvaluable": Shown("hardware_fault"),
}
NOT_IN_THE_DEMO = {
    "GPUBaselineDeviation": "needs a day of fleet baseline history (72 minutes at x20, more than a loop); "
                            "alerts.test.yml shows it",
    "GPUCrossCloudPerformanceVariance": "needs the same workload on two clouds: `make fleet`",
    "GPUContentionCostOverBudget": "needs $100 a day lost to contention by one workload: the demo node loses about "
                                   "$7 a day (its H100s; one loop at x20 lost $0.015), and its GPUs run no pods "
                                   "(no workload label: Kubernetes enrichment)",
    "GPUMIGInstanceNotEvaluable": "no demo GPU is a pre-Hopper MIG GPU; contention.test.yml shows it",
    "GPUExporterDown": "the demo's exporter answers its scrapes; deploy/prometheus/tests/absence.test.yml and "
                       "tests/test_fleet_faults.py kill one",
    "GPUExporterAbsent": "needs a node whose exporter target vanished (a node inventory); absence.test.yml",
}
# panels (by a metric their query reads) that find no data in the demo, and why
PANELS_WITHOUT_DATA = {
    "kube_pod_info": "kube-state-metrics series; no Kubernetes here",
    "gpu_job_info": "Slurm job mapping (enrich.hpc_jobs, docs/jobs.md); no scheduler in the demo",
    "gpu_memory_latency_nanoseconds": "no live source or importer reports memory latency",
    "cloud_model_workload:gpu_memory_bandwidth_gbps:avg": "needs a workload label (Kubernetes enrichment)",
    "gpu_process_memory_bytes": "the demo simulates per-process utilization, not per-process memory",
    "gpu_process_utilization_percent": "per-process series are opt-in (`processes: series`); the demo, like a "
                                       "default install, counts busy clients without exporting them "
                                       "(`simulate: {processes: series}` shows them)",
}
# panels that may or may not find data in one loop
PANELS_MAYBE_WITHOUT_DATA = {
    "gpu_metric_heavy_tail": "shows flagged signals on busy GPUs only; the simulator's uniform noise is "
                             "neither bimodal nor heavy-tailed, except across a phase change",
}
# dashboard variables whose label the plain demo does not carry (Grafana then offers only All)
VARIABLES_WITHOUT_VALUES = {
    "job_user": "set by the Slurm job mapping (enrich.hpc_jobs); no scheduler in the demo",
    "cluster": "set by each cluster's Prometheus external labels or the exporter's `labels:`",
    "cloud": "set by the cloud enrichment on a cloud VM, or a target label",
    "workload": "set by the Kubernetes enrichment",
}


def compress(text: str, factor: float) -> str:
    """Every duration of a rule file divided by ``factor``; group ``interval:`` lines removed."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

    def scaled(d: str) -> str:
        seconds = sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|[smhdw])", d))
        return f"{max(1, round(seconds / factor * 1000))}ms"

    text = re.sub(r"(?m)^\s*interval: .*\n", "", text)
    text = re.sub(r"(?m)^(\s*(?:for|keep_firing_for): )(\S+)$", lambda m: m[1] + scaled(m[2]), text)
    text = re.sub(r"\[(\d+(?:ms|[smhdw]))(:(\d+(?:ms|[smhdw]))?)?\]",
                  lambda m: f"[{scaled(m[1])}{':' + scaled(m[3]) if m[3] else (m[2] or '')}]", text)
    return re.sub(r"\boffset (\d+(?:ms|[smhdw]))", lambda m: f"offset {scaled(m[1])}", text)


def alertmanager_config(factor: float, receiver_url: str) -> str:
    """The shipped Alertmanager configuration, webhooks at ``receiver_url``, its waits and
    intervals divided by ``factor`` like the rules' durations."""
    text = AM_CONFIG.read_text()
    assert RECEIVER_BASE in text
    text = text.replace(RECEIVER_BASE, receiver_url.rstrip("/") + "/")
    return re.sub(r"(?m)^(\s*(?:group_wait|group_interval|repeat_interval|resolve_timeout): )(\S+)$",
                  lambda m: m[1] + compress(f"for: {m[2]}", factor).split(": ")[1], text)


def exporter_config(factor: float) -> str:
    """The demo's defaults with the node-side windows divided by ``factor``."""
    def s(seconds: float) -> str:
        return f"{seconds / factor:.3f}"
    return f"""\
simulate: {{speed: {factor}}}
indicators:
  variability: {{window_seconds: {s(60)}, min_samples: 5}}
  baseline: {{bin_seconds: {s(60)}, compare_seconds: {s(30)}, persistence_seconds: {s(60)}}}
  state:
    reference_bin_seconds: {s(5)}
    drop_compare_seconds: {s(5)}
    drop_persistence_seconds: {s(10)}
    drop_confirm_seconds: {s(900)}
    reference_reset_idle_seconds: {s(60)}
"""


def procs_receiver(procs: ProcessSet) -> WebhookReceiver:
    """A webhook receiver stopped with ``procs``."""
    receiver = WebhookReceiver().start()
    stop_all = procs.stop_all

    def stop() -> None:
        try:
            stop_all()
        finally:
            receiver.stop()
    procs.stop_all = stop  # type: ignore[method-assign]
    return receiver


class DemoRun:
    """One loop of the demo: alert transitions (seconds since the exporter started) and the stack."""

    def __init__(self, tmp: Path, factor: float, procs: ProcessSet) -> None:
        self.factor = factor
        self.scenario = load_scenario("demo")
        self.loop = sum(p.duration for p in self.scenario.phases)
        prom_dir = tmp / "prometheus"
        shutil.copytree(PROM_DIR, prom_dir)
        if factor != 1:
            for path in (prom_dir / "rules").glob("*.yml"):
                path.write_text(compress(path.read_text(), factor))
        (prom_dir / "e2e-targets").mkdir(exist_ok=True)
        cfg = tmp / "exporter.yml"
        cfg.write_text(exporter_config(factor) if factor != 1 else "labels: {}\n")
        node = start_node_exporter(procs, require_binary("prometheus-node-exporter",
                                                         "prometheus-node-exporter"), tmp)
        config_path = prom_dir / "prometheus-e2e.yml"
        config = yaml.safe_load(config_path.read_text())
        self.receiver = procs_receiver(procs)
        am_config = tmp / "alertmanager.yml"
        am_config.write_text(alertmanager_config(factor, self.receiver.url))
        self.am = start_alertmanager(procs, require_binary("prometheus-alertmanager", "prometheus-alertmanager"),
                                     am_config, tmp)
        (prom_dir / "e2e-targets").mkdir(exist_ok=True)
        (prom_dir / "e2e-targets" / "alertmanager.json").write_text(json.dumps([{"targets": [self.am.address]}]))
        config["scrape_configs"].append({"job_name": "node", "static_configs": [{"targets": [node.address]}],
                                         "relabel_configs": config["scrape_configs"][0]["relabel_configs"]})
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        # resend firing alerts at the compressed pace (Prometheus' default: every minute)
        self.prom = start_prometheus(procs, require_binary("prometheus", "prometheus"), config_path, tmp,
                                     extra=[f"--rules.alert.resend-delay={max(1, round(60 / factor))}s"])
        self.exporter = start_exporter(procs, tmp, ["--simulate", "--config.file", str(cfg),
                                                    "--poll.interval", "500ms"])
        self.t0 = time.monotonic()
        self.start_unix = time.time()
        (prom_dir / "e2e-targets" / "exporter.json").write_text(json.dumps([{"targets": [self.exporter.address]}]))
        self.first_firing: dict[str, float] = {}
        self.resolved: dict[str, float] = {}
        self.episodes: dict[str, int] = {}  # times an alert went from not firing to firing
        self.pending_flips: dict[str, list[float]] = {}  # when an alert went pending and back

    def demo_seconds(self, t: float) -> float:
        return t * self.factor

    def phase_at(self, t: float) -> str:
        return self.scenario.phase_at(self.demo_seconds(t))[0].name

    def phase_span(self, name: str) -> tuple[float, float]:
        """(start, end) of a phase in the first loop, demo seconds."""
        start = 0.0
        for p in self.scenario.phases:
            if p.name == name:
                return start, start + p.duration
            start += p.duration
        raise KeyError(name)

    def watch_seconds(self) -> float:
        """Real seconds to watch: one loop and the time its last alerts take to resolve."""
        latest = max(self.phase_span(a.until or a.phase)[0 if a.edge == "start" else 1] + a.clears
                     for a in DEMO_ALERTS.values() if not a.held)
        return (max(self.loop, latest) + 2 * LAG) / self.factor

    def watch(self, seconds: float) -> None:
        firing_before: set[str] = set()
        pending_before: set[str] = set()
        deadline = self.t0 + seconds
        while time.monotonic() < deadline:
            t = time.monotonic() - self.t0
            alerts = http_get(f"{self.prom.url}/api/v1/alerts").json()["data"]["alerts"]
            firing = {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}
            pending = {a["labels"]["alertname"] for a in alerts if a["state"] == "pending"}
            for name in firing - firing_before:
                self.first_firing.setdefault(name, t)
                self.episodes[name] = self.episodes.get(name, 0) + 1
            for name in firing_before - firing:
                self.resolved.setdefault(name, t)
            for name in pending_before - pending - firing:  # pending, then neither: a flap
                self.pending_flips.setdefault(name, []).append(t)
            firing_before, pending_before = firing, pending
            time.sleep(max(0.2, 1.0 / self.factor))

    def panel_table(self) -> list[tuple[str, bool, str]]:
        """(panel, has data at some point of the run, documented reason when not)."""
        end = time.time()
        rows = []
        for where, query in _dashboard_queries():
            rows.append((where, _has_data_in_run(self.prom, query, self.start_unix, end),
                         _reason(query) or ""))
        return rows


def _reason(query: str) -> str | None:
    match = _LABEL_VALUES.match((_QUERY_RESULT.match(query) or [None, query])[1])
    if match:
        return VARIABLES_WITHOUT_VALUES.get(match.group(2))
    for name, why in {**PANELS_WITHOUT_DATA, **PANELS_MAYBE_WITHOUT_DATA}.items():
        if re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", query):
            return why
    return None


_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.*?)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$", re.S)
_QUERY_RESULT = re.compile(r"^\s*query_result\((.*)\)\s*$", re.S)


def _has_data_in_run(prom, query: str, start: float, end: float) -> bool:
    query = (_QUERY_RESULT.match(query) or [None, query])[1]
    match = _LABEL_VALUES.match(query)
    if match:  # a variable: its label has a value now
        expr, label = match.groups()
        return any(r["metric"].get(label) for r in prom_query(prom, grafana_expr_to_promql(expr)))
    params = urllib.parse.urlencode({"query": grafana_expr_to_promql(query), "start": f"{start:.3f}",
                                     "end": f"{end:.3f}", "step": "2"})
    doc = http_get(f"{prom.url}/api/v1/query_range?{params}", timeout=10).json()
    assert doc["status"] == "success", (query, doc)
    return bool(doc["data"]["result"])


def _artefact_dir(tmp: Path) -> Path:
    base = os.environ.get("ARTIFACTS_DIR")
    path = Path(base) / "demo" if base else tmp
    path.mkdir(parents=True, exist_ok=True)
    return path


def _clock(demo_seconds: float) -> str:
    return f"{int(demo_seconds // 60)}:{int(demo_seconds % 60):02d}"


_QUERY_WHERE = re.compile(r"^(?P<dash>[^:]+\.json): (?P<panel>.*) \[(?P<ref>[A-Z]+)\]$")


def panel_tables(panels: list[tuple[str, bool, str]]) -> tuple[list[str], list[str]]:
    """The two tables of docs/demo.md from per-query results (where, has data, documented
    reason): one row per panel (data yes, no or partly; the reasons of its queries without data),
    one per dashboard variable or annotation."""
    by_panel: dict[tuple[str, str], list[tuple[str, bool, str]]] = {}
    others = []
    for where, ok, why in panels:
        m = _QUERY_WHERE.match(where)
        if m:
            by_panel.setdefault((m["dash"], m["panel"]), []).append((m["ref"], ok, why))
        else:
            others.append(f"| {where} | {'yes' if ok else 'no'} | {'' if ok else why} |")
    rows = []
    for (dash, panel), queries in by_panel.items():
        data = "yes" if all(ok for _, ok, _ in queries) else "no" if not any(ok for _, ok, _ in queries) else "partly"
        why = "; ".join(f"[{ref}] {reason}" for ref, ok, reason in queries if not ok)
        rows.append(f"| {dash} | {panel} | {data} | {why} |")
    return rows, others


def _report(run: DemoRun, panels: list[tuple[str, bool, str]], out: Path) -> str:
    lines = [f"demo loop at speed x{run.factor:g} ({run.loop / 60:.0f} demo minutes); times are demo "
             f"minutes:seconds since the exporter answered (seconds of this run x {run.factor:g})",
             "", "| alert | phase (starts at) | firing after | resolved after | episodes |", "|---|---|---|---|---|"]
    for name in sorted(run.first_firing, key=run.first_firing.get):
        t = run.first_firing[name]
        res = run.resolved.get(name)
        phase = run.phase_at(t)
        lines.append(f"| {name} | {phase} ({_clock(run.phase_span(phase)[0])}) | {_clock(run.demo_seconds(t))} | "
                     f"{'' if res is None else _clock(run.demo_seconds(res))} | {run.episodes.get(name, 0)} |")
    counts, _ = notification_counts(run)
    lines += ["", "| phase | incident | notifications |", "|---|---|---|",
              *[f"| {p} | {k} | {n} |" for (p, k), n in sorted(counts.items(), key=lambda kv: run.phase_span(kv[0][0]))]]
    rows, others = panel_tables(panels)
    flaps = {n: [_clock(run.demo_seconds(t)) for t in ts] for n, ts in run.pending_flips.items()}
    lines += ["", f"pending flaps (pending, then resolved without firing), demo time: {flaps or 'none'}", "",
              "| dashboard | panel | data | why not (queries without data) |", "|---|---|---|---|", *rows,
              "", "| dashboard: variable or annotation | values | why not |", "|---|---|---|", *others]
    text = "\n".join(lines) + "\n"
    out.write_text(text)
    notes = [{"path": n.path, "at": _clock(run.demo_seconds(n.received_at - run.t0)), "status": n.payload.get("status"),
              "alerts": [{"status": a["status"], "startsAt": a["startsAt"], **a["labels"]} for a in n.payload.get("alerts", [])]}
             for n in run.receiver.snapshot()]
    out.with_name(out.stem + "-notifications.json").write_text(json.dumps(notes, indent=1))
    print(f"demo report: {out}")
    return text


def _check(run: DemoRun, panels: list[tuple[str, bool, str]]) -> None:
    misplaced, unresolved = {}, {}
    for name, shown in DEMO_ALERTS.items():
        t = run.first_firing.get(name)
        if t is None:
            misplaced[name] = "never fired"
            continue
        demo_t = run.demo_seconds(t)
        begin, end = run.phase_span(shown.phase)
        if not begin <= demo_t <= end + LAG:
            misplaced[name] = f"fired at demo second {demo_t:.0f} ({run.phase_at(t)}); its phase: {begin:.0f}-{end:.0f}"
        res = run.resolved.get(name)
        if shown.held:
            if res is not None:
                unresolved[name] = f"held fault resolved at demo second {run.demo_seconds(res):.0f}"
            continue
        by = run.phase_span(shown.until or shown.phase)[0 if shown.edge == "start" else 1] + shown.clears + LAG
        if res is None or run.demo_seconds(res) > by:
            unresolved[name] = (f"resolved at demo second {run.demo_seconds(res):.0f}" if res is not None
                                else "never resolved") + f", due by {by:.0f}"
    assert misplaced == {}, misplaced
    assert unresolved == {}, unresolved
    # one episode per loop: no resolve and re-fire
    assert {n: c for n, c in run.episodes.items() if c != 1} == {}, run.episodes
    extra = set(run.first_firing) - set(DEMO_ALERTS)
    assert extra == set(), {n: NOT_IN_THE_DEMO.get(n, "not expected") for n in extra}
    # an alert the demo fires goes pending once per episode, never pending-and-back
    flaps = {n: [round(run.demo_seconds(t)) for t in ts] for n, ts in run.pending_flips.items() if n in DEMO_ALERTS}
    assert flaps == {}, f"pending and back at demo second: {flaps}"
    undocumented = [w for w, ok, why in panels if not ok and not why]
    assert undocumented == [], "panels without data and without a documented reason:\n" + "\n".join(undocumented)
    maybe = set(PANELS_MAYBE_WITHOUT_DATA.values())
    stale = [w for w, ok, why in panels if ok and why and why not in maybe]
    assert stale == [], f"panels documented as empty now have data; update PANELS_WITHOUT_DATA: {stale}"


def _incident_key(labels: dict) -> str:
    """What an incident is about: its GPU, else its source on its node, else its node."""
    if labels.get("uuid"):
        return f"gpu {labels.get('vendor')}:{labels.get('gpu')} {labels['uuid']}"
    if labels.get("source"):
        return f"source {labels['source']} on {labels.get('instance')}"
    return f"node {labels.get('instance')}"


def _unix(stamp: str) -> float:
    """Alertmanager's RFC 3339 time (nanoseconds, Z) as Unix seconds."""
    m = re.fullmatch(r"(.+?T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", stamp)
    assert m, stamp
    base = datetime.fromisoformat(m[1] + ("+00:00" if m[3] == "Z" else m[3]))
    return base.timestamp() + float(m[2] or 0)


def notification_counts(run: DemoRun) -> tuple[dict[tuple[str, str], int], list[str]]:
    """((phase, incident key) -> notifications that announced a new firing alert for it,
    resolved health alerts sent while a source was down)."""
    seen: set[str] = set()
    counts: dict[tuple[str, str], int] = {}
    resolved_while_down = []
    down_begin, down_end = run.phase_span("driver_failure")
    for note in sorted(run.receiver.snapshot(), key=lambda n: n.received_at):
        demo_t = run.demo_seconds(note.received_at - run.t0)
        new: dict[tuple[str, str], str] = {}
        for alert in note.payload.get("alerts", []):
            labels = alert["labels"]
            # the incident's phase: where its alert became active (a new alert of an existing
            # group waits for the group's next group_interval, which may be in the next phase)
            phase = run.phase_at(_unix(alert["startsAt"]) - run.start_unix)
            if alert["status"] == "resolved":
                if labels.get("category") == "hardware" and down_begin + LAG <= demo_t <= down_end:
                    resolved_while_down.append(f"{labels['alertname']} {_incident_key(labels)} at {_clock(demo_t)}")
                continue
            fp = alert.get("fingerprint") or json.dumps(labels, sort_keys=True)
            if fp not in seen:
                seen.add(fp)
                new.setdefault((phase, _incident_key(labels)), labels["alertname"])
        for key in new:
            counts[key] = counts.get(key, 0) + 1
    return counts, resolved_while_down


def _check_notifications(run: DemoRun) -> None:
    counts, resolved_while_down = notification_counts(run)
    twice = {k: n for k, n in counts.items() if n > 1}
    assert twice == {}, f"an incident of a GPU (or node) notified more than once in a phase: {twice}"
    assert resolved_while_down == [], f"health alerts sent as resolved while the source was down: {resolved_while_down}"
    down = [a for _, a in run.receiver.alerts("GPUExporterSourceDown")]
    assert len({json.dumps(a["labels"], sort_keys=True) for a in down}) == 1, down  # one per source and node
    assert "Driver/library version mismatch" in down[0]["annotations"]["description"], down[0]
    assert run.receiver.alerts("GPUUnreadable") == []  # inhibits; never sent
    # the phases' incidents each reached their receiver: one notification per GPU
    fault = {k[1] for k in counts if k[0] == "hardware_fault" and k[1].startswith("gpu ")}
    assert any(k.startswith("gpu nvidia:1 ") for k in fault) and any(k.startswith("gpu amd:0 ") for k in fault), counts
    lost = [k for k in counts if k[0] == "gpu_lost"]
    assert [k[1].split()[1] for k in lost] == ["nvidia:1"], counts
    # the degraded memory subsystem: one ticket per GPU (GPUOwnBaselineDeviation; the H100s'
    # GPUBandwidthDropUnderLoad is its symptom, inhibited), every H100 and MI300X reached
    degraded = sorted(k[1].split()[1] for k in counts if k[0] == "degraded")
    assert degraded == ["amd:0", "amd:1", "nvidia:0", "nvidia:1"], counts


def test_every_alert_not_in_the_demo_is_a_shipped_alert_with_a_reason():
    shipped = {r["alert"] for path in PROM_DIR.glob("rules/*.yml")
               for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"] if "alert" in r}
    assert set(DEMO_ALERTS) | set(NOT_IN_THE_DEMO) == shipped
    assert not set(DEMO_ALERTS) & set(NOT_IN_THE_DEMO)


def _doc_table(header: str) -> list[str]:
    text = (REPO / "docs" / "demo.md").read_text()
    m = re.search(re.escape(header) + r"\n\|[-|]+\|\n((?:\|.*\n)+)", text)
    assert m, f"docs/demo.md lost its table {header!r}"
    return [line.rstrip() for line in m.group(1).splitlines()]


def test_docs_demo_panel_tables_name_every_panel_with_its_documented_reasons():
    """docs/demo.md names exactly the dashboards' panels, variables and annotations, and says "no"
    (or "partly") exactly where a query has a documented reason to stay empty in the demo (the
    compressed run checks that those are the only empty ones)."""
    predicted = [(where, not _reason(query) or _reason(query) in PANELS_MAYBE_WITHOUT_DATA.values(),
                  _reason(query) or "") for where, query in _dashboard_queries()]
    rows, others = panel_tables(predicted)
    squash = lambda lines: [re.sub(r"\s+", " ", line.replace("| |", "|  |")) for line in lines]  # noqa: E731
    assert squash(_doc_table("| dashboard | panel | data | why not (queries without data) |")) == squash(rows)
    assert squash(_doc_table("| dashboard: variable or annotation | values | why not |")) == squash(others)
    count = re.search(r"(\d+) panels on the \w+ dashboards", (REPO / "docs" / "demo.md").read_text())
    assert count and int(count.group(1)) == len(rows)


def test_compress_divides_every_rule_duration():
    text = "        for: 5m\n        keep_firing_for: 10m\n    interval: 1m\n" \
           "        expr: rate(x[5m]) / (y offset 15m) + max_over_time(z[1h:1m])\n"
    assert compress(text, 15) == ("        for: 20000ms\n        keep_firing_for: 40000ms\n"
                                  "        expr: rate(x[20000ms]) / (y offset 60000ms) + "
                                  "max_over_time(z[240000ms:4000ms])\n")


def test_demo_fires_and_resolves_each_alert_in_its_phase_and_fills_every_panel(tmp_path):
    """One compressed loop (66 demo minutes in 66/SPEED minutes) and the minutes its last alerts
    take to resolve."""
    with ProcessSet() as procs:
        run = DemoRun(tmp_path, SPEED, procs)
        run.watch(run.watch_seconds())
        panels = run.panel_table()
    _report(run, panels, _artefact_dir(tmp_path) / "demo-report.md")
    _check(run, panels)
    _check_notifications(run)


@soak_only
def test_demo_at_real_speed(tmp_path):
    """The uncompressed loop (about 70 minutes): the times a newcomer sees after `make run`."""
    with ProcessSet() as procs:
        run = DemoRun(tmp_path, 1, procs)
        run.watch(run.watch_seconds())
        panels = run.panel_table()
    _report(run, panels, _artefact_dir(tmp_path) / "demo-report-real-speed.md")
    _check(run, panels)
