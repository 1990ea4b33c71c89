"""The edge of the reference fleet (deploy/fleet/fleet.py): the simulated GPU nodes of each cluster
and the cluster's two agents (vmagent with its disk-backed queue, or the Prometheus agent pair for
comparison), writing over TLS with the cluster's token to the central ingest."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml
from fleet_util import HERE, REPO, free_port

BINARIES = {
    "prometheus": "prometheus", "victoria-metrics": "victoria-metrics", "vmagent": "vmagent",
    "vmalert": "vmalert", "vmauth": "vmauth", "alertmanager": "prometheus-alertmanager", "openssl": "openssl",
    "node-exporter": "prometheus-node-exporter",
}
REPLICAS = ("0", "1")


@dataclass
class Cluster:
    name: str
    cloud: str
    region: str
    nodes: int
    scenario: str
    workload: str = "llm-train"
    profile: str = "default"             # the exporters' exposition profile (README "Series budget")


def find_binary(name: str) -> str | None:
    return shutil.which(BINARIES.get(name, name))


class EdgeMixin:
    """Fleet's nodes and agents; needs the Fleet's clusters, urls, ports, nodes, workdir,
    scrape_interval, edge, python, ingest_ca and _spawn."""

    def _start_nodes(self) -> None:
        # the host's node_exporter, the liveness of every simulated node (they all run on this
        # host): GPUExporterAbsent needs a node that is alive without its exporter target.  No
        # collectors: the agents keep only the scrape's own `up`.
        port = free_port()
        self.urls["node-exporter"] = f"http://127.0.0.1:{port}"
        self._spawn("node-exporter", [
            find_binary("node-exporter"), "--collector.disable-defaults", "--web.disable-exporter-metrics",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"], f"{self.urls['node-exporter']}/metrics")
        template = yaml.safe_load((HERE / "exporter-node.yml").read_text())
        for cluster in self.clusters:
            scenario = REPO / "mappings" / "scenarios" / f"{cluster.scenario}.yaml"
            for i in range(cluster.nodes):
                node = f"{cluster.name}-node-{i + 1}"
                port = free_port()
                conf = dict(template)
                conf["labels"] = {"cluster": cluster.name, "cloud": cluster.cloud, "region": cluster.region,
                                  "workload": cluster.workload}
                if cluster.profile != "default":
                    conf["exposition"] = {"profile": cluster.profile}
                path = self.workdir / "nodes" / f"{node}.yml"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(yaml.safe_dump(conf, sort_keys=False))
                url = f"http://127.0.0.1:{port}"
                self.nodes.append({"cluster": cluster.name, "node": node, "url": url, "port": port})
                self.urls[node] = url
                self._spawn(node, [
                    self.python, "-m", "exporter", "--simulate", str(scenario), f"--config.file={path}",
                    f"--web.listen-address=127.0.0.1:{port}", f"--state.dir={self.workdir / 'nodes' / node}",
                    "--log.level=warn"], f"{url}/metrics", cwd=REPO)

    def _start_agents(self) -> None:
        for cluster in self.clusters:
            cdir = self.workdir / "agents" / cluster.name
            (cdir / "targets").mkdir(parents=True, exist_ok=True)
            targets = [{"targets": [n["url"].removeprefix("http://")], "labels": {"node": n["node"]}}
                       for n in self.nodes if n["cluster"] == cluster.name]
            (cdir / "targets" / "nodes.json").write_text(json.dumps(targets))
            host = self.urls["node-exporter"].removeprefix("http://")
            (cdir / "node-exporter").mkdir(exist_ok=True)
            (cdir / "node-exporter" / "nodes.json").write_text(json.dumps(
                [{"targets": [host], "labels": {"node": n["node"]}} for n in self.nodes if n["cluster"] == cluster.name]))
            peers = [self.urls[f"agent-{cluster.name}-{r}"].removeprefix("http://") for r in REPLICAS]
            for r in REPLICAS:
                name = f"agent-{cluster.name}-{r}"
                tenant = {"cluster": cluster.name, "cloud": cluster.cloud, "region": cluster.region, "replica": r}
                if self.edge == "prometheus":
                    self._start_prometheus_agent(name, cluster, cdir, peers, tenant)
                else:
                    self._start_vmagent_edge(name, cluster, cdir, peers, tenant)

    def _edge_scrape_config(self, template: str, peers: list[str]) -> dict:
        conf = yaml.safe_load((HERE / template).read_text())
        conf["global"]["scrape_interval"] = self.scrape_interval
        conf["global"]["scrape_timeout"] = self.scrape_interval
        for job in conf["scrape_configs"]:
            if job["job_name"] == "fleet-agent":
                job["static_configs"] = [{"targets": peers}]
        return conf

    def _start_vmagent_edge(self, name: str, cluster: Cluster, cdir: Path, peers: list[str],
                            tenant: dict[str, str]) -> None:
        conf = self._edge_scrape_config("vmagent-edge.yml", peers)
        (cdir / f"{name}.yml").write_text(yaml.safe_dump(conf, sort_keys=False))
        relabel = [{"target_label": k, "replacement": v} for k, v in tenant.items()]
        (cdir / f"{name}-relabel.yml").write_text(yaml.safe_dump(relabel, sort_keys=False))
        self._spawn(name, [
            find_binary("vmagent"), f"-httpListenAddr=127.0.0.1:{self.ports[name]}",
            f"-promscrape.config={cdir / (name + '.yml')}", f"-remoteWrite.tmpDataPath={cdir / (name + '-queue')}",
            f"-remoteWrite.url={self.urls['ingest']}/api/v1/write",
            f"-remoteWrite.bearerTokenFile={self.workdir / 'secrets' / (cluster.name + '.token')}",
            f"-remoteWrite.tlsCAFile={self.ingest_ca}",
            f"-remoteWrite.relabelConfig={cdir / (name + '-relabel.yml')}",
            "-remoteWrite.maxDiskUsagePerURL=1GB", "-remoteWrite.flushInterval=1s",
            f"-promscrape.fileSDCheckInterval={self.scrape_interval}", "-loggerLevel=WARN"],
            f"{self.urls[name]}/health", cwd=cdir)

    def _start_prometheus_agent(self, name: str, cluster: Cluster, cdir: Path, peers: list[str],
                                tenant: dict[str, str]) -> None:
        conf = self._edge_scrape_config("prometheus-agent.yml", peers)
        conf["global"]["external_labels"] = {"replica": tenant["replica"]}
        rw = conf["remote_write"][0]
        rw["url"] = f"{self.urls['ingest']}/api/v1/write"
        rw["authorization"] = {"credentials_file": str(self.workdir / "secrets" / f"{cluster.name}.token")}
        rw["tls_config"] = {"ca_file": str(self.ingest_ca)}
        rw["write_relabel_configs"] = [r for r in rw["write_relabel_configs"] if r.get("action") == "keep"] + \
            [{"target_label": k, "replacement": v} for k, v in tenant.items() if k != "replica"]
        rw["queue_config"]["batch_send_deadline"] = "1s"
        (cdir / f"{name}.yml").write_text(yaml.safe_dump(conf, sort_keys=False))
        self._spawn(name, [
            find_binary("prometheus"), "--enable-feature=agent", f"--config.file={cdir / (name + '.yml')}",
            f"--storage.agent.path={cdir / (name + '-data')}", f"--web.listen-address=127.0.0.1:{self.ports[name]}",
            "--log.level=warn"], f"{self.urls[name]}/-/ready", cwd=cdir)

