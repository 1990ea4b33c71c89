"""The pods of this node from the Kubernetes API server: UID, namespace, name, labels, the
controller that owns them, and container ID -> container name.

Used for what the kubelet's pod-resources API does not say: pod labels (an allow-list is copied
onto series, one label names the workload) and the pod UID -> pod mapping that per-process
attribution needs (a process's cgroup names its pod UID and container ID, not the pod's name).

One ``GET /api/v1/pods?fieldSelector=spec.nodeName=<node>`` per refresh, paginated, from a
background thread; in-cluster credentials (the projected service-account token, re-read on every
refresh because it rotates, and the cluster CA). Bounded: at most ``max_pods`` pods and
``MAX_RESPONSE_BYTES`` per page; a bigger or malformed answer is an error and the last good list
stays. Needs RBAC get/list on pods (deploy/kubernetes/components/pod-labels).
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

from ..http_deadline import BodyTooLarge, Deadline, opener, read_body

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
MAX_RESPONSE_BYTES = 32 * 1024 * 1024
PAGE = 250


class PodListError(RuntimeError):
    pass


def _refuse_redirect(code: int, newurl: str) -> PodListError:
    return PodListError(f"API server answered HTTP {code} (a redirect): not followed, the "
                        "service-account token is sent to the configured server only")


@dataclass(frozen=True, slots=True)
class PodMeta:
    uid: str
    namespace: str
    name: str
    labels: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    owner_kind: str = ""
    owner_name: str = ""
    containers: dict[str, str] = field(default_factory=dict, hash=False, compare=False)  # id -> name


def in_cluster_server() -> str | None:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    if ":" in host:  # IPv6
        host = f"[{host}]"
    return f"https://{host}:{port}"


def _container_id(raw: object) -> str:
    """``containerd://<id>`` / ``cri-o://<id>`` / ``docker://<id>`` -> ``<id>``."""
    if not isinstance(raw, str):
        return ""
    return raw.rpartition("://")[2].lower()


def parse_pod(item: dict) -> PodMeta | None:
    meta = item.get("metadata") if isinstance(item, dict) else None
    if not isinstance(meta, dict):
        return None
    uid, ns, name = meta.get("uid"), meta.get("namespace"), meta.get("name")
    if not all(isinstance(x, str) and x for x in (uid, ns, name)):
        return None
    labels = meta.get("labels") or {}
    labels = {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}
    owner_kind = owner_name = ""
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            owner_kind, owner_name = str(ref.get("kind", "")), str(ref.get("name", ""))
            break
    containers: dict[str, str] = {}
    status = item.get("status") or {}
    if isinstance(status, dict):
        for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
            for cs in status.get(key) or []:
                if isinstance(cs, dict) and (cid := _container_id(cs.get("containerID"))):
                    containers[cid] = str(cs.get("name", ""))
    return PodMeta(uid.lower(), ns, name, labels, owner_kind, owner_name, containers)


def workload_name(pod: PodMeta, label: str) -> str:
    """The pod label ``label`` when set, else the owning controller (a ReplicaSet's Deployment
    by its ``pod-template-hash`` suffix), else the pod name."""
    if label and pod.labels.get(label):
        return pod.labels[label]
    if pod.owner_kind == "ReplicaSet":
        h = pod.labels.get("pod-template-hash", "")
        if h and pod.owner_name.endswith("-" + h):
            return pod.owner_name[: -len(h) - 1]
        return pod.owner_name
    return pod.owner_name or pod.name


class PodLister:
    """Blocking lister (run it in a thread)."""

    def __init__(self, server: str, node: str, *, token_file: str = f"{SA_DIR}/token",
                 ca_file: str = f"{SA_DIR}/ca.crt", timeout: float = 5.0, max_pods: int = 1000) -> None:
        self.server = server.rstrip("/")
        self.node = node
        self.token_file = token_file
        self.ca_file = ca_file
        self.timeout = timeout
        self.max_pods = max_pods

    def _ssl(self) -> ssl.SSLContext | None:
        if not self.server.startswith("https://"):
            return None
        ctx = ssl.create_default_context(cafile=self.ca_file if os.path.exists(self.ca_file) else None)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        return ctx

    def _get(self, url: str, token: str, ctx: ssl.SSLContext | None) -> dict:
        req = urllib.request.Request(url, headers={"Accept": "application/json",
                                                   "Authorization": f"Bearer {token}"})
        # the token goes to the configured server only: no redirect is followed (urllib would
        # send the Authorization header to wherever it points) and no HTTP(S)_PROXY is used;
        # one deadline covers connect, headers and body
        deadline = Deadline(self.timeout)
        try:
            with opener(deadline, ctx, _refuse_redirect).open(req, timeout=self.timeout) as resp:
                body = read_body(resp.read1, deadline, MAX_RESPONSE_BYTES, "pod list page")
        except BodyTooLarge:
            raise PodListError(f"pod list page over {MAX_RESPONSE_BYTES} bytes") from None
        except (OSError, http.client.HTTPException):
            if deadline.expired:
                raise PodListError(f"no complete answer within {self.timeout} s") from None
            raise
        finally:
            deadline.cancel()
        doc = json.loads(body)
        if not isinstance(doc, dict) or not isinstance(doc.get("items", []), list):
            raise PodListError("pod list: not a PodList")
        return doc

    def list(self) -> list[PodMeta]:
        try:
            with open(self.token_file) as f:
                token = f.read(64 * 1024).strip()
        except OSError as e:
            raise PodListError(f"service-account token {self.token_file}: {e.strerror}") from None
        ctx = self._ssl()
        selector = urllib.parse.quote(f"spec.nodeName={self.node}", safe="")
        pods: list[PodMeta] = []
        cont = ""
        while True:
            url = f"{self.server}/api/v1/pods?fieldSelector={selector}&limit={PAGE}"
            if cont:
                url += "&continue=" + urllib.parse.quote(cont, safe="")
            doc = self._get(url, token, ctx)
            for item in doc.get("items") or []:
                if (p := parse_pod(item)) is not None:
                    pods.append(p)
            if len(pods) > self.max_pods:
                raise PodListError(f"more than {self.max_pods} pods on node {self.node} (max_pods)")
            cont = str((doc.get("metadata") or {}).get("continue") or "")
            if not cont:
                return pods
