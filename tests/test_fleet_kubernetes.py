"""deploy/fleet/kubernetes (the per-cluster agents and the central stack) rendered with Debian's
``kubectl kustomize``, validated offline with kubernetes-validate, and checked for what the fleet
promises: two agents with their own queue volumes on different nodes, the tenant labels and the
write path's TLS and token, deduplication at the agents' scrape interval, two vmalert replicas
with state restore and a resend delay that outlives a store outage, two clustered Alertmanager
peers, and the configuration the binaries themselves accept."""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

from tests.conftest import REPO, require_binary
from tests.test_fleet import absence_liveness, load_fleet_module
from tests.test_kubernetes_manifests import K8S_VERSIONS, kv

KDIR = REPO / "deploy" / "fleet" / "kubernetes"
FLEET = REPO / "deploy" / "fleet"


def render(target: str) -> list[dict]:
    kubectl = require_binary("kubectl", "kubectl")
    out = subprocess.run([kubectl, "kustomize", str(KDIR / target)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"kubectl kustomize {target}: {out.stderr}"
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def workload(docs: list[dict], name: str) -> dict:
    (doc,) = [d for d in docs if d["kind"] in ("StatefulSet", "Deployment") and d["metadata"]["name"] == name]
    return doc


def args(doc: dict) -> list[str]:
    return doc["spec"]["template"]["spec"]["containers"][0]["args"]


def flag(doc: dict, name: str) -> list[str]:
    return [a.split("=", 1)[1] for a in args(doc) if a.startswith(name + "=")]


def configmap(docs: list[dict], prefix: str) -> dict:
    (doc,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith(prefix)]
    return doc["data"]


@pytest.mark.parametrize("target", ["agent", "central"])
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_renders_and_validates(target, version):
    validator = kv()
    docs = render(target)
    for doc in docs:
        validator.validate(doc, version, strict=True)
    names = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(names) == len(set(names))
    for doc in docs:
        if doc["kind"] in ("StatefulSet", "Deployment"):
            pod = doc["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True, doc["metadata"]["name"]
            ctx = pod["containers"][0]["securityContext"]
            assert ctx["readOnlyRootFilesystem"] and ctx["allowPrivilegeEscalation"] is False
            assert ":" in pod["containers"][0]["image"] and not pod["containers"][0]["image"].endswith(":latest")


def test_agent_pair_keeps_its_queue_and_writes_with_tls_a_token_and_the_tenant_labels():
    docs = render("agent")
    sts = workload(docs, "gpu-fleet-agent")
    assert sts["kind"] == "StatefulSet" and sts["spec"]["replicas"] == 2
    assert [c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]] == ["queue"]
    mounts = {m["name"]: m["mountPath"] for m in sts["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert flag(sts, "-remoteWrite.tmpDataPath") == [mounts["queue"]]
    anti = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["topologyKey"] == "kubernetes.io/hostname"
    assert flag(sts, "-remoteWrite.url") == ["$(FLEET_INGEST_URL)"]
    cluster = configmap(docs, "gpu-fleet-cluster")
    assert cluster["FLEET_INGEST_URL"].startswith("https://")
    assert flag(sts, "-remoteWrite.bearerTokenFile")[0].startswith(mounts["ingest"])
    assert flag(sts, "-remoteWrite.tlsCAFile")[0].startswith(mounts["ingest"])
    config = configmap(docs, "gpu-fleet-agent-config")
    relabel = yaml.safe_load(config["vmagent-edge-relabel.yml"])
    assert {r["target_label"]: r["replacement"] for r in relabel} == {
        "cluster": "%{FLEET_CLUSTER}", "cloud": "%{FLEET_CLOUD}", "region": "%{FLEET_REGION}", "replica": "%{POD_NAME}"}
    scrape = yaml.safe_load(config["vmagent-edge.yml"])
    peers = next(j for j in scrape["scrape_configs"] if j["job_name"] == "fleet-agent")["static_configs"][0]["targets"]
    assert peers == [f"gpu-fleet-agent-{i}.gpu-fleet-agent.gpu-monitoring.svc:8429" for i in (0, 1)]
    # the demo's edge config and this one keep the same agent metrics (the pipeline alerts need them)
    demo = yaml.safe_load((FLEET / "vmagent-edge.yml").read_text())

    def kept(doc):
        return [j["metric_relabel_configs"] for j in doc["scrape_configs"] if j["job_name"] == "fleet-agent"]
    assert kept(scrape) == kept(demo)
    # GPUExporterAbsent's liveness signal: kube_node_info from kube-state-metrics, nothing else of it
    _alive, absence_expr = absence_liveness()
    assert "kube_node_info" in absence_expr
    ksm = next(j for j in scrape["scrape_configs"] if j["job_name"] == "kube-state-metrics")
    assert ksm["static_configs"] == [{"targets": ["%{FLEET_KUBE_STATE_METRICS}"]}]
    assert ksm["metric_relabel_configs"] == [{"source_labels": ["__name__"], "regex": "kube_node_info", "action": "keep"}]
    assert cluster["FLEET_KUBE_STATE_METRICS"].endswith(":8080")
    assert any(d["kind"] == "PodDisruptionBudget" and d["spec"]["minAvailable"] == 1 for d in docs)


def test_central_dedup_matches_the_agents_scrape_interval_and_alerting_is_ha():
    docs = render("central")
    agent_scrape = yaml.safe_load(configmap(render("agent"), "gpu-fleet-agent-config")["vmagent-edge.yml"])
    raw = workload(docs, "victoria-metrics")
    assert flag(raw, "-dedup.minScrapeInterval") == [agent_scrape["global"]["scrape_interval"]]
    assert flag(raw, "-relabelConfig") == ["/etc/fleet/victoria-metrics-relabel.yml"]
    vmalert = workload(docs, "vmalert")
    assert vmalert["spec"]["replicas"] == 2
    # both replicas write every rollup: the long-term store keeps one sample per evaluation
    assert flag(workload(docs, "victoria-metrics-longterm"), "-dedup.minScrapeInterval") == flag(
        vmalert, "-evaluationInterval")
    assert flag(vmalert, "-remoteRead.url") == flag(vmalert, "-datasource.url")
    assert len(flag(vmalert, "-notifier.url")) == 2
    # alerts stay active 4 x max(resend delay, evaluation interval) after the last send: longer
    # than a 60 s store outage with room to spare
    resend = flag(vmalert, "-rule.resendDelay")[0]
    assert resend.endswith("m") and 4 * int(resend[:-1]) * 60 >= 180
    am = workload(docs, "alertmanager")
    assert am["spec"]["replicas"] == 2 and len(flag(am, "--cluster.peer")) == 2
    auth = workload(docs, "vmauth")
    assert auth["spec"]["replicas"] == 2 and "-tls" in args(auth)
    central = workload(docs, "vmagent-central")
    assert flag(central, "-remoteWrite.urlRelabelConfig") == [",/etc/fleet/vmagent-longterm-relabel.yml"]


def test_generated_central_config_holds_every_rule_file_and_the_alertmanager_config():
    docs = render("central")
    rules = configmap(docs, "gpu-fleet-rules")
    expected = sorted(p.name for p in [*(REPO / "deploy" / "prometheus" / "rules").glob("*.yml"),
                                       *(FLEET / "rules").glob("*.yml")])
    assert sorted(rules) == expected
    fleet = load_fleet_module()
    for name, text in rules.items():
        src = FLEET / "rules" / name
        src = src if src.exists() else REPO / "deploy" / "prometheus" / "rules" / name
        # the source with its runbook links rendered under the default base (no $externalLabels:
        # vmalert would label every series it writes with an external label)
        assert text == fleet.link_runbooks(src.read_text(), fleet.RUNBOOK_DEFAULT), name
        assert "$externalLabels" not in text, name
    am = configmap(docs, "gpu-fleet-alertmanager")["alertmanager.yml"]
    assert am == (REPO / "deploy" / "alertmanager" / "alertmanager.yml").read_text()


def test_the_binaries_accept_the_kubernetes_configs(tmp_path):
    """vmagent parses the edge and central scrape configs (strict dry run), amtool the Alertmanager one."""
    vmagent = require_binary("vmagent", "victoria-metrics")
    amtool = require_binary("amtool", "prometheus-alertmanager")
    require_binary("openssl", "openssl")
    cert, _key = load_fleet_module().self_signed_tls(tmp_path / "tls")
    agent_docs = render("agent")
    agent = configmap(agent_docs, "gpu-fleet-agent-config")
    # the edge config reads the cluster's ConfigMap from the environment (%{FLEET_...})
    env = {**os.environ, **configmap(agent_docs, "gpu-fleet-cluster")}
    central = render("central")
    files = {"edge.yml": agent["vmagent-edge.yml"], "central.yml": configmap(central, "gpu-fleet-vmagent-central")[
        "vmagent-central.yml"].replace("/etc/ingest-tls/tls.crt", str(cert))}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        out = subprocess.run([vmagent, f"-promscrape.config={tmp_path / name}", "-promscrape.config.dryRun",
                              "-promscrape.config.strictParse"], capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 0, (name, out.stdout + out.stderr)
    (tmp_path / "am.yml").write_text(configmap(central, "gpu-fleet-alertmanager")["alertmanager.yml"])
    out = subprocess.run([amtool, "check-config", str(tmp_path / "am.yml")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
