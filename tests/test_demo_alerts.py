"""The demo as a newcomer runs it (`make run` on a machine without GPUs), against a real
Prometheus with the shipped rules and a node_exporter, one full loop of its phases:

* each alert the demo is built to show fires, in its phase (``DEMO_ALERTS``); no other alert fires
  (``NOT_IN_THE_DEMO`` says why each of the others cannot);
* every dashboard panel's query finds data at some point of the loop, or has its documented
  reason (``PANELS_WITHOUT_DATA``); the table is written next to the test's artefacts.

Time-compressed: the simulator runs its phases ``SPEED`` times faster (``simulate.speed``), every
duration of the rules (``for:``, ``keep_firing_for:``, ranges, offsets) is divided by ``SPEED`` in
the test's copy, and the node-side windows (baseline bins, persistence, reference bins) by the
same factor in the exporter's configuration.  The real ``for:`` durations are covered by the
promtool unit tests (deploy/prometheus/tests); ``test_demo_at_real_speed`` (``-m soak``) runs the
uncompressed 50-minute loop and reports the time from start to each alert.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import urllib.parse
from pathlib import Path

import yaml

from exporter.simulate import load_scenario
from tests.conftest import REPO, require_binary
from tests.e2e_util import (
    ProcessSet,
    http_get,
    prom_query,
    start_exporter,
    start_node_exporter,
    start_prometheus,
)
from tests.promql_names import grafana_expr_to_promql
from tests.test_e2e_alerting import _dashboard_queries
from tests.test_soak import soak_only

PROM_DIR = REPO / "deploy" / "prometheus"
SPEED = float(os.environ.get("DEMO_SPEED", "20"))

# alert -> the demo phase it fires in (mappings/scenarios/demo.yaml)
DEMO_ALERTS = {
    "GPUMemoryContentionFraction": "bandwidth_saturation",
    "GPUMemoryContention": "bandwidth_saturation",
    "GPUArbitrationStallsHigh": "memory_pressure",
    "GPUThrottling": "thermal_throttle",
    "GPUTemperatureHigh": "thermal_throttle",
    "GPUOwnBaselineDeviation": "degraded",
    "GPUBandwidthDropUnderLoad": "degraded",
    "GPUXidErrors": "hardware_fault",
    "GPUXidCritical": "hardware_fault",
    "GPUEccUncorrectable": "hardware_fault",
    "GPURowRemapFailure": "hardware_fault",
    "GPUPcieLinkDegraded": "hardware_fault",
}
NOT_IN_THE_DEMO = {
    "GPUBaselineDeviation": "compares a GPU with the 7-day baseline of its model across the fleet "
                            "(15 minutes ago): one demo node for 50 minutes has no such baseline; "
                            "`make fleet` and deploy/prometheus/tests/alerts.test.yml show it",
    "GPUCrossCloudPerformanceVariance": "needs the same workload on two clouds: `make fleet`",
    "GPUExporterSourceDown": "the simulator is the demo's only source and does not fail; "
                             "tests/test_alertmanager.py and the promtool cases show it",
    "GPUContentionNotEvaluable": "every demo GPU has a compute or per-process signal (30-minute window)",
    "GPUMIGInstanceNotEvaluable": "no demo GPU is a pre-Hopper MIG GPU; contention.test.yml shows it",
    "GPUContentionCostOverBudget": "needs a workload label (Kubernetes enrichment) and $100 a day lost",
    "GPUDeviceLost": "no simulated GPU disappears; tests/test_reliability_faults.py and health.test.yml",
    "GPUExporterDown": "the demo's exporter answers its scrapes; deploy/prometheus/tests/absence.test.yml and "
                       "tests/test_fleet_faults.py kill one",
    "GPUExporterAbsent": "needs a node whose exporter target vanished (a node inventory); absence.test.yml",
}
# panels (by a metric their query reads) that find no data in the demo, and why
PANELS_WITHOUT_DATA = {
    "kube_pod_info": "kube-state-metrics series; no Kubernetes here",
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
        config.pop("alerting")
        config["scrape_configs"].append({"job_name": "node", "static_configs": [{"targets": [node.address]}],
                                         "relabel_configs": config["scrape_configs"][0]["relabel_configs"]})
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.prom = start_prometheus(procs, require_binary("prometheus", "prometheus"), config_path, tmp)
        self.exporter = start_exporter(procs, tmp, ["--simulate", "--config.file", str(cfg),
                                                    "--poll.interval", "500ms"])
        self.t0 = time.monotonic()
        self.start_unix = time.time()
        (prom_dir / "e2e-targets" / "exporter.json").write_text(json.dumps([{"targets": [self.exporter.address]}]))
        self.first_firing: dict[str, float] = {}
        self.resolved: dict[str, float] = {}
        self.pending_flips: dict[str, int] = {}

    def demo_seconds(self, t: float) -> float:
        return t * self.factor

    def phase_at(self, t: float) -> str:
        return self.scenario.phase_at(self.demo_seconds(t))[0].name

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
            for name in firing_before - firing:
                self.resolved.setdefault(name, t)
            for name in pending_before - pending - firing:  # pending, then neither: a flap
                self.pending_flips[name] = self.pending_flips.get(name, 0) + 1
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


def _report(run: DemoRun, panels: list[tuple[str, bool, str]], out: Path) -> str:
    lines = [f"demo loop at speed x{run.factor:g} ({run.loop / 60:.0f} demo minutes)",
             "", "| alert | phase | first firing, s since start (demo s) | resolved (demo s) |",
             "|---|---|---|---|"]
    for name in sorted(run.first_firing, key=run.first_firing.get):
        t = run.first_firing[name]
        res = run.resolved.get(name)
        lines.append(f"| {name} | {run.phase_at(t)} | {t:.0f} ({run.demo_seconds(t):.0f}) | "
                     f"{'' if res is None else f'{res:.0f} ({run.demo_seconds(res):.0f})'} |")
    lines += ["", f"pending flaps: {run.pending_flips or 'none'}", "",
              "| panel | data | reason when none |", "|---|---|---|"]
    lines += [f"| {w} | {'yes' if ok else 'NO'} | {why} |" for w, ok, why in panels]
    text = "\n".join(lines) + "\n"
    out.write_text(text)
    print(f"demo report: {out}")
    return text


def _check(run: DemoRun, panels: list[tuple[str, bool, str]]) -> None:
    misplaced = {}
    for name, phase in DEMO_ALERTS.items():
        t = run.first_firing.get(name)
        if t is None:
            misplaced[name] = "never fired"
            continue
        demo_t = run.demo_seconds(t) % run.loop
        begin = sum(p.duration for p in run.scenario.phases[:[p.name for p in run.scenario.phases].index(phase)])
        end = begin + run.scenario.phase(phase).duration
        # scrape, evaluation and polling lag: up to 90 demo seconds into the next phase
        if not begin <= demo_t <= end + 90:
            misplaced[name] = f"fired at demo second {demo_t:.0f} ({run.phase_at(t)}); its phase: {begin:.0f}-{end:.0f}"
    assert misplaced == {}, misplaced
    extra = set(run.first_firing) - set(DEMO_ALERTS)
    assert extra == set(), {n: NOT_IN_THE_DEMO.get(n, "not expected") for n in extra}
    # an alert the demo fires goes pending once per episode, never pending-and-back
    assert {n: c for n, c in run.pending_flips.items() if n in DEMO_ALERTS} == {}, run.pending_flips
    undocumented = [w for w, ok, why in panels if not ok and not why]
    assert undocumented == [], "panels without data and without a documented reason:\n" + "\n".join(undocumented)
    maybe = set(PANELS_MAYBE_WITHOUT_DATA.values())
    stale = [w for w, ok, why in panels if ok and why and why not in maybe]
    assert stale == [], f"panels documented as empty now have data; update PANELS_WITHOUT_DATA: {stale}"


def test_every_alert_not_in_the_demo_is_a_shipped_alert_with_a_reason():
    shipped = {r["alert"] for path in PROM_DIR.glob("rules/*.yml")
               for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"] if "alert" in r}
    assert set(DEMO_ALERTS) | set(NOT_IN_THE_DEMO) == shipped
    assert not set(DEMO_ALERTS) & set(NOT_IN_THE_DEMO)


def test_compress_divides_every_rule_duration():
    text = "        for: 5m\n        keep_firing_for: 10m\n    interval: 1m\n" \
           "        expr: rate(x[5m]) / (y offset 15m) + max_over_time(z[1h:1m])\n"
    assert compress(text, 15) == ("        for: 20000ms\n        keep_firing_for: 40000ms\n"
                                  "        expr: rate(x[20000ms]) / (y offset 60000ms) + "
                                  "max_over_time(z[240000ms:4000ms])\n")


def test_demo_fires_each_alert_in_its_phase_and_fills_every_panel(tmp_path):
    """One compressed loop (50 demo minutes in 50/SPEED minutes)."""
    with ProcessSet() as procs:
        run = DemoRun(tmp_path, SPEED, procs)
        run.watch(run.loop / SPEED + 15)
        panels = run.panel_table()
    _report(run, panels, _artefact_dir(tmp_path) / "demo-report.md")
    _check(run, panels)


@soak_only
def test_demo_at_real_speed(tmp_path):
    """The uncompressed loop (about 55 minutes): the times a newcomer sees after `make run`."""
    with ProcessSet() as procs:
        run = DemoRun(tmp_path, 1, procs)
        run.watch(run.loop + 300)
        panels = run.panel_table()
    _report(run, panels, _artefact_dir(tmp_path) / "demo-report-real-speed.md")
    _check(run, panels)
