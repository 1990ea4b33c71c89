"""deploy/kubernetes rendered with Debian's ``kubectl kustomize`` (base, the top-level default and
every overlay), validated offline with kubernetes-validate (strict JSON schemas for core kinds),
structural checks for the prometheus-operator CRDs, the project's own policy checks, and the
generated PrometheusRule / dashboard ConfigMaps checked against their sources."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
KDIR = REPO / "deploy" / "kubernetes"
K8S_VERSIONS = ("1.28.0", "1.33.0")  # oldest with pod-resources GA, and a recent one
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
OVERLAYS = sorted(p.parent.name for p in (KDIR / "overlays").glob("*/kustomization.yaml"))
TARGETS = [".", "base", *(f"overlays/{o}" for o in OVERLAYS)]
COMPONENTS = sorted(p.parent.name for p in (KDIR / "components").glob("*/kustomization.yaml"))
CI = os.environ.get("CI") == "true"


def _need(thing: str, ok: bool, how: str) -> None:
    if ok:
        return
    if CI:
        pytest.fail(f"{thing} missing under CI=true ({how})")
    pytest.skip(f"{thing} not installed ({how})")


@cache
def render(target: str) -> tuple[dict, ...]:
    kubectl = shutil.which("kubectl")
    _need("kubectl", kubectl is not None, "Debian package kubectl")
    out = subprocess.run([kubectl, "kustomize", str(KDIR / target)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, f"kubectl kustomize {target}: {out.stderr}"
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def by_kind(docs, kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs, kind: str) -> dict:
    found = by_kind(docs, kind)
    if len(found) > 1:  # the exporter's (components/node-problem-detector adds a DaemonSet and a Service)
        found = [d for d in found if d["metadata"]["name"] == "unified-gpu-exporter"]
    (d,) = found
    return d


def pod_spec(docs) -> dict:
    return one(docs, "DaemonSet")["spec"]["template"]["spec"]


def exporter(docs) -> dict:
    return pod_spec(docs)["containers"][0]


def kv():
    _need("kubernetes-validate", importlib.util.find_spec("kubernetes_validate") is not None,
          "pip install kubernetes-validate (test extra)")
    import kubernetes_validate
    return kubernetes_validate


# ---------------------------------------------------------------- every target renders + validates
def test_layout_every_overlay_and_component_is_used():
    assert {"nvidia", "amd", "intel", "per-process", "kube-prometheus-stack", "tls"} <= set(OVERLAYS)
    used = set()
    for path in [KDIR / "kustomization.yaml", *(KDIR / "overlays").glob("*/kustomization.yaml")]:
        used |= {Path(c).name for c in yaml.safe_load(path.read_text()).get("components", [])}
    # persistent-state is opt-in everywhere (a root init container): the privileges table renders it
    assert set(COMPONENTS) - {"persistent-state"} <= used, f"components no overlay composes: {set(COMPONENTS) - used}"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_target_renders_and_core_kinds_validate(target, version):
    validator = kv()
    docs = render(target)
    checked = 0
    for doc in docs:
        if doc["kind"] in CRD_KINDS:
            continue
        validator.validate(doc, version, strict=True)  # raises ValidationError naming the path
        checked += 1
    assert checked >= 7
    names = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]
    assert len(names) == len(set(names)), "duplicate objects"


def test_schema_check_catches_a_typo():
    validator = kv()
    bad = copy.deepcopy(one(render("base"), "DaemonSet"))
    bad["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}
    with pytest.raises(validator.ValidationError):
        validator.validate(bad, K8S_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("target", TARGETS)
def test_common_wiring(target):
    """ConfigMap as --config.file, hostPath --state.dir, HTTP probes, selectors and ports line up."""
    docs = render(target)
    ds, c, pod = one(docs, "DaemonSet"), exporter(docs), pod_spec(docs)
    args = c["args"]
    assert "--web.listen-address=:9632" in args
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    # configuration: the generated (hash-suffixed) ConfigMap is mounted where --config.file points
    (cfg_arg,) = [a for a in args if a.startswith("--config.file=")]
    cfg_path = Path(cfg_arg.split("=", 1)[1])
    (cfg_mount,) = [m for m in c["volumeMounts"] if Path(m["mountPath"]) == cfg_path.parent]
    cm_name = vols[cfg_mount["name"]]["configMap"]["name"]
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] == cm_name]
    assert cm_name.startswith("unified-gpu-exporter-config-")  # hash suffix: edits roll the pods
    config = yaml.safe_load(cm["data"][cfg_path.name])
    assert isinstance(config, dict) and "collectors" in config
    # no shipped target persists baselines (components/persistent-state, opt-in, does): the image's
    # default --state.dir ($STATE_DIRECTORY) is switched off, nothing writable is mounted
    assert not [a for a in args if a.startswith("--state.dir")]
    assert {"name": "STATE_DIRECTORY", "value": ""} in c["env"]
    assert "initContainers" not in pod
    assert all(m.get("readOnly") for m in c["volumeMounts"] if not m["mountPath"].startswith("/dev/"))
    # sysfs read-only, passed as --path.sysfs
    assert "--path.sysfs=/host/sys" in args and mounts["sys"]["readOnly"] is True
    # HTTP probes on /healthz and /readyz at the metrics port
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"),
                        ("startupProbe", "/healthz")):
        get = c[probe]["httpGet"]
        assert (get["path"], get["port"]) == (path, "metrics")
        assert get["scheme"] in ("HTTP", "HTTPS")
    assert c["ports"] == [{"name": "metrics", "containerPort": 9632, "protocol": "TCP"}]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    for sel in (ds["spec"]["selector"]["matchLabels"], one(docs, "Service")["spec"]["selector"],
                *(n["spec"]["podSelector"]["matchLabels"] for n in by_kind(docs, "NetworkPolicy"))):
        assert all(labels.get(k) == v for k, v in sel.items())
    assert pod["priorityClassName"] == one(docs, "PriorityClass")["metadata"]["name"]
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]
    # every pod-level hardening that no component relaxes
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"]["drop"] == ["ALL"]
    assert set(sc["capabilities"].get("add", [])) <= {"SYS_PTRACE", "DAC_READ_SEARCH"}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "hostNetwork" not in pod


def test_base_is_non_root_and_unprivileged():
    docs = render("base")
    pod, c = pod_spec(docs), exporter(docs)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532  # the image's USER
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert "add" not in sc["capabilities"]
    assert pod["automountServiceAccountToken"] is False
    assert "hostPID" not in pod
    assert not any("hostPath" in v and v["hostPath"]["path"].startswith("/dev") for v in pod["volumes"])
    assert {d["kind"] for d in docs} == {"Namespace", "ServiceAccount", "PriorityClass", "DaemonSet",
                                         "Service", "NetworkPolicy", "ConfigMap"}
    assert "--config.file=/etc/unified-gpu-exporter/config.yml" in c["args"]


def test_nvidia_uses_the_container_toolkit_without_taking_a_gpu():
    docs = render("overlays/nvidia")
    pod, c = pod_spec(docs), exporter(docs)
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert pod["runtimeClassName"] == "nvidia"
    assert "nvidia.com/gpu" not in json.dumps(c.get("resources", {}))
    assert c["securityContext"]["privileged"] is False


@pytest.mark.parametrize("vendor, nodes", [("amd", {"/dev/kfd", "/dev/dri"}), ("intel", {"/dev/dri"})])
def test_amd_intel_device_nodes_privileged_but_non_root_user(vendor, nodes):
    docs = render(f"overlays/{vendor}")
    pod, c = pod_spec(docs), exporter(docs)
    vols = {v["name"]: v for v in pod["volumes"]}
    mounted = {m["mountPath"]: vols[m["name"]]["hostPath"]["path"] for m in c["volumeMounts"]
               if "hostPath" in vols[m["name"]]}
    assert {p for p in mounted if p.startswith("/dev")} == nodes
    assert all(mounted[p] == p for p in nodes)
    assert c["securityContext"]["privileged"] is True  # device cgroup, see docs/privileges.md
    assert "add" not in c["securityContext"]["capabilities"]
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in c["env"]}


def test_per_process_variant_hostpid_and_readonly_host_proc():
    docs = render("overlays/per-process")
    pod, c = pod_spec(docs), exporter(docs)
    assert pod["hostPID"] is True
    vols = {v["name"]: v for v in pod["volumes"]}
    (proc,) = [m for m in c["volumeMounts"] if vols[m["name"]].get("hostPath", {}).get("path") == "/proc"]
    assert proc["readOnly"] is True
    assert f"--path.procfs={proc['mountPath']}" in c["args"]
    assert set(c["securityContext"]["capabilities"]["add"]) == {"SYS_PTRACE", "DAC_READ_SEARCH"}
    (cm,) = by_kind(docs, "ConfigMap")
    config = yaml.safe_load(cm["data"]["config.yml"])
    assert config["collectors"]["nvml"]["options"]["processes"] == "series"
    assert config["collectors"]["fdinfo"]["options"]["processes"] == "series"
    assert config["collectors"]["fdinfo"]["enabled"] is True
    # PodMonitor instead of ServiceMonitor, and pod labels from the API server
    assert by_kind(docs, "PodMonitor") and not by_kind(docs, "ServiceMonitor")
    assert pod["automountServiceAccountToken"] is True
    role = one(docs, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]
    binding = one(docs, "ClusterRoleBinding")
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"]


def test_pod_attribution_mounts_the_socket_directory_as_root_without_capabilities():
    docs = render("overlays/kube-prometheus-stack")
    pod, c = pod_spec(docs), exporter(docs)
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert vols["pod-resources"]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    # the directory, not kubelet.sock itself (kubelet restarts replace the socket)
    assert mounts["pod-resources"] == {"name": "pod-resources", "readOnly": True,
                                       "mountPath": "/var/lib/kubelet/pod-resources"}
    assert pod["securityContext"]["runAsUser"] == 0
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False


def test_tls_overlay_web_config_from_secret_and_https_everywhere():
    docs = render("overlays/tls")
    pod, c = pod_spec(docs), exporter(docs)
    (arg,) = [a for a in c["args"] if a.startswith("--web.config.file=")]
    path = Path(arg.split("=", 1)[1])
    vols = {v["name"]: v for v in pod["volumes"]}
    (m,) = [m for m in c["volumeMounts"] if Path(m["mountPath"]) == path.parent]
    assert vols[m["name"]]["secret"]["secretName"] == "unified-gpu-exporter-web"
    assert m["readOnly"] is True
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["scheme"] == "HTTPS"
    (ep,) = one(docs, "ServiceMonitor")["spec"]["endpoints"]
    assert ep["scheme"] == "https"
    assert ep["tlsConfig"]["ca"]["secret"]["name"] == "unified-gpu-exporter-web"


# ---------------------------------------------------------------- prometheus-operator objects
def _crd_common(doc: dict, ds: dict) -> None:
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert doc["metadata"]["namespace"] == ds["metadata"]["namespace"]
    assert doc["metadata"]["labels"]["release"]


@pytest.mark.parametrize("target", TARGETS)
def test_monitors_structure(target):
    docs = render(target)
    ds = one(docs, "DaemonSet")
    sms, pms = by_kind(docs, "ServiceMonitor"), by_kind(docs, "PodMonitor")
    assert len(sms) + len(pms) <= 1, "a ServiceMonitor and a PodMonitor would scrape every pod twice"
    for m in (*sms, *pms):
        _crd_common(m, ds)
        assert m["spec"]["selector"]["matchLabels"] == ds["spec"]["selector"]["matchLabels"]
        (e,) = m["spec"].get("endpoints") or m["spec"]["podMetricsEndpoints"]
        assert e["port"] == "metrics" and e["path"] == "/metrics"
        assert int(e["scrapeTimeout"].rstrip("s")) < int(e["interval"].rstrip("s"))
        rl = e["relabelings"]
        assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in rl
        # the exporter's own pod labels must not collide with the workload's pod attribution
        assert {"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "exporter_pod"} in rl
        assert rl[-1] == {"action": "labeldrop", "regex": "pod|namespace|container"}
    for sm in sms:
        svc = one(docs, "Service")
        assert svc["metadata"]["labels"] == sm["spec"]["selector"]["matchLabels"]
        assert [p["name"] for p in svc["spec"]["ports"]] == ["metrics"]
        assert svc["spec"]["ports"][0]["port"] == 9632
        assert svc["spec"]["clusterIP"] == "None"


def test_default_renders_the_issue_set():
    docs = render(".")
    kinds = {d["kind"] for d in docs}
    assert {"DaemonSet", "Service", "ServiceMonitor", "PrometheusRule", "NetworkPolicy", "PriorityClass",
            "ConfigMap"} <= kinds
    dash = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert len(dash) == len(list((REPO / "deploy" / "grafana").glob("*.json")))


def test_kube_prometheus_stack_dashboards_sit_where_its_grafana_sidecar_looks():
    """The grafana chart's sidecar searches only its own namespace by default (issue 38)."""
    kps = render("overlays/kube-prometheus-stack")
    dash = [d for d in by_kind(kps, "ConfigMap") if d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert dash and {d["metadata"]["namespace"] for d in dash} == {"monitoring"}
    assert one(kps, "DaemonSet")["metadata"]["namespace"] == "gpu-monitoring"


def test_release_label_is_configurable():
    default = render(".")
    kps = render("overlays/kube-prometheus-stack")
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert one(default, kind)["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        assert one(kps, kind)["metadata"]["labels"]["release"] == "prometheus"


# ---------------------------------------------------------------- generated from their sources
def _gen():
    spec = importlib.util.spec_from_file_location("gen_k8s", REPO / "scripts" / "gen-kubernetes-monitoring.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generated_files_in_sync_with_rules_and_dashboards():
    gen = _gen()
    for path, text in gen.outputs().items():
        assert path.read_text() == text, f"{path.relative_to(REPO)} drifted: run make kubernetes"
    assert subprocess.run(["python3", str(REPO / "scripts" / "gen-kubernetes-monitoring.py"), "--check"],
                          capture_output=True).returncode == 0


def test_prometheusrule_holds_every_group_of_every_rule_file():
    rules = REPO / "deploy" / "prometheus" / "rules"
    want = [g for p in sorted([*rules.glob("*.yml"), *rules.glob("*.yaml")])
            for g in yaml.safe_load(p.read_text())["groups"]]
    assert want
    pr = one(render("."), "PrometheusRule")
    assert pr["spec"]["groups"] == want
    for g in pr["spec"]["groups"]:
        for r in g["rules"]:
            assert ("alert" in r) != ("record" in r) and r["expr"]


def test_dashboard_configmaps_hold_the_json_files_verbatim():
    docs = render(".")
    got = {}
    for cm in by_kind(docs, "ConfigMap"):
        if cm["metadata"]["labels"].get("grafana_dashboard") == "1":
            got.update(cm["data"])
    files = {p.name: p.read_text() for p in (REPO / "deploy" / "grafana").glob("*.json")}
    assert set(got) == set(files)
    for name, text in files.items():
        assert json.loads(got[name]) == json.loads(text)


def test_drift_is_detected(tmp_path):
    """A rule file or dashboard added or changed after generation makes the check fail."""
    gen = _gen()
    rules = tmp_path / "rules"
    rules.mkdir()
    for p in (REPO / "deploy" / "prometheus" / "rules").glob("*.yml"):
        (rules / p.name).write_text(p.read_text())
    before = gen.render_prometheusrule(rules)
    (rules / "zz-new.yml").write_text("groups:\n  - name: new\n    rules:\n      - record: a:b\n        expr: up\n")
    after = gen.render_prometheusrule(rules)
    assert before != after and "a:b" in after
    (rules / "zz-dup.yml").write_text("groups:\n  - name: new\n    rules: []\n")
    with pytest.raises(SystemExit, match="unique group names"):
        gen.render_prometheusrule(rules)
    dash = tmp_path / "grafana"
    dash.mkdir()
    (dash / "a.json").write_text('{"title": "a"}\n')
    one_ = gen.render_dashboards(dash)
    (dash / "b.json").write_text('{"title": "b"}\n')
    assert gen.render_dashboards(dash) != one_
    (dash / "c.json").write_text("{not json")
    with pytest.raises(ValueError):
        gen.render_dashboards(dash)


# ---------------------------------------------------------------- unchanged base policy
def test_node_affinity_covers_three_vendors():
    pod = pod_spec(render("base"))
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = {e["key"] for t in terms for e in t["matchExpressions"]}
    assert {"nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present",
            "feature.node.kubernetes.io/amd-gpu", "intel.feature.node.kubernetes.io/gpu"} <= keys
    assert all(len(t["matchExpressions"]) == 1 for t in terms)  # terms are ORed
    tol = {t["key"] for t in pod["tolerations"]}
    assert {"nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "gpu.intel.com/xe"} <= tol


def test_network_policy_limits_ingress_and_egress():
    np = one(render("base"), "NetworkPolicy")["spec"]
    assert set(np["policyTypes"]) == {"Ingress", "Egress"}
    (ing,) = np["ingress"]
    assert ing["ports"] == [{"port": 9632, "protocol": "TCP"}]
    assert ing["from"], "ingress must name its sources"
    dns, meta = np["egress"]
    assert dns["to"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "kube-system"}
    assert sorted(p["protocol"] for p in dns["ports"]) == ["TCP", "UDP"] and {p["port"] for p in dns["ports"]} == {53}
    assert meta["to"] == [{"ipBlock": {"cidr": "169.254.169.254/32"}}]


def test_base_config_is_accepted_by_the_exporter(tmp_path):
    """The shipped configuration files pass the exporter's own --check-config."""
    exe = REPO / ".venv" / "bin" / "unified-gpu-exporter"
    if not exe.exists():
        pytest.skip("make install first")
    for cfg in (KDIR / "base" / "config.yml", KDIR / "components" / "per-process" / "config.yml"):
        out = subprocess.run([str(exe), "--check-config", f"--config.file={cfg}"], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, f"{cfg}: {out.stdout}{out.stderr}"


def _snake(key: str) -> str:
    return {"sourceLabels": "source_labels", "targetLabel": "target_label"}.get(key, key)


@pytest.mark.parametrize("target", ["overlays/nvidia", "overlays/per-process"])
def test_monitor_relabelings_are_valid_prometheus_relabel_configs(target, tmp_path):
    """The monitors' relabelings, as the operator passes them on, pass promtool's config check."""
    promtool = shutil.which("promtool")
    _need("promtool", promtool is not None, "Debian package prometheus")
    docs = render(target)
    (m,) = by_kind(docs, "ServiceMonitor") + by_kind(docs, "PodMonitor")
    (e,) = m["spec"].get("endpoints") or m["spec"]["podMetricsEndpoints"]
    cfg = {"scrape_configs": [{
        "job_name": "gpu", "scrape_interval": e["interval"], "scrape_timeout": e["scrapeTimeout"],
        "static_configs": [{"targets": ["gpu-node:9632"]}],  # Debian builds lack kubernetes_sd
        "relabel_configs": [{_snake(k): v for k, v in r.items()} for r in e["relabelings"]]}]}
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg))
    out = subprocess.run([promtool, "check", "config", "--syntax-only", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_client_count_variant_counts_fdinfo_clients_with_two_capabilities_not_privileged():
    """Issue 24: AMD / Intel co-tenancy evidence (DRM fdinfo, count-only) with the least
    privilege that works: host PID namespace, host /proc read-only, uid 0 with CAP_SYS_PTRACE and
    CAP_DAC_READ_SEARCH, not privileged, and no per-process series in the config."""
    docs = render("overlays/client-count")
    pod, c = pod_spec(docs), exporter(docs)
    assert pod["hostPID"] is True
    assert c["securityContext"]["privileged"] is False
    assert set(c["securityContext"]["capabilities"]["add"]) == {"SYS_PTRACE", "DAC_READ_SEARCH"}
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    vols = {v["name"]: v for v in pod["volumes"]}
    (proc,) = [m for m in c["volumeMounts"] if vols[m["name"]].get("hostPath", {}).get("path") == "/proc"]
    assert proc["readOnly"] is True and f"--path.procfs={proc['mountPath']}" in c["args"]
    (cm,) = by_kind(docs, "ConfigMap")
    config = yaml.safe_load(cm["data"]["config.yml"])
    assert config["collectors"]["fdinfo"]["options"]["processes"] == "count"
    assert config["collectors"]["nvml"]["options"]["processes"] == "count"
