"""Issue 26, findings 9, 10 and 12: pod attribution believes only the kubelet's cgroup layouts
(anchored at the top of its tree), the cloud metadata client follows no redirect and bounds
every answer and label (``enabled: "false"`` is an error, not "on"), and the Kubernetes API
client sends its token to the configured server only (no redirects, no HTTP(S)_PROXY).  Real
HTTP servers on loopback, the real kubelet gRPC protocol on a unix socket."""

from __future__ import annotations

import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from aiohttp import web

from exporter.enrich.cgroup_pods import parse_proc_cgroup
from exporter.enrich.cloud import CloudEnricher, detect
from exporter.enrich.kube_pods import PodLister, PodListError
from exporter.enrich.kubernetes import PodResourcesEnricher
from tests.conftest import REPO
from tests.e2e_util import EXPORTER_CMD
from tests.test_cloud_enrich import AWS_DOC, detect_aws, not_found_app, start, url
from tests.test_kubernetes_enrich import (  # noqa: F401
    CGROUP_SHAPES,
    CID_A,
    PODS,
    SHARED_UUID,
    UID_A,
    FakeApiServer,
    FakeKubelet,
    dev,
    head,
    sock_dir,
    write_proc,
)

UID_A_ = UID_A.replace("-", "_")
# a host user's own delegated subtree (systemd gives users user@<uid>.service to name freely)
SPOOFED = [
    f"0::/user.slice/user-1000.slice/user@1000.service/app.slice/kubepods-besteffort-pod{UID_A_}.slice/"
    f"cri-containerd-{CID_A}.scope\n",
    f"0::/user.slice/user-1000.slice/user@1000.service/kubepods/burstable/pod{UID_A}/{CID_A}\n",
    f"0::/user.slice/user-1000.slice/user@1000.service/kubepods.slice/kubepods-pod{UID_A_}.slice/"
    f"cri-containerd-{CID_A}.scope\n",
    f"1:name=systemd:/user.slice/user-1000.slice/session-2.scope/kubepods/pod{UID_A}/{CID_A}\n",
    f"0::/../../../user.slice/kubepods-besteffort-pod{UID_A_}.slice/cri-containerd-{CID_A}.scope\n",
]


@pytest.mark.parametrize("text", SPOOFED)
def test_pod_component_outside_the_kubelets_tree_is_not_a_pod(text):
    assert parse_proc_cgroup(text) is None


@pytest.mark.parametrize("shape", sorted(CGROUP_SHAPES))
def test_every_kubelet_layout_is_still_recognised(shape):
    text, uid, cid, runtime = CGROUP_SHAPES[shape]
    ref = parse_proc_cgroup(text)
    assert ref is not None and (ref.pod_uid, ref.container_id, ref.runtime) == (uid, cid, runtime)


def test_paths_relative_to_a_private_cgroup_namespace_are_recognised():
    ref = parse_proc_cgroup(f"0::/../../kubepods-besteffort-pod{UID_A_}.slice/cri-containerd-{CID_A}.scope\n")
    assert ref is not None and ref.pod_uid == UID_A
    ref = parse_proc_cgroup(f"0::/../../pod{UID_A}/{CID_A}\n")
    assert ref is not None and ref.container_id == CID_A


def test_host_users_process_is_not_charged_to_another_tenants_pod(sock_dir, tmp_path):  # noqa: F811
    path = str(sock_dir / "kubelet.sock")
    kubelet = FakeKubelet(path)
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    api = FakeApiServer("s3cret", PODS, page=10)
    proc = tmp_path / "proc"
    write_proc(proc, 1001, CGROUP_SHAPES["containerd-v2-systemd"][0])  # share-a's real process
    write_proc(proc, 2001, SPOOFED[0], comm="miner")                  # a host user's process
    try:
        e = PodResourcesEnricher({"socket": path, "api": "on", "api_server": api.url, "node_name": "node-1",
                                  "token_file": str(token)}, procfs=proc)
        assert e.refresh_once()
    finally:
        kubelet.stop()
        api.stop()
    shared = dev("nvidia", "3", uuid=SHARED_UUID)
    e.labeler(shared, ["1001", "2001"])
    e.resolve_pids()
    lab = e.labeler(shared, ["1001", "2001"])
    h = head(shared)
    assert dict(lab(h + (("pid", "1001"),)))["pod"] == "share-a"
    assert lab(h + (("pid", "2001"),)) == ()  # not share-a's, nor any pod's


# ---- cloud metadata ----------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_metadata_redirect_is_not_followed():
    secret_hits: list = []

    async def secret(req: web.Request) -> web.Response:  # a loopback-only URL
        secret_hits.append(req.path)
        return web.Response(text="root-only-secret")
    sapp = web.Application()
    sapp.router.add_route("*", "/{tail:.*}", secret)
    target = await start(sapp)

    async def bounce(req: web.Request) -> web.Response:
        raise web.HTTPFound(url(target) + "/secret")
    bapp = web.Application()
    bapp.router.add_route("*", "/{tail:.*}", bounce)
    bouncer, other = await start(bapp), await start(not_found_app())
    try:
        for provider in ("aws", "azure", "gcp"):
            eps = {"aws": url(other), "azure": url(other), "gcp": url(other), provider: url(bouncer)}
            assert await detect(endpoints=eps) is None
    finally:
        for s in (target, bouncer, other):
            await s.close()
    assert secret_hits == []


@pytest.mark.asyncio
@pytest.mark.parametrize("field,size", [("instanceId", 1_000_000), ("region", 5_000), ("instanceType", 200)])
async def test_oversized_metadata_answers_are_refused(field, size):
    doc = {**AWS_DOC, field: "i" * size}

    async def token(_req: web.Request) -> web.Response:
        return web.Response(text="tok")

    async def document(_req: web.Request) -> web.Response:
        return web.Response(text=json.dumps(doc))
    ident = await detect_aws(token, document)
    assert ident is None  # the whole answer is refused: no label of it reaches a series


def test_cloud_enabled_must_be_a_boolean():
    with pytest.raises(ValueError, match="true or false"):
        CloudEnricher({"enabled": "false"})
    assert CloudEnricher({"enabled": False}).enabled is False


def test_string_false_for_cloud_enabled_is_a_config_error(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text('enrich:\n  cloud:\n    enabled: "false"\n')
    r = subprocess.run([*EXPORTER_CMD, "--config.file", str(cfg), "--check-config"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    # the line of the field itself (enrich: is validated with the file, as every other section)
    assert r.returncode != 0 and "c.yaml:3: enrich.cloud.enabled" in r.stderr and "true or false" in r.stderr, r.stderr


# ---- Kubernetes API client ---------------------------------------------------------------------
class _Recorder:
    """Records every request and the Authorization header it carried; answers ``answer``."""

    def __init__(self, answer) -> None:  # noqa: ANN001
        self.seen: list[tuple[str, str]] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                outer.seen.append((self.path, self.headers.get("Authorization", "")))
                answer(self)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _pod_list(h: BaseHTTPRequestHandler) -> None:
    body = json.dumps({"kind": "PodList", "metadata": {}, "items": []}).encode()
    h.send_response(200)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def test_api_token_never_follows_a_redirect(tmp_path):
    thief = _Recorder(_pod_list)

    def redirect(h: BaseHTTPRequestHandler) -> None:
        h.send_response(307)
        h.send_header("Location", thief.url + "/api/v1/pods")
        h.send_header("Content-Length", "0")
        h.end_headers()
    api = _Recorder(redirect)
    token = tmp_path / "token"
    token.write_text("sa-token-123\n")
    try:
        with pytest.raises(PodListError, match="redirect"):
            PodLister(api.url, "node-1", token_file=str(token), timeout=5).list()
    finally:
        api.stop()
        thief.stop()
    assert api.seen and api.seen[0][1] == "Bearer sa-token-123"
    assert thief.seen == []


def test_api_client_ignores_proxy_environment(tmp_path, monkeypatch):
    proxy, api = _Recorder(_pod_list), _Recorder(_pod_list)
    for var in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(var, proxy.url)
    for var in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    import urllib.request
    monkeypatch.setattr(urllib.request, "_opener", None)  # urlopen's cached opener read the env earlier
    token = tmp_path / "token"
    token.write_text("sa-token-123\n")
    try:
        assert PodLister(api.url, "node-1", token_file=str(token), timeout=5).list() == []
    finally:
        api.stop()
        proxy.stop()
    assert proxy.seen == []
    assert len(api.seen) == 1 and api.seen[0][1] == "Bearer sa-token-123"


@pytest.mark.asyncio
async def test_metadata_answer_sent_in_delayed_chunks_is_read_whole():
    """A valid answer that arrives in pieces (a slow metadata service, a proxy flushing early):
    read to its end, never cut at whatever had arrived when the first read returned."""
    import asyncio
    body = json.dumps(AWS_DOC).encode()

    async def token(_req: web.Request) -> web.Response:
        return web.Response(text="tok")

    async def document(req: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.content_length = len(body)
        await resp.prepare(req)
        step = len(body) // 4 + 1
        for i in range(0, len(body), step):
            await resp.write(body[i:i + step])
            await asyncio.sleep(0.2)  # the client has read what arrived before the next piece
        await resp.write_eof()
        return resp
    app = web.Application()
    app.router.add_put("/latest/api/token", token)
    app.router.add_get("/latest/dynamic/instance-identity/document", document)
    aws, other = await start(app), await start(not_found_app())
    try:
        ident = await detect(endpoints={"aws": url(aws), "azure": url(other), "gcp": url(other)}, timeout=10)
    finally:
        await aws.close()
        await other.close()
    assert ident is not None and ident.instance_id == AWS_DOC["instanceId"]
