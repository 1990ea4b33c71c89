#!/usr/bin/env python3
"""The reference fleet on one machine: `make fleet` (and tests/test_fleet_e2e.py).

Starts, all on 127.0.0.1 with free ports:
  * simulated GPU nodes (``unified-gpu-exporter --simulate``), per cluster of deploy/fleet/topology.yaml,
    each with a config file carrying its cluster/cloud/region/workload labels;
  * one Prometheus in agent mode per cluster (deploy/fleet/prometheus-agent.yml with the cluster's
    external labels), remote_write to the central raw store;
  * the central raw store (victoria-metrics, per-GPU series for 15 days);
  * vmalert evaluating deploy/prometheus/rules/*.yml and deploy/fleet/rules/*.yml against the raw
    store, writing recorded series through vmagent, which fans them out to the raw store and to a
    long-term store (victoria-metrics) that keeps only the rollups (vmagent-longterm-relabel.yml);
  * Alertmanager (deploy/alertmanager/alertmanager.yml, its webhook receivers pointed at a local sink
    that counts notifications).

Ctrl-C (SIGINT) or SIGTERM stops everything it started.  Only the Python standard library and PyYAML.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
BINARIES = {
    "prometheus": "prometheus", "victoria-metrics": "victoria-metrics", "vmagent": "vmagent",
    "vmalert": "vmalert", "alertmanager": "prometheus-alertmanager",
}
RECEIVER_PREFIX = "http://alert-receiver.example:9095/"


@dataclass
class Cluster:
    name: str
    cloud: str
    region: str
    nodes: int
    scenario: str
    workload: str = "llm-train"


def load_topology(path: Path) -> list[Cluster]:
    doc = yaml.safe_load(Path(path).read_text())
    clusters = [Cluster(**c) for c in doc["clusters"]]
    names = [c.name for c in clusters]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: cluster names repeat")
    return clusters


def find_binary(name: str) -> str | None:
    return shutil.which(BINARIES.get(name, name))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 3.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _duration_seconds(text: str) -> float:
    total = 0.0
    for num, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)", str(text)):
        total += float(num) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800,
                               "y": 31536000}[unit]
    return total


def prepare_rules(dest: Path, max_for: str | None) -> list[Path]:
    """Copies of every rule file the central engine evaluates.  With ``max_for`` the copies drop
    the groups' own intervals (the engine's -evaluationInterval applies) and cap every ``for:`` at
    ``max_for``: a demo or a test sees alerts in seconds instead of 15 minutes."""
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    sources = sorted((REPO / "deploy" / "prometheus" / "rules").glob("*.yml")) + \
        sorted((HERE / "rules").glob("*.yml"))
    for src in sources:
        doc = yaml.safe_load(src.read_text())
        for group in doc["groups"]:
            for rule in group["rules"]:
                # Debian's vmalert (1.79) refuses keep_firing_for (a Prometheus 2.42+ field), so
                # the central copies go without it (docs/fleet.md: what that costs)
                rule.pop("keep_firing_for", None)
        if max_for is not None:
            cap = _duration_seconds(max_for)
            for group in doc["groups"]:
                group.pop("interval", None)
                for rule in group["rules"]:
                    if "for" in rule and _duration_seconds(rule["for"]) > cap:
                        rule["for"] = max_for
        path = dest / src.name
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        out.append(path)
    return out


class _Sink(http.server.BaseHTTPRequestHandler):
    """Alertmanager webhook receiver: counts notifications per receiver path."""

    counts: dict[str, int] = {}
    firing: dict[str, set[str]] = {}

    def do_POST(self) -> None:  # noqa: N802 (http.server API)
        body = self.rfile.read(min(int(self.headers.get("Content-Length", 0)), 10_000_000))
        receiver = self.path.strip("/")
        self.counts[receiver] = self.counts.get(receiver, 0) + 1
        try:
            for alert in json.loads(body).get("alerts", []):
                labels = alert.get("labels", {})
                if alert.get("status") == "firing":
                    key = f"{labels.get('alertname')}{{cloud={labels.get('cloud', '')}}}"
                    self.firing.setdefault(receiver, set()).add(key)
        except ValueError:
            pass
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@dataclass
class Proc:
    name: str
    cmd: list[str]
    log: Path
    ready_url: str | None = None
    popen: subprocess.Popen | None = None


@dataclass
class Fleet:
    workdir: Path
    clusters: list[Cluster]
    scrape_interval: str = "5s"
    eval_interval: str = "15s"
    max_for: str | None = "30s"          # None: the rules' own `for:` and group intervals
    latency_offset: str = "5s"           # how soon a sample is visible to queries in VictoriaMetrics
    python: str = sys.executable
    procs: list[Proc] = field(default_factory=list)
    urls: dict[str, str] = field(default_factory=dict)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    _sink: http.server.ThreadingHTTPServer | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 60.0) -> Fleet:
        missing = [b for b in BINARIES if find_binary(b) is None]
        if missing:
            raise RuntimeError(f"missing binaries: {', '.join(BINARIES[m] for m in missing)} "
                               "(Debian: prometheus victoria-metrics prometheus-alertmanager)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        try:
            self._start_sink()
            self._start_alertmanager()
            self._start_store("vm-raw", "15d")
            self._start_store("vm-longterm", "2y")
            self._start_vmagent()
            self._start_vmalert()
            self._start_nodes()
            self._start_agents()
            for proc in self.procs:
                self._wait_ready(proc, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.popen and proc.popen.poll() is None:
                proc.popen.terminate()
        deadline = time.monotonic() + 10
        for proc in reversed(self.procs):
            if proc.popen is None:
                continue
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait(timeout=5)
        self.procs = []
        if self._sink is not None:
            self._sink.shutdown()
            self._sink.server_close()
            self._sink = None

    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ queries
    def query(self, expr: str, store: str = "vm-raw") -> list[dict]:
        url = f"{self.urls[store]}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        status, body = http_get(url, timeout=10)
        if status != 200:
            raise RuntimeError(f"{store} query {expr!r}: HTTP {status}: {body[:300]!r}")
        return json.loads(body)["data"]["result"]

    def alertmanager_alerts(self) -> list[dict]:
        status, body = http_get(f"{self.urls['alertmanager']}/api/v2/alerts?active=true")
        return json.loads(body) if status == 200 else []

    def notifications(self) -> dict[str, set[str]]:
        return {k: set(v) for k, v in _Sink.firing.items()}

    def failed(self) -> list[str]:
        return [p.name for p in self.procs if p.popen and p.popen.poll() is not None]

    def logs(self, name: str, tail: int = 4000) -> str:
        path = self.workdir / "logs" / f"{name}.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    # ------------------------------------------------------------------ components
    def _spawn(self, name: str, cmd: list[str], ready_url: str | None, cwd: Path | None = None) -> Proc:
        log = self.workdir / "logs" / f"{name}.log"
        proc = Proc(name, cmd, log, ready_url)
        with open(log, "ab") as fh:
            proc.popen = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          cwd=str(cwd or self.workdir), start_new_session=True)
        self.procs.append(proc)
        return proc

    def _wait_ready(self, proc: Proc, timeout: float) -> None:
        if proc.ready_url is None:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.popen and proc.popen.poll() is not None:
                raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{self.logs(proc.name)}")
            try:
                if http_get(proc.ready_url, timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{proc.name} not ready at {proc.ready_url} after {timeout:.0f}s:\n{self.logs(proc.name)}")

    def _start_sink(self) -> None:
        _Sink.counts, _Sink.firing = {}, {}
        self._sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
        threading.Thread(target=self._sink.serve_forever, daemon=True).start()
        self.urls["webhook-sink"] = f"http://127.0.0.1:{self._sink.server_address[1]}"

    def _start_alertmanager(self) -> None:
        port = free_port()
        text = (REPO / "deploy" / "alertmanager" / "alertmanager.yml").read_text()
        conf = self.workdir / "alertmanager.yml"
        conf.write_text(text.replace(RECEIVER_PREFIX, self.urls["webhook-sink"] + "/")
                            .replace("group_wait: 30s", "group_wait: 5s"))
        self.urls["alertmanager"] = f"http://127.0.0.1:{port}"
        self._spawn("alertmanager", [
            find_binary("alertmanager"), f"--config.file={conf}", f"--storage.path={self.workdir / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
            f"--web.external-url=http://127.0.0.1:{port}"], f"{self.urls['alertmanager']}/-/ready")

    def _start_store(self, name: str, retention: str) -> None:
        port = free_port()
        self.urls[name] = f"http://127.0.0.1:{port}"
        self._spawn(name, [
            find_binary("victoria-metrics"), f"-httpListenAddr=127.0.0.1:{port}",
            f"-storageDataPath={self.workdir / (name + '-data')}", f"-retentionPeriod={retention}",
            f"-search.latencyOffset={self.latency_offset}", "-loggerLevel=WARN"],
            f"{self.urls[name]}/health")

    def _start_vmagent(self) -> None:
        port = free_port()
        self.urls["vmagent"] = f"http://127.0.0.1:{port}"
        self._spawn("vmagent", [
            find_binary("vmagent"), f"-httpListenAddr=127.0.0.1:{port}",
            f"-remoteWrite.tmpDataPath={self.workdir / 'vmagent-data'}",
            f"-remoteWrite.url={self.urls['vm-raw']}/api/v1/write",
            f"-remoteWrite.url={self.urls['vm-longterm']}/api/v1/write",
            # one value per -remoteWrite.url, in order: nothing dropped for the raw store
            f"-remoteWrite.urlRelabelConfig=,{HERE / 'vmagent-longterm-relabel.yml'}",
            "-remoteWrite.flushInterval=1s", "-loggerLevel=WARN"],
            f"{self.urls['vmagent']}/health")

    def _start_vmalert(self) -> None:
        port = free_port()
        rules = prepare_rules(self.workdir / "rules", self.max_for)
        self.urls["vmalert"] = f"http://127.0.0.1:{port}"
        self._spawn("vmalert", [
            find_binary("vmalert"), f"-httpListenAddr=127.0.0.1:{port}",
            *[f"-rule={p}" for p in rules],
            f"-datasource.url={self.urls['vm-raw']}",
            f"-remoteWrite.url={self.urls['vmagent']}",
            f"-remoteRead.url={self.urls['vm-raw']}",
            f"-notifier.url={self.urls['alertmanager']}",
            f"-evaluationInterval={self.eval_interval}",
            f"-external.url={self.urls['vmalert']}", "-loggerLevel=WARN"],
            f"{self.urls['vmalert']}/health")

    def _start_nodes(self) -> None:
        template = yaml.safe_load((HERE / "exporter-node.yml").read_text())
        for cluster in self.clusters:
            scenario = REPO / "mappings" / "scenarios" / f"{cluster.scenario}.yaml"
            for i in range(cluster.nodes):
                node = f"{cluster.name}-node-{i + 1}"
                port = free_port()
                conf = dict(template)
                conf["labels"] = {"cluster": cluster.name, "cloud": cluster.cloud, "region": cluster.region,
                                  "workload": cluster.workload}
                path = self.workdir / "nodes" / f"{node}.yml"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(yaml.safe_dump(conf, sort_keys=False))
                url = f"http://127.0.0.1:{port}"
                self.nodes.append({"cluster": cluster.name, "node": node, "url": url, "port": port})
                self._spawn(node, [
                    self.python, "-m", "exporter", "--simulate", str(scenario), f"--config.file={path}",
                    f"--web.listen-address=127.0.0.1:{port}", f"--state.dir={self.workdir / 'nodes' / node}",
                    "--log.level=warn"], f"{url}/metrics", cwd=REPO)

    def _start_agents(self) -> None:
        template = yaml.safe_load((HERE / "prometheus-agent.yml").read_text())
        for cluster in self.clusters:
            port = free_port()
            cdir = self.workdir / "agents" / cluster.name
            (cdir / "targets").mkdir(parents=True, exist_ok=True)
            targets = [{"targets": [n["url"].removeprefix("http://")], "labels": {"node": n["node"]}}
                       for n in self.nodes if n["cluster"] == cluster.name]
            (cdir / "targets" / "nodes.json").write_text(json.dumps(targets))
            conf = json.loads(json.dumps(template))
            conf["global"]["scrape_interval"] = self.scrape_interval
            conf["global"]["scrape_timeout"] = self.scrape_interval
            conf["global"]["external_labels"] = {"cluster": cluster.name, "cloud": cluster.cloud,
                                                 "region": cluster.region}
            for job in conf["scrape_configs"]:
                if job["job_name"] == "prometheus-agent":
                    job["static_configs"] = [{"targets": [f"127.0.0.1:{port}"]}]
            conf["remote_write"][0]["url"] = f"{self.urls['vm-raw']}/api/v1/write"
            conf["remote_write"][0]["queue_config"]["batch_send_deadline"] = "1s"
            (cdir / "prometheus.yml").write_text(yaml.safe_dump(conf, sort_keys=False))
            name = f"agent-{cluster.name}"
            self.urls[name] = f"http://127.0.0.1:{port}"
            self._spawn(name, [
                find_binary("prometheus"), "--enable-feature=agent", f"--config.file={cdir / 'prometheus.yml'}",
                f"--storage.agent.path={cdir / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn"], f"{self.urls[name]}/-/ready", cwd=cdir)

    # ------------------------------------------------------------------ what to print
    def summary(self) -> str:
        lines = ["", "unified-gpu-exporter reference fleet is running (Ctrl-C stops all of it):", ""]
        for cluster in self.clusters:
            state = "DEGRADED" if "degraded" in cluster.scenario else "healthy"
            lines.append(f"  cluster {cluster.name:<18} cloud={cluster.cloud:<6} region={cluster.region:<12} "
                         f"{cluster.nodes} node(s), {state}, agent {self.urls['agent-' + cluster.name]}/agent")
            for n in self.nodes:
                if n["cluster"] == cluster.name:
                    lines.append(f"      {n['node']:<28} {n['url']}/metrics")
        rules = "for: capped at " + self.max_for if self.max_for else "the rules' own for: durations"
        lines += [
            "",
            f"  central raw store    {self.urls['vm-raw']}/vmui   (per-GPU series, 15 days)",
            f"  long-term store      {self.urls['vm-longterm']}/vmui   (rollups only, 2 years)",
            f"  rule engine          {self.urls['vmalert']}/vmalert/groups   (vmalert, every {self.eval_interval}, {rules})",
            f"  Alertmanager         {self.urls['alertmanager']}/#/alerts",
            f"  Grafana: add a Prometheus data source at {self.urls['vm-raw']} and import deploy/grafana/*.json",
            "",
            "  Try in vmui:",
            "    cluster_cloud_region_model_workload:gpu_memory_bandwidth_gbps:avg",
            '    ALERTS{alertname="GPUCrossCloudPerformanceVariance"}   (cloud="azure" only, after a minute or two)',
            f"  Logs and data: {self.workdir}",
            "",
        ]
        return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--topology", type=Path, default=HERE / "topology.yaml")
    p.add_argument("--workdir", type=Path, help="logs and data (default: a new temporary directory, removed at exit)")
    p.add_argument("--scrape-interval", default="5s")
    p.add_argument("--eval-interval", default="15s")
    p.add_argument("--real-timing", action="store_true",
                   help="keep the rules' for: durations and group intervals (alerts take 15+ minutes)")
    args = p.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="ugpu-fleet-"))
    fleet = Fleet(workdir, load_topology(args.topology), scrape_interval=args.scrape_interval,
                  eval_interval=args.eval_interval, max_for=None if args.real_timing else "30s")
    stop = threading.Event()

    def _on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    try:
        print(f"starting the fleet in {workdir} ...", flush=True)
        fleet.start()
        print(fleet.summary(), flush=True)
        while not stop.wait(5):
            dead = fleet.failed()
            if dead:
                print(f"stopped unexpectedly: {', '.join(dead)} (see {workdir}/logs)", file=sys.stderr)
                return 1
        return 0
    except RuntimeError as exc:
        print(f"fleet: {exc}", file=sys.stderr)
        return 1
    finally:
        print("stopping the fleet ...", flush=True)
        fleet.stop()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
