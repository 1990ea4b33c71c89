"""deploy/kubernetes validated offline: kubernetes-validate (PyPI) JSON schemas for core kinds,
structural checks for the prometheus-operator CRDs, plus the project's own policy checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
KDIR = REPO / "deploy" / "kubernetes"
K8S_VERSIONS = ("1.28.0", "1.33.0")  # oldest with pod-resources GA, and a recent one
CRD_KINDS = {"ServiceMonitor", "PodMonitor"}


def docs() -> dict[str, dict]:
    out: dict[str, dict] = {}
    for path in sorted(KDIR.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out[doc["kind"]] = doc
    return out


DOCS = docs()
DS = DOCS["DaemonSet"]
POD = DS["spec"]["template"]["spec"]
CONTAINER = POD["containers"][0]


def test_all_expected_kinds_present():
    assert set(DOCS) == {"Namespace", "ServiceAccount", "PriorityClass", "DaemonSet", "Service",
                         "ServiceMonitor", "PodMonitor", "NetworkPolicy", "Kustomization"}


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_core_kinds_valid_against_strict_schemas(version):
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
    checked = 0
    for kind, doc in DOCS.items():
        if kind in CRD_KINDS or kind == "Kustomization":
            continue
        kv.validate(doc, version, strict=True)  # raises ValidationError with the path
        checked += 1
    assert checked == 6


def test_schema_check_catches_a_typo():
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
    import copy
    bad = copy.deepcopy(DS)
    bad["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, K8S_VERSIONS[-1], strict=True)


def test_monitors_structure():
    sm, pm = DOCS["ServiceMonitor"], DOCS["PodMonitor"]
    for m in (sm, pm):
        assert m["apiVersion"] == "monitoring.coreos.com/v1"
        assert m["metadata"]["namespace"] == DS["metadata"]["namespace"]
        assert m["spec"]["selector"]["matchLabels"] == DS["spec"]["selector"]["matchLabels"]
    (ep,) = sm["spec"]["endpoints"]
    (pep,) = pm["spec"]["podMetricsEndpoints"]
    for e in (ep, pep):
        assert e["port"] == "metrics" and e["path"] == "/metrics"
        assert int(e["scrapeTimeout"].rstrip("s")) < int(e["interval"].rstrip("s"))
        assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in e["relabelings"]
    # the Service the ServiceMonitor selects exposes the named port
    svc = DOCS["Service"]
    assert svc["metadata"]["labels"] == sm["spec"]["selector"]["matchLabels"]
    assert [p["name"] for p in svc["spec"]["ports"]] == ["metrics"]
    assert svc["spec"]["ports"][0]["port"] == 9632


def test_selectors_and_ports_line_up():
    labels = DS["spec"]["template"]["metadata"]["labels"]
    for sel in (DS["spec"]["selector"]["matchLabels"], DOCS["Service"]["spec"]["selector"],
                DOCS["NetworkPolicy"]["spec"]["podSelector"]["matchLabels"]):
        assert all(labels.get(k) == v for k, v in sel.items())
    assert CONTAINER["ports"] == [{"name": "metrics", "containerPort": 9632, "protocol": "TCP"}]
    assert {"--web.listen-address=:9632"} <= set(CONTAINER["args"])
    assert POD["priorityClassName"] == DOCS["PriorityClass"]["metadata"]["name"]
    assert POD["serviceAccountName"] == DOCS["ServiceAccount"]["metadata"]["name"]


def test_node_affinity_covers_three_vendors():
    terms = POD["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = {e["key"] for t in terms for e in t["matchExpressions"]}
    assert "nvidia.com/gpu.present" in keys
    assert "feature.node.kubernetes.io/pci-10de.present" in keys
    assert "feature.node.kubernetes.io/amd-gpu" in keys
    assert "intel.feature.node.kubernetes.io/gpu" in keys
    # one expression per term: terms are ORed, expressions inside a term are ANDed
    assert all(len(t["matchExpressions"]) == 1 for t in terms)
    tol = {t["key"] for t in POD["tolerations"]}
    assert {"nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "gpu.intel.com/xe"} <= tol


def test_host_paths_and_minimal_security_context():
    vols = {v["name"]: v for v in POD["volumes"]}
    paths = {v["hostPath"]["path"] for v in vols.values() if "hostPath" in v}
    assert {"/sys", "/dev", "/var/lib/kubelet/pod-resources", "/var/lib/unified-gpu-exporter"} <= paths
    mounts = {m["name"]: m for m in CONTAINER["volumeMounts"]}
    for name in ("sys", "dev", "pod-resources"):
        assert mounts[name]["readOnly"] is True
    # the directory is mounted, not kubelet.sock itself (kubelet restarts replace the socket)
    assert mounts["pod-resources"]["mountPath"] == "/var/lib/kubelet/pod-resources"
    sc = CONTAINER["securityContext"]
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert POD["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert POD["automountServiceAccountToken"] is False
    assert "hostNetwork" not in POD and "hostPID" not in POD


def test_network_policy_limits_ingress_and_egress():
    np = DOCS["NetworkPolicy"]["spec"]
    assert set(np["policyTypes"]) == {"Ingress", "Egress"}
    (ing,) = np["ingress"]
    assert ing["ports"] == [{"port": 9632, "protocol": "TCP"}]
    assert ing["from"], "ingress must name its sources"
    (eg,) = np["egress"]
    assert eg["to"] == [{"ipBlock": {"cidr": "169.254.169.254/32"}}]


def test_kustomization_lists_existing_files_once_and_one_monitor():
    res = DOCS["Kustomization"]["resources"]
    assert len(res) == len(set(res))
    assert all((KDIR / r).is_file() for r in res)
    assert ("servicemonitor.yaml" in res) != ("podmonitor.yaml" in res)
