#!/usr/bin/env python3
"""The reference fleet on one machine: `make fleet` (and tests/test_fleet_e2e.py, test_fleet_faults.py).

Starts, all on 127.0.0.1 with free ports:
  * simulated GPU nodes (``unified-gpu-exporter --simulate``), per cluster of deploy/fleet/topology.yaml,
    and the host's node_exporter standing for every simulated node's liveness (GPUExporterAbsent);
  * two edge agents per cluster (vmagent, disk-backed queue; or ``--edge prometheus``: two Prometheus
    agents), each scraping the cluster's exporters, the node_exporter once per node and its peer,
    writing over TLS with the cluster's bearer token to the central ingest;
  * the central ingest (vmauth: TLS, one token per cluster, `cluster` enforced per token) in front
    of the raw store (victoria-metrics, deduplicating the pairs, per-GPU series for 15 days);
  * two vmalert replicas evaluating deploy/prometheus/rules/*.yml and deploy/fleet/rules/*.yml,
    restoring alert state from the raw store, writing recorded series through the central vmagent,
    which also scrapes the central components and fans out to the raw store and to a long-term
    store that keeps only rollups (vmagent-longterm-relabel.yml), one sample per evaluation;
  * two clustered Alertmanager peers (deploy/alertmanager/alertmanager.yml, webhooks pointed at a
    local sink that records every notification).

A process that dies is reported and the rest keeps running.  From another shell:
  fleet.py --workdir W --kill agent-aws-use1-train-0 [--down 60]   # SIGKILL, restart after 60 s
  fleet.py --workdir W --restart vm-raw
Ctrl-C (SIGINT) or SIGTERM stops everything.  Only the Python standard library and PyYAML.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet_edge import BINARIES, REPLICAS, Cluster, EdgeMixin, find_binary  # noqa: E402,F401  (Cluster: part of this module's API)
from fleet_procs import Supervisor  # noqa: E402
from fleet_util import (  # noqa: E402,F401  (re-exported for tests and callers)
    HERE,
    REPO,
    RUNBOOK_DEFAULT,
    WebhookSink,
    capped_for,
    duration_seconds,
    free_port,
    http_get,
    link_runbooks,
    prepare_rules,
    self_signed_tls,
    write_secret,
)

_duration_seconds = duration_seconds  # the name older callers use
RECEIVER_PREFIX = "http://alert-receiver.example:9095/"


def load_topology(path: Path) -> list[Cluster]:
    doc = yaml.safe_load(Path(path).read_text())
    clusters = [Cluster(**c) for c in doc["clusters"]]
    names = [c.name for c in clusters]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: cluster names repeat")
    return clusters


@dataclass
class Fleet(EdgeMixin):
    workdir: Path
    clusters: list[Cluster]
    scrape_interval: str = "5s"
    eval_interval: str = "15s"
    max_for: str | None = "30s"          # None: the rules' own `for:` and group intervals
    latency_offset: str = "5s"           # how soon a sample is visible to queries in VictoriaMetrics
    resend_delay: str = "1m"             # vmalert: alerts stay active in Alertmanager 4x this long
    edge: str = "vmagent"                # or "prometheus": the Prometheus agent pair, for comparison
    group_wait: str = "5s"
    runbook_base: str | None = None      # the rules' runbook links (None: $FLEET_RUNBOOK_BASE or the repo path)
    python: str = sys.executable
    urls: dict[str, str] = field(default_factory=dict)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    sup: Supervisor | None = None
    sink: WebhookSink | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 60.0, attempts: int = 3) -> Fleet:
        """Start everything; a free port taken by someone else before our process bound it
        (another fleet starting at the same moment) is a retry with new ports, not a failure."""
        for attempt in range(attempts):
            try:
                return self._start_once(timeout)
            except RuntimeError as exc:
                if "address already in use" not in str(exc) or attempt == attempts - 1:
                    raise
                self.urls, self.nodes = {}, []
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> Fleet:
        needed = [b for b in BINARIES if b != "prometheus" or self.edge == "prometheus"]
        missing = [b for b in needed if find_binary(b) is None]
        if missing:
            raise RuntimeError(f"missing binaries: {', '.join(BINARIES[m] for m in missing)} "
                               "(Debian: prometheus victoria-metrics prometheus-alertmanager prometheus-node-exporter openssl)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.sup = Supervisor(self.workdir)
        try:
            self.sink = WebhookSink()
            self.urls["webhook-sink"] = self.sink.url
            self._ports()
            self.ingest_ca, self._ingest_key = self_signed_tls(self.workdir / "tls")
            self._start_alertmanagers()
            # the raw store deduplicates the agent pairs' scrapes, the long-term store the two
            # vmalert replicas' rollups (each writes every evaluation)
            self._start_store("vm-raw", "15d", dedup=self.scrape_interval, relabel=True)
            self._start_store("vm-longterm", "2y", dedup=self.eval_interval, relabel=False)
            self._start_central_vmagent()
            self._start_ingest()
            for r in REPLICAS:
                self._start_vmalert(r)
            self._start_nodes()
            self._start_agents()
            for proc in list(self.sup.procs.values()):
                self.sup.wait_ready(proc, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.sup is not None:
            self.sup.stop_all()
        if self.sink is not None:
            self.sink.close()
            self.sink = None

    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ faults
    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        self.sup.kill(name, sig)

    def restart(self, name: str, timeout: float = 60.0) -> None:
        self.sup.restart(name, timeout)

    def failed(self) -> list[str]:
        return self.sup.failed()

    def process_names(self) -> list[str]:
        return list(self.sup.procs)

    # ------------------------------------------------------------------ queries
    def query(self, expr: str, store: str = "vm-raw", at: float | None = None) -> list[dict]:
        args = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        status, body = http_get(f"{self.urls[store]}/api/v1/query?" + urllib.parse.urlencode(args), timeout=10)
        if status != 200:
            raise RuntimeError(f"{store} query {expr!r}: HTTP {status}: {body[:300]!r}")
        return json.loads(body)["data"]["result"]

    def export(self, match: str, start: float, end: float, store: str = "vm-raw") -> list[dict]:
        """Raw samples of every series matching ``match`` between start and end (unix seconds)."""
        args = {"match[]": match, "start": f"{start:.3f}", "end": f"{end:.3f}"}
        status, body = http_get(f"{self.urls[store]}/api/v1/export?" + urllib.parse.urlencode(args), timeout=60)
        if status != 200:
            raise RuntimeError(f"{store} export {match!r}: HTTP {status}: {body[:300]!r}")
        return [json.loads(line) for line in body.splitlines() if line.strip()]

    def alertmanager_alerts(self, peer: str = "alertmanager-0") -> list[dict]:
        try:
            status, body = http_get(f"{self.urls[peer]}/api/v2/alerts?active=true")
        except OSError:
            return []
        return json.loads(body) if status == 200 else []

    def notifications(self) -> dict[str, set[str]]:
        return self.sink.firing()

    def logs(self, name: str, tail: int = 4000) -> str:
        return self.sup.logs(name, tail)

    # ------------------------------------------------------------------ components
    def _ports(self) -> None:
        names = ["vm-raw", "vm-longterm", "vmagent-central", "ingest", *[f"vmalert-{r}" for r in REPLICAS]]
        for r in REPLICAS:
            names += [f"alertmanager-{r}", f"alertmanager-{r}-cluster"]
        for c in self.clusters:
            names += [f"agent-{c.name}-{r}" for r in REPLICAS]
        self.ports = {n: free_port() for n in names}
        for n, p in self.ports.items():
            if not n.endswith("-cluster"):
                self.urls[n] = f"{'https' if n == 'ingest' else 'http'}://127.0.0.1:{p}"

    def _spawn(self, name: str, cmd: list[str], ready_url: str | None, cwd: Path | None = None) -> None:
        self.sup.spawn(name, [str(c) for c in cmd], ready_url, cwd)

    def _start_alertmanagers(self) -> None:
        text = (REPO / "deploy" / "alertmanager" / "alertmanager.yml").read_text()
        conf = self.workdir / "alertmanager.yml"
        conf.write_text(text.replace(RECEIVER_PREFIX, self.urls["webhook-sink"] + "/")
                            .replace("group_wait: 30s", f"group_wait: {self.group_wait}"))
        for r in REPLICAS:
            name = f"alertmanager-{r}"
            peers = [f"--cluster.peer=127.0.0.1:{self.ports[f'alertmanager-{o}-cluster']}" for o in REPLICAS if o != r]
            self._spawn(name, [
                find_binary("alertmanager"), f"--config.file={conf}", f"--storage.path={self.workdir / (name + '-data')}",
                f"--web.listen-address=127.0.0.1:{self.ports[name]}",
                f"--cluster.listen-address=127.0.0.1:{self.ports[name + '-cluster']}", *peers,
                "--cluster.reconnect-timeout=5m", f"--web.external-url={self.urls[name]}", "--log.level=warn"],
                f"{self.urls[name]}/-/ready")

    def _start_store(self, name: str, retention: str, dedup: str, relabel: bool) -> None:
        extra = [f"-dedup.minScrapeInterval={dedup}"]
        extra += [f"-relabelConfig={HERE / 'victoria-metrics-relabel.yml'}"] if relabel else []
        self._spawn(name, [
            find_binary("victoria-metrics"), f"-httpListenAddr=127.0.0.1:{self.ports[name]}",
            f"-storageDataPath={self.workdir / (name + '-data')}", f"-retentionPeriod={retention}",
            f"-search.latencyOffset={self.latency_offset}", *extra, "-loggerLevel=WARN"],
            f"{self.urls[name]}/health")

    def _start_central_vmagent(self) -> None:
        """Receives vmalert's recorded series and alert state, scrapes the central components (job
        fleet-central) and writes to both stores; the long-term store gets rollups only."""
        targets = [u.removeprefix("http://") for n, u in self.urls.items()
                   if n.startswith(("vm-", "vmalert-", "alertmanager-")) or n == "vmagent-central"]
        conf = {"global": {"scrape_interval": self.scrape_interval, "scrape_timeout": self.scrape_interval},
                "scrape_configs": [{"job_name": "fleet-central", "static_configs": [{"targets": sorted(targets)}]},
                                   {"job_name": "fleet-central-ingest", "scheme": "https",
                                    "tls_config": {"ca_file": str(self.workdir / "tls" / "ingest.crt")},
                                    "metrics_path": "/metrics",
                                    "static_configs": [{"targets": [self.urls["ingest"].removeprefix("https://")]}]}]}
        # vmauth answers /metrics itself; scraping it over its TLS listener proves the certificate
        conf["scrape_configs"][1]["relabel_configs"] = [{"target_label": "job", "replacement": "fleet-central"}]
        path = self.workdir / "vmagent-central.yml"
        path.write_text(yaml.safe_dump(conf, sort_keys=False))
        self._spawn("vmagent-central", [
            find_binary("vmagent"), f"-httpListenAddr=127.0.0.1:{self.ports['vmagent-central']}",
            f"-promscrape.config={path}", f"-remoteWrite.tmpDataPath={self.workdir / 'vmagent-central-data'}",
            f"-remoteWrite.url={self.urls['vm-raw']}/api/v1/write",
            f"-remoteWrite.url={self.urls['vm-longterm']}/api/v1/write",
            # one value per -remoteWrite.url, in order: nothing dropped for the raw store
            f"-remoteWrite.urlRelabelConfig=,{HERE / 'vmagent-longterm-relabel.yml'}",
            "-remoteWrite.flushInterval=1s", "-loggerLevel=WARN"],
            f"{self.urls['vmagent-central']}/health")

    def _start_ingest(self) -> None:
        """vmauth over TLS: one random bearer token per cluster; each token writes into its own
        cluster only (extra_label overrides the series' `cluster`)."""
        cert, key = self.ingest_ca, self._ingest_key
        self.tokens = {c.name: secrets.token_urlsafe(24) for c in self.clusters}
        users = [{"bearer_token": tok, "url_prefix": f"{self.urls['vm-raw']}/?extra_label=cluster={name}"}
                 for name, tok in self.tokens.items()]
        conf = write_secret(self.workdir / "secrets" / "vmauth.yml", yaml.safe_dump({"users": users}))
        for name, tok in self.tokens.items():
            write_secret(self.workdir / "secrets" / f"{name}.token", tok)
        self._spawn("ingest", [
            find_binary("vmauth"), f"-httpListenAddr=127.0.0.1:{self.ports['ingest']}", f"-auth.config={conf}",
            "-tls", f"-tlsCertFile={cert}", f"-tlsKeyFile={key}", "-loggerLevel=WARN"], None)

    def _start_vmalert(self, replica: str) -> None:
        rules = prepare_rules(self.workdir / "rules", self.max_for, self.runbook_base)
        name = f"vmalert-{replica}"
        self._spawn(name, [
            find_binary("vmalert"), f"-httpListenAddr=127.0.0.1:{self.ports[name]}",
            *[f"-rule={p}" for p in rules],
            f"-datasource.url={self.urls['vm-raw']}",
            f"-remoteWrite.url={self.urls['vmagent-central']}",
            f"-remoteRead.url={self.urls['vm-raw']}",
            *[f"-notifier.url={self.urls[f'alertmanager-{r}']}" for r in REPLICAS],
            f"-evaluationInterval={self.eval_interval}", f"-rule.resendDelay={self.resend_delay}",
            f"-external.url={self.urls[name]}", "-loggerLevel=WARN"],
            f"{self.urls[name]}/health")

    # ------------------------------------------------------------------ what to print
    def summary(self) -> str:
        lines = ["", "unified-gpu-exporter reference fleet is running (Ctrl-C stops all of it):", ""]
        for cluster in self.clusters:
            state = "DEGRADED" if "degraded" in cluster.scenario else "healthy"
            agents = ", ".join(f"agent-{cluster.name}-{r} {self.urls[f'agent-{cluster.name}-{r}']}" for r in REPLICAS)
            lines.append(f"  cluster {cluster.name:<18} cloud={cluster.cloud:<6} region={cluster.region:<12} "
                         f"{cluster.nodes} node(s), {state}; {agents}")
            for n in self.nodes:
                if n["cluster"] == cluster.name:
                    lines.append(f"      {n['node']:<28} {n['url']}/metrics")
        rules = "for: capped at " + self.max_for if self.max_for else "the rules' own for: durations"
        lines += [
            "",
            f"  central ingest       {self.urls['ingest']}   (vmauth, TLS, a bearer token per cluster)",
            f"  central raw store    {self.urls['vm-raw']}/vmui   (per-GPU series, 15 days, pairs deduplicated)",
            f"  long-term store      {self.urls['vm-longterm']}/vmui   (rollups only, 2 years)",
            *[f"  rule engine {r}        {self.urls[f'vmalert-{r}']}/vmalert/groups   (every {self.eval_interval}, {rules})"
              for r in REPLICAS],
            *[f"  Alertmanager {r}       {self.urls[f'alertmanager-{r}']}/#/alerts" for r in REPLICAS],
            f"  Grafana: add a Prometheus data source at {self.urls['vm-raw']} and import deploy/grafana/*.json",
            "",
            f"  Rehearse a failure:  {sys.argv[0]} --workdir {self.workdir} --kill <name> [--down 60]",
            f"    names: {', '.join(self.process_names())}",
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
    p.add_argument("--edge", choices=["vmagent", "prometheus"], default="vmagent")
    p.add_argument("--real-timing", action="store_true",
                   help="keep the rules' for: durations and group intervals (alerts take 15+ minutes)")
    p.add_argument("--runbook-base", metavar="URL",
                   help="the alerts' runbook links: URL of runbooks.md (default: $FLEET_RUNBOOK_BASE, else "
                        "the repository path deploy/prometheus/runbooks.md)")
    p.add_argument("--kill", metavar="NAME", help="ask the fleet running in --workdir to SIGKILL one process")
    p.add_argument("--down", type=float, metavar="SECONDS", help="with --kill: restart it after this long")
    p.add_argument("--restart", metavar="NAME", help="ask the fleet running in --workdir to restart one process")
    args = p.parse_args(argv)
    if args.kill or args.restart:
        if args.workdir is None or not (args.workdir / "fleet-state.json").is_file():
            p.error("--kill/--restart need the --workdir of a running fleet")
        names = json.loads((args.workdir / "fleet-state.json").read_text())
        name = args.kill or args.restart
        if name not in names:
            p.error(f"no process {name!r} in that fleet; known: {', '.join(names)}")
        Supervisor(args.workdir).request("kill" if args.kill else "restart", name, args.down)
        print(f"asked the fleet in {args.workdir} to {'kill' if args.kill else 'restart'} {name}")
        return 0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="ugpu-fleet-"))
    fleet = Fleet(workdir, load_topology(args.topology), scrape_interval=args.scrape_interval,
                  eval_interval=args.eval_interval, max_for=None if args.real_timing else "30s", edge=args.edge,
                  runbook_base=args.runbook_base)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        print(f"starting the fleet in {workdir} ...", flush=True)
        fleet.start()
        print(fleet.summary(), flush=True)
        reported: set[str] = set()
        while not stop.wait(1):
            for line in fleet.sup.handle_requests():
                print(f"fleet: {line}", flush=True)
            dead = set(fleet.failed())
            for name in sorted(dead - reported):
                print(f"fleet: {name} stopped unexpectedly (log: {workdir}/logs/{name}.log); the rest keeps "
                      f"running; restart it with --restart {name}", file=sys.stderr, flush=True)
            reported = dead
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
