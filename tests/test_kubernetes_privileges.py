"""Issue 38: what every kustomize target and every component grants, rendered with Debian's
``kubectl kustomize``, against the table in docs/privileges.md ("Rendered privileges"). Docs and
manifests cannot drift: a component that adds a capability, a uid or a host path fails here until
the table says so. The default path must render a non-root, unprivileged pod."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
KDIR = REPO / "deploy" / "kubernetes"
DOC = REPO / "docs" / "privileges.md"
OVERLAYS = sorted(p.parent.name for p in (KDIR / "overlays").glob("*/kustomization.yaml"))
COMPONENTS = sorted(p.parent.name for p in (KDIR / "components").glob("*/kustomization.yaml"))
TARGETS = [".", "base", *(f"overlays/{o}" for o in OVERLAYS), *(f"components/{c}" for c in COMPONENTS)]
EXPORTER_DS = "unified-gpu-exporter"  # the exporter's DaemonSet (node-problem-detector adds its own)
NPD_IMAGE = re.compile(r"^registry\.k8s\.io/node-problem-detector/node-problem-detector:v[0-9.]+$")
COLUMNS = ("target", "exporter uid", "runAsNonRoot", "privileged", "allowPrivilegeEscalation",
           "capabilities added", "hostPID", "host paths", "root init container")


def _kubectl() -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        if os.environ.get("CI") == "true":
            pytest.fail("kubectl missing under CI=true (Debian package kubectl)")
        pytest.skip("kubectl not installed (Debian package kubectl)")
    return kubectl


@cache
def render(target: str) -> tuple[dict, ...]:
    """A target's manifests; a component is rendered on the base alone (a temporary kustomization
    beside nothing else), which is what it adds when you compose it."""
    kubectl = _kubectl()
    if target.startswith("components/"):
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            rel = lambda p: os.path.relpath(p, tmp)  # noqa: E731 kustomize refuses absolute roots
            Path(tmp, "kustomization.yaml").write_text(yaml.safe_dump({
                "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                "resources": [rel(KDIR / "base")], "components": [rel(KDIR / target)]}))
            out = subprocess.run([kubectl, "kustomize", tmp], capture_output=True, text=True, timeout=120)
    else:
        out = subprocess.run([kubectl, "kustomize", str(KDIR / target)], capture_output=True, text=True,
                             timeout=120)
    assert out.returncode == 0, f"kubectl kustomize {target}: {out.stderr}"
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def _yes(v) -> str:
    return "yes" if v else "no"


def granted(docs) -> dict[str, str]:
    """The table row of one rendered target (the cells as docs/privileges.md writes them)."""
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == EXPORTER_DS]
    pod = ds["spec"]["template"]["spec"]
    (c,) = [c for c in pod["containers"] if c["name"] == "exporter"]
    psc, csc = pod.get("securityContext", {}), c.get("securityContext", {})
    uid = csc.get("runAsUser", psc.get("runAsUser"))
    non_root = csc.get("runAsNonRoot", psc.get("runAsNonRoot"))
    caps = sorted(csc.get("capabilities", {}).get("add", []))
    hostpaths = sorted(v["hostPath"]["path"] for v in pod.get("volumes", []) if "hostPath" in v)
    inits = []
    for ic in pod.get("initContainers", []):
        sc = ic.get("securityContext", {})
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            inits.append(f"{ic['name']}: " + "+".join(sorted(sc.get("capabilities", {}).get("add", []))))
    return {
        "exporter uid": str(uid),
        "runAsNonRoot": _yes(non_root),
        "privileged": _yes(csc.get("privileged")),
        "allowPrivilegeEscalation": _yes(csc.get("allowPrivilegeEscalation", True)),
        "capabilities added": ", ".join(caps) or "none",
        "hostPID": _yes(pod.get("hostPID")),
        "host paths": ", ".join(hostpaths) or "none",
        "root init container": "; ".join(inits) or "none",
    }


def doc_table() -> dict[str, dict[str, str]]:
    text = DOC.read_text()
    start = text.index("## Rendered privileges")
    lines = text[start:].splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    rows = []
    for ln in lines[first:]:  # the first table of the section, up to its end
        if not ln.startswith("|"):
            break
        rows.append(ln)
    header = [h.strip() for h in rows[0].strip("|").split("|")]
    assert tuple(header) == COLUMNS, f"docs/privileges.md table columns: {header}"
    table = {}
    for ln in rows[2:]:
        cells = [re.sub(r"[`*]", "", x).strip() for x in ln.strip().strip("|").split("|")]
        table[cells[0]] = dict(zip(COLUMNS[1:], cells[1:], strict=True))
    return table


def test_the_table_lists_every_target_and_component_once():
    assert sorted(doc_table()) == sorted(TARGETS)


@pytest.mark.parametrize("target", TARGETS)
def test_rendered_security_context_matches_docs_table(target):
    assert granted(render(target)) == doc_table()[target], (
        f"{target}: docs/privileges.md 'Rendered privileges' says {doc_table()[target]}, "
        f"the manifests grant {granted(render(target))}")


def test_default_apply_is_a_non_root_unprivileged_pod():
    """kubectl apply -k deploy/kubernetes: no container of the pod runs as root or privileged, none
    adds a capability or may escalate, no host namespace."""
    (ds,) = [d for d in render(".") if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    for c in pod["containers"] + pod.get("initContainers", []):
        sc = c.get("securityContext", {})
        assert sc.get("runAsUser", pod["securityContext"]["runAsUser"]) != 0, c["name"]
        assert sc.get("runAsNonRoot", True) is True, c["name"]
        assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False, c["name"]
        assert sc["capabilities"] == {"drop": ["ALL"]}, c["name"]
    assert not any(pod.get(k) for k in ("hostPID", "hostIPC", "hostNetwork"))


def test_root_or_privileged_only_where_the_component_says_so():
    """Every component whose render runs something as uid 0 or privileged says GRANTS/uid 0/
    privileged in its own kustomization comments; the others must not need to."""
    for comp in COMPONENTS:
        row = granted(render(f"components/{comp}"))
        risky = (row["exporter uid"] == "0" or row["privileged"] == "yes"
                 or row["root init container"] != "none")
        text = (KDIR / "components" / comp / "kustomization.yaml").read_text()
        says = bool(re.search(r"uid 0|privileged: true|PRIVILEGED|GRANTS", text))
        assert says or not risky, f"components/{comp} runs as root or privileged without saying so"


def test_one_image_everywhere_and_its_tag_is_the_release():
    """The image is named once (base/kustomization.yaml images:) and every container of every
    target runs it at the package's version."""
    import exporter
    base = yaml.safe_load((KDIR / "base" / "kustomization.yaml").read_text())
    (img,) = base["images"]
    assert img["newTag"] == exporter.__version__
    want = f"{img['newName']}:{img['newTag']}"
    for target in TARGETS:
        for ds in (d for d in render(target) if d["kind"] == "DaemonSet"):
            pod = ds["spec"]["template"]["spec"]
            images = {c["image"] for c in pod["containers"] + pod.get("initContainers", [])}
            if ds["metadata"]["name"] != EXPORTER_DS:  # NPD's: its binary comes out of NPD's own image
                assert {c["image"] for c in pod["containers"]} == {want}, (target, ds["metadata"]["name"])
                images = {i for i in images if not NPD_IMAGE.match(i)}
            assert images == {want}, (target, ds["metadata"]["name"], images)
    named = [p for p in KDIR.rglob("*.yaml") if re.search(r"image: unified-gpu-exporter:", p.read_text())]
    assert not named, f"a tag outside base/kustomization.yaml: {named}"


def test_a_drifted_table_fails(monkeypatch):
    """The comparison can fail: the table row of the amd overlay with privileged flipped."""
    row = dict(doc_table()["overlays/amd"])
    row["privileged"] = "no"
    assert granted(render("overlays/amd")) != row


def test_persistent_state_hands_the_host_directory_to_the_exporter():
    """The opt-in persistent-state: --state.dir on the hostPath, written by the exporter's uid,
    which the root init container (CHOWN + FOWNER only) hands it before the exporter starts."""
    (ds,) = [d for d in render("components/persistent-state") if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    (arg,) = [a for a in c["args"] if a.startswith("--state.dir=")]
    vols = {v["name"]: v for v in pod["volumes"]}
    (m,) = [m for m in c["volumeMounts"] if m["mountPath"] == arg.split("=", 1)[1]]
    assert vols[m["name"]]["hostPath"]["path"] == "/var/lib/unified-gpu-exporter" and not m.get("readOnly")
    (init,) = pod["initContainers"]
    assert {e["name"]: e["value"] for e in init["env"]}["STATE_OWNER"] == str(pod["securityContext"]["runAsUser"])
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]}
    assert init["securityContext"]["allowPrivilegeEscalation"] is False
    assert any(im["name"] == m["name"] for im in init["volumeMounts"])
