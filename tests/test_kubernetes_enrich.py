"""Pod attribution against a real gRPC pod-resources server on a unix socket (speaking the
generated protobuf code), a real HTTP server standing in for the API server's pod list, and fake
``/proc`` trees whose cgroup files have each runtime's path shape."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from exporter.enrich.kubernetes import (
    ClaimDevice,
    PodRef,
    PodResourcesEnricher,
    SeriesLabeler,
    claim_keys,
    decode_list_response,
    device_keys,
    id_keys,
    normalize_pci,
)
from exporter.sources.base import Device
from exporter.sources.context import SourceContext
from exporter.testing import frames_of

if os.environ.get("CI") == "true":  # under CI a missing package is a failure, not a skip
    import grpc

    from exporter.enrich import podresources_v1_pb2 as pb
else:
    grpc = pytest.importorskip("grpc", reason="grpcio not installed (pip install '.[kubernetes]')")
    pb = pytest.importorskip("exporter.enrich.podresources_v1_pb2", reason="protobuf not installed")

REPO = Path(__file__).resolve().parent.parent
NV_UUID = "GPU-3a9ad3c6-8b0e-ef35-5bb0-34b9fd2b3a1f"
SHARED_UUID = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
MIG_PARENT = "GPU-ffffffff-0000-1111-2222-333333333333"
MIG_A = "MIG-b3b7e2d4-6f43-5c8e-9f3e-2b1c0d9e8f7a"
MIG_B = "MIG-c4c8f3e5-7a54-6d9f-8a4f-3c2d1e0f9a8b"
UID_A = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
UID_B = "11112222-3333-4444-5555-666677778888"
UID_M1 = "9a8b7c6d-5e4f-3a2b-1c0d-e9f8a7b6c5d4"
CID_A = "a" * 64
CID_B = "b" * 64
CID_M1 = "c" * 64


# ---- the kubelet's answer, built with the generated messages --------------------------------
def node_response():
    r = pb.ListPodResourcesResponse()

    def pod(name, ns, *containers):
        p = r.pod_resources.add(name=name, namespace=ns)
        for cname, devs, claims in containers:
            c = p.containers.add(name=cname)
            c.cpu_ids.extend([2, 3])  # ignored
            for resource, ids in devs:
                d = c.devices.add(resource_name=resource, device_ids=ids)
                d.topology.nodes.add(ID=0)
            for claim_name, driver, pool, device in claims:
                dr = c.dynamic_resources.add(claim_name=claim_name, claim_namespace=ns)
                cr = dr.claim_resources.add(driver_name=driver, pool_name=pool, device_name=device)
                cr.cdi_devices.add(name=f"k8s.{driver}/claim={claim_name}")

    pod("train-0", "ml", ("trainer", [("nvidia.com/gpu", [NV_UUID])], []))
    pod("infer-1", "serve", ("server", [("nvidia.com/mig-1g.10gb", [MIG_A])], []))
    pod("infer-2", "serve", ("server", [("nvidia.com/mig-2g.20gb", [MIG_B])], []))
    pod("rocm-job", "hpc", ("main", [("amd.com/gpu", ["0000:c1:00.0"])], []))
    pod("transcode", "media", ("ffmpeg", [("gpu.intel.com/i915", ["card1-0"])], []),
        ("sidecar", [("gpu.intel.com/i915", ["card1-1"])], []))
    pod("nic", "net", ("c", [("example.com/sriov", ["0000:c1:00.0"])], []))  # not a GPU
    pod("share-a", "ts", ("a", [("nvidia.com/gpu", [SHARED_UUID + "::0"])], []))
    pod("share-b", "ts", ("b", [("nvidia.com/gpu", [SHARED_UUID.upper() + "::1"])], []))
    pod("dra-job", "dra", ("worker", [], [("gpu-claim", "gpu.nvidia.com", "node-1", "gpu-5")]))
    pod("cpu-only", "default", ("c", [], []))
    return r


class FakeKubelet:
    """v1.PodResourcesLister on a unix socket, served by grpc with the generated messages."""

    def __init__(self, path: str) -> None:
        self.response = node_response()
        self.calls = 0
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))

        def list_handler(request, _ctx):
            assert isinstance(request, pb.ListPodResourcesRequest)
            self.calls += 1
            return self.response

        handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            "List": grpc.unary_unary_rpc_method_handler(
                list_handler, request_deserializer=pb.ListPodResourcesRequest.FromString,
                response_serializer=pb.ListPodResourcesResponse.SerializeToString)})
        self.server.add_generic_rpc_handlers((handler,))
        self.server.add_insecure_port(f"unix:{path}")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=None).wait()


# ---- the API server's pod list ---------------------------------------------------------------
def pod_item(ns, name, uid, labels, containers, owner=None):
    meta = {"namespace": ns, "name": name, "uid": uid, "labels": labels}
    if owner:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    return {"metadata": meta, "status": {"containerStatuses": [
        {"name": c, "containerID": f"containerd://{cid}"} for c, cid in containers]}}


PODS = [
    pod_item("ts", "share-a", UID_A, {"app.kubernetes.io/name": "llm-train", "team": "research"},
             [("a", CID_A)]),
    pod_item("ts", "share-b", UID_B, {"pod-template-hash": "5d8f7c9b6", "team": "serving"},
             [("b", CID_B)], owner=("ReplicaSet", "chat-api-5d8f7c9b6")),
    pod_item("serve", "infer-1", UID_M1, {"app.kubernetes.io/name": "ranker"}, [("server", CID_M1)]),
    pod_item("serve", "infer-2", "22223333-4444-5555-6666-777788889999", {}, [("server", "d" * 64)],
             owner=("Job", "batch-7")),
    pod_item("ml", "train-0", "33334444-5555-6666-7777-888899990000",
             {"app.kubernetes.io/name": "bert"}, [("trainer", "e" * 64)]),
]


class FakeApiServer:
    def __init__(self, token: str, pods: list[dict], page: int = 2) -> None:
        self.requests: list[str] = []
        self.pods, self.page, self.token = pods, page, token
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                outer.requests.append(self.path)
                if self.headers.get("Authorization") != f"Bearer {outer.token}":
                    self.send_response(401)
                    self.end_headers()
                    return
                from urllib.parse import parse_qs, urlparse
                q = parse_qs(urlparse(self.path).query)
                assert q["fieldSelector"] == ["spec.nodeName=node-1"]
                start = int(q.get("continue", ["0"])[0])
                items = outer.pods[start:start + outer.page]
                meta = {"continue": str(start + outer.page)} if start + outer.page < len(outer.pods) else {}
                body = json.dumps({"kind": "PodList", "metadata": meta, "items": items}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


# ---- fake /proc trees: one per runtime and cgroup shape ---------------------------------------
CGROUP_SHAPES = {
    # cgroup v2, systemd driver, containerd
    "containerd-v2-systemd": (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                              f"{UID_A.replace('-', '_')}.slice/cri-containerd-{CID_A}.scope\n",
                              UID_A, CID_A, "containerd"),
    # cgroup v2, systemd driver, CRI-O, Guaranteed QoS (no QoS slice)
    "crio-v2-systemd": (f"0::/kubepods.slice/kubepods-pod{UID_B.replace('-', '_')}.slice/crio-{CID_B}.scope\n",
                        UID_B, CID_B, "cri-o"),
    # cgroup v2, cgroupfs driver (no runtime in the path)
    "containerd-v2-cgroupfs": (f"0::/kubepods/besteffort/pod{UID_A}/{CID_A}\n", UID_A, CID_A, ""),
    # cgroup v1, cgroupfs driver, docker via cri-dockerd: several hierarchies
    "docker-v1-cgroupfs": (f"12:pids:/kubepods/burstable/pod{UID_B}/{CID_B}\n"
                           f"11:cpu,cpuacct:/kubepods/burstable/pod{UID_B}/{CID_B}\n"
                           f"1:name=systemd:/kubepods/burstable/pod{UID_B}/{CID_B}\n0::/\n", UID_B, CID_B, ""),
    # cgroup v1, systemd driver, docker
    "docker-v1-systemd": (f"4:memory:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
                          f"{UID_A.replace('-', '_')}.slice/docker-{CID_A}.scope\n0::/\n", UID_A, CID_A, "docker"),
    # cgroup v1, containerd's systemd "slice:prefix:id" form
    "containerd-v1-systemd": (f"3:memory:/system.slice/containerd.service/kubepods-burstable-pod"
                              f"{UID_B.replace('-', '_')}.slice:cri-containerd:{CID_B}\n", UID_B, CID_B, "containerd"),
    # kind / nested: kubelet.slice prefix
    "kind-nested": (f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
                    f"kubelet-kubepods-besteffort-pod{UID_A.replace('-', '_')}.slice/cri-containerd-{CID_A}.scope\n",
                    UID_A, CID_A, "containerd"),
}


def write_proc(root: Path, pid: int, cgroup: str, start: int = 1000, comm: str = "python") -> None:
    if pid != 1 and not (root / "1").exists():  # the host's init: a host PID namespace
        write_proc(root, 1, "0::/init.scope\n", start=1, comm="systemd")
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "cgroup").write_text(cgroup)
    # comm with a space and a parenthesis: the parser must use the last ')'
    fields = ["S"] + ["0"] * 18 + [str(start)] + ["0"] * 30
    (d / "stat").write_text(f"{pid} ({comm} x)) " + " ".join(fields) + "\n")


@pytest.fixture
def sock_dir():
    d = tempfile.mkdtemp(prefix="podres", dir="/tmp")  # unix socket paths must stay < 108 bytes
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


def dev(vendor, index, uuid="", pci="", key=None, partitions=()):
    return Device(key=key or pci or uuid, vendor=vendor, index=index, mapping=f"{vendor}.yaml",
                  uuid=uuid, pci_bus_id=pci, partitions=partitions)


def labels_for(e, device: Device, extra_ids=()) -> list[dict[str, str]]:
    """The enricher's label sets for ``device`` as dicts (what the renderer adds per container)."""
    return [dict(ls) for ls in e.label_sets(device, extra_ids)]


def head(d: Device):
    return (("vendor", d.vendor), ("gpu", d.index), ("uuid", d.uuid))


# ---- generated code ---------------------------------------------------------------------------
def test_generated_module_matches_the_vendored_proto(tmp_path):
    """podresources_v1_pb2.py is what grpcio-tools makes of podresources_v1.proto (compared as
    the serialized file descriptor, which does not depend on the generator's version)."""
    if os.environ.get("CI") != "true":
        pytest.importorskip("grpc_tools", reason="grpcio-tools not installed (test extra)")
    src = REPO / "exporter" / "enrich"
    shutil.copy(src / "podresources_v1.proto", tmp_path)
    out = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{tmp_path}", f"--python_out={tmp_path}",
                          "podresources_v1.proto"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr

    def descriptor(text: str) -> bytes:
        m = re.search(r"AddSerializedFile\((b'.*?')\)\n", text, re.S)
        assert m, "no serialized descriptor in the generated module"
        return ast.literal_eval(m.group(1))

    fresh = descriptor((tmp_path / "podresources_v1_pb2.py").read_text())
    vendored = descriptor((src / "podresources_v1_pb2.py").read_text())
    assert vendored == fresh, "podresources_v1_pb2.py is stale: run make kubernetes"
    assert pb.DESCRIPTOR.serialized_pb == vendored
    # the interface the enricher depends on
    svc = pb.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert svc.full_name == "v1.PodResourcesLister" and "List" in svc.methods_by_name
    assert "dynamic_resources" in pb.ContainerResources.DESCRIPTOR.fields_by_name


def test_decode_round_trip_and_garbage():
    pods = decode_list_response(node_response().SerializeToString())
    by_name = {p.name: p for p in pods}
    assert by_name["train-0"].containers[0].devices[0].device_ids == (NV_UUID,)
    assert by_name["dra-job"].containers[0].claims == (ClaimDevice("gpu.nvidia.com", "node-1", "gpu-5", "dra/gpu-claim"),)
    from google.protobuf.message import DecodeError
    with pytest.raises(DecodeError):
        decode_list_response(b"\x0a\x05ab")


def test_id_normalisation():
    assert normalize_pci("00000000:3B:00.0") == "0000:3b:00.0"
    assert normalize_pci("3b:00.1") == "0000:3b:00.1"
    assert normalize_pci("GPU-1234") is None
    assert id_keys("GPU-AbC::3") == {"gpu-abc::3", "gpu-abc"}
    assert id_keys("card2-5") == {"card2-5", "card2"}
    assert id_keys("nvidia1/gi3") == {"nvidia1/gi3", "nvidia1"}
    assert "nvidia5" in claim_keys(ClaimDevice("gpu.nvidia.com", "p", "gpu-5", "x/y"))
    assert "0000:3b:00.0" in claim_keys(ClaimDevice("gpu.intel.com", "p", "0000-3b-00-0-0x56c0", "x/y"))
    assert MIG_A.lower() in claim_keys(ClaimDevice("gpu.nvidia.com", "p", f"mig-{MIG_A[4:]}", "x/y"))
    nv = Device(key="00000000:3B:00.0", vendor="nvidia", index="2", mapping="nvidia.yaml", uuid=NV_UUID,
                pci_bus_id="00000000:3B:00.0")
    assert device_keys(nv) == {NV_UUID.lower(), "00000000:3b:00.0", "0000:3b:00.0", "nvidia2"}


# ---- device-plugin / DRA / MIG attribution ------------------------------------------------------
@pytest.fixture
def enricher(sock_dir):
    path = str(sock_dir / "kubelet.sock")
    kubelet = FakeKubelet(path)
    e = PodResourcesEnricher({"socket": path, "timeout_seconds": 2, "api": "off"})
    try:
        assert e.refresh_once() is True
        assert kubelet.calls == 1
    finally:
        kubelet.stop()
    return e


def test_device_plugin_allocations(enricher):
    e = enricher
    nv = dev("nvidia", "0", uuid=NV_UUID, pci="00000000:3B:00.0")
    assert labels_for(e, nv) == [{"container": "trainer", "namespace": "ml", "pod": "train-0"}]
    amd = dev("amd", "128", pci="0000:C1:00.0")  # the SR-IOV NIC on that address is no GPU resource
    assert labels_for(e, amd) == [{"container": "main", "namespace": "hpc", "pod": "rocm-job"}]
    intel = dev("intel", "1", pci="0000:03:00.0")
    assert [x["container"] for x in labels_for(e, intel)] == ["ffmpeg", "sidecar"]
    shared = dev("nvidia", "3", uuid=SHARED_UUID)
    assert [x["pod"] for x in labels_for(e, shared)] == ["share-a", "share-b"]
    dra = dev("nvidia", "5", uuid="GPU-55555555-0000-0000-0000-000000000000")
    assert e.pods_for(dra) == (PodRef("dra", "dra-job", "worker", "dra:gpu.nvidia.com"),)


def test_mig_devices_by_their_mig_uuids(enricher):
    e = enricher
    parent = dev("nvidia", "1", uuid=MIG_PARENT, partitions=(("1", MIG_A), ("2", MIG_B), ("3", "MIG-unused")))
    assert labels_for(e, parent) == []  # the parent GPU itself is allocated to nobody
    lab = e.labeler(parent)
    assert isinstance(lab, SeriesLabeler)
    h = head(parent)
    assert lab(h + (("gpu_instance", "1"), ("mig_profile", "1g.10gb"))) == (
        ("container", "server"), ("namespace", "serve"), ("pod", "infer-1"))
    assert dict(lab(h + (("gpu_instance", "2"),)))["pod"] == "infer-2"
    assert lab(h + (("gpu_instance", "3"),)) == ()  # an unallocated instance
    assert lab(h) == ()                             # GPU-level series: no single pod
    info = e.info_series(parent)
    assert {(dict(i)["pod"], dict(i)["gpu_instance"]) for i in info} == {("infer-1", "1"), ("infer-2", "2")}


def test_shared_gpu_device_series_unattributed_but_every_pod_listed(enricher):
    shared = dev("nvidia", "3", uuid=SHARED_UUID)
    assert enricher.labeler(shared) is None  # two containers: GPU-level series name neither
    assert [dict(i)["pod"] for i in enricher.info_series(shared)] == ["share-a", "share-b"]
    exclusive = dev("nvidia", "0", uuid=NV_UUID)
    assert enricher.labeler(exclusive)(head(exclusive)) == (
        ("container", "trainer"), ("namespace", "ml"), ("pod", "train-0"))


def test_failure_keeps_last_index_and_recovers(sock_dir):
    path = str(sock_dir / "kubelet.sock")
    kubelet = FakeKubelet(path)
    e = PodResourcesEnricher({"socket": path, "timeout_seconds": 1, "api": "off"})
    nv = dev("nvidia", "0", uuid=NV_UUID)
    try:
        assert e.refresh_once()
    finally:
        kubelet.stop()
    assert e.refresh_once() is False  # kubelet down
    assert e.errors == 1
    assert labels_for(e, nv)[0]["pod"] == "train-0"
    kubelet = FakeKubelet(path)  # kubelet restarted, new socket, pod gone
    kubelet.response = pb.ListPodResourcesResponse()
    try:
        assert e.refresh_once() is True
    finally:
        kubelet.stop()
    assert labels_for(e, nv) == []


def test_missing_socket_is_not_fatal(sock_dir):
    e = PodResourcesEnricher({"socket": str(sock_dir / "absent.sock"), "timeout_seconds": 0.5, "api": "off"})
    assert e.refresh_once() is False
    assert labels_for(e, dev("nvidia", "0", uuid=NV_UUID)) == []


def test_resource_names_configurable(sock_dir):
    path = str(sock_dir / "kubelet.sock")
    kubelet = FakeKubelet(path)
    try:
        e = PodResourcesEnricher({"socket": path, "resource_names": ["amd.com/gpu"], "dra_drivers": [],
                                  "api": "off"})
        assert e.refresh_once()
    finally:
        kubelet.stop()
    assert labels_for(e, dev("nvidia", "0", uuid=NV_UUID)) == []
    assert labels_for(e, dev("nvidia", "5", uuid="GPU-x")) == []
    assert len(labels_for(e, dev("amd", "0", pci="0000:c1:00.0"))) == 1


def test_options_are_validated():
    assert asyncio.run(PodResourcesEnricher({"enabled": False}).run()) is None
    with pytest.raises(ValueError, match="sock: unknown option"):
        PodResourcesEnricher({"sock": "/x"})
    with pytest.raises(ValueError, match="refresh_seconds"):
        PodResourcesEnricher({"refresh_seconds": 0})
    with pytest.raises(ValueError, match="api"):
        PodResourcesEnricher({"api": "maybe"})
    with pytest.raises(ValueError, match="node_name"):
        PodResourcesEnricher({"api": "on", "api_server": "https://x"})


# ---- PID -> cgroup -> pod ---------------------------------------------------------------------
@pytest.mark.parametrize("shape", sorted(CGROUP_SHAPES))
def test_pid_to_pod_on_each_runtime_cgroup_tree(tmp_path, shape):
    from exporter.enrich.cgroup_pods import PidCache, parse_proc_cgroup
    text, uid, cid, runtime = CGROUP_SHAPES[shape]
    ref = parse_proc_cgroup(text)
    assert (ref.pod_uid, ref.container_id, ref.runtime) == (uid, cid, runtime)
    write_proc(tmp_path, 4242, text)
    cache = PidCache(str(tmp_path), size=4)
    assert cache.lookup(4242) == ref


def test_cgroup_paths_that_are_not_pod_containers():
    from exporter.enrich.cgroup_pods import parse_cgroup_path, parse_proc_cgroup
    assert parse_proc_cgroup("0::/system.slice/sshd.service\n") is None
    assert parse_proc_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n") is None
    # CRI-O's conmon and a pod-level cgroup are not a container
    assert parse_cgroup_path(f"/kubepods.slice/kubepods-pod{UID_A.replace('-', '_')}.slice/crio-conmon-{CID_A}.scope") is None
    assert parse_cgroup_path(f"/kubepods/pod{UID_A}") is None
    assert parse_proc_cgroup("garbage\n::\n" + "x" * 1000) is None


def test_pid_cache_bounded_and_pid_reuse(tmp_path):
    from exporter.enrich.cgroup_pods import PidCache
    text_a = CGROUP_SHAPES["containerd-v2-systemd"][0]
    text_b = CGROUP_SHAPES["crio-v2-systemd"][0]
    write_proc(tmp_path, 10, text_a, start=100)
    cache = PidCache(str(tmp_path), size=3)
    assert cache.lookup(10).pod_uid == UID_A
    assert cache.lookup(10).pod_uid == UID_A and cache.reads == 1  # cached
    write_proc(tmp_path, 10, text_b, start=200)  # the PID was recycled by another pod's process
    assert cache.lookup(10).pod_uid == UID_B and cache.reads == 2
    for pid in range(20, 30):
        write_proc(tmp_path, pid, text_a)
        cache.lookup(pid)
    assert len(cache) == 3
    shutil.rmtree(tmp_path / "29")
    assert cache.lookup(29) is None  # exited


# ---- the acceptance case: two pods on one GPU, a pod on a MIG device --------------------------
def test_two_pods_sharing_a_gpu_and_a_mig_pod_each_get_their_own_labels(sock_dir, tmp_path):
    path = str(sock_dir / "kubelet.sock")
    kubelet = FakeKubelet(path)
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    api = FakeApiServer("s3cret", PODS, page=2)
    proc = tmp_path / "proc"
    write_proc(proc, 1001, CGROUP_SHAPES["containerd-v2-systemd"][0])   # share-a (UID_A, CID_A)
    write_proc(proc, 1002, CGROUP_SHAPES["crio-v2-systemd"][0])         # share-b (UID_B, CID_B)
    write_proc(proc, 1003, f"0::/kubepods/burstable/pod{UID_M1}/{CID_M1}\n")  # infer-1 on MIG 1
    write_proc(proc, 1004, "0::/system.slice/ollama.service\n")         # a host process
    try:
        e = PodResourcesEnricher({"socket": path, "api": "on", "api_server": api.url, "node_name": "node-1",
                                  "token_file": str(token), "pod_labels": ["team", "missing"],
                                  "workload_label": "app.kubernetes.io/name"}, procfs=proc)
        assert e.refresh_once()
    finally:
        kubelet.stop()
        api.stop()
    assert len(api.requests) == 3  # 5 pods, 2 per page: the continue token is followed
    shared = dev("nvidia", "3", uuid=SHARED_UUID)
    mig = dev("nvidia", "1", uuid=MIG_PARENT, partitions=(("1", MIG_A), ("2", MIG_B)))
    # first render: PIDs are queued, nothing read on the render path
    assert e.labeler(shared, ["1001", "1002", "1004", "other"]) is None
    assert e._pids.reads == 0
    e.labeler(mig, ["1003"])
    assert e.resolve_pids() == 4  # background task: three pod processes and one host process
    lab = e.labeler(shared, ["1001", "1002", "1004", "other"])
    h = head(shared)
    a = dict(lab(h + (("pid", "1001"), ("process", "python"))))
    b = dict(lab(h + (("pid", "1002"), ("process", "python"))))
    assert a == {"namespace": "ts", "pod": "share-a", "container": "a", "workload": "llm-train",
                 "label_team": "research"}
    # no workload label on the pod: the Deployment behind its ReplicaSet
    assert b == {"namespace": "ts", "pod": "share-b", "container": "b", "workload": "chat-api",
                 "label_team": "serving"}
    assert lab(h + (("pid", "1004"), ("process", "ollama"))) == ()   # not in a pod
    assert lab(h + (("pid", "other"), ("process", "other"))) == ()   # shared GPU: no single pod
    assert lab(h) == ()
    mlab = e.labeler(mig, ["1003"])
    hm = head(mig)
    want_m1 = {"namespace": "serve", "pod": "infer-1", "container": "server", "workload": "ranker"}
    assert dict(mlab(hm + (("gpu_instance", "1"), ("pid", "1003")))) == want_m1
    assert dict(mlab(hm + (("gpu_instance", "1"), ("mig_profile", "1g.10gb")))) == want_m1
    # a host process on a GPU allocated to one pod is not that pod's
    exclusive = dev("nvidia", "0", uuid=NV_UUID)
    e.labeler(exclusive, ["1004", "1005"])
    e.resolve_pids()
    xlab = e.labeler(exclusive, ["1004", "1005"])
    hx = head(exclusive)
    assert xlab(hx + (("pid", "1004"),)) == ()
    assert dict(xlab(hx + (("pid", "1005"),)))["pod"] == "train-0"  # gone / unreadable: the GPU's pod
    assert dict(xlab(hx))["workload"] == "bert"
    assert dict(mlab(hm + (("gpu_instance", "2"),))) == {
        "namespace": "serve", "pod": "infer-2", "container": "server", "workload": "batch-7"}
    # gpu_pod_info lists both pods of the shared GPU with their workloads
    info = [dict(i) for i in e.info_series(shared)]
    assert [(i["pod"], i["workload"]) for i in info] == [("share-a", "llm-train"), ("share-b", "chat-api")]


def test_renderer_puts_each_pods_labels_on_its_own_series(sock_dir, tmp_path):
    """Through the daemon's renderer: the exposition text carries the attribution."""
    from exporter.map.schema import default_mappings_dir, load_schema
    from exporter.map.store import SourceState, Store
    from exporter.render.exposition import Renderer
    from exporter.run.daemon import Daemon, Settings

    path = str(sock_dir / "kubelet.sock")
    kubelet = FakeKubelet(path)
    token = tmp_path / "token"
    token.write_text("t")
    api = FakeApiServer("t", PODS, page=10)
    proc = tmp_path / "proc"
    write_proc(proc, 1001, CGROUP_SHAPES["containerd-v2-systemd"][0])
    write_proc(proc, 1002, CGROUP_SHAPES["crio-v2-systemd"][0])
    try:
        e = PodResourcesEnricher({"socket": path, "api_server": api.url, "api": "on", "node_name": "node-1",
                                  "token_file": str(token)}, procfs=proc)
        assert e.refresh_once()
    finally:
        kubelet.stop()
        api.stop()
    shared = dev("nvidia", "3", uuid=SHARED_UUID)
    st = SourceState(name="nvml")
    st.devices = {shared.key: shared}
    h = head(shared)
    st.frames = frames_of({("gpu_memory_used_bytes", h): 1.0,
                           ("gpu_process_memory_bytes", h + (("pid", "1001"), ("process", "python"))): 2.0,
                           ("gpu_process_memory_bytes", h + (("pid", "1002"), ("process", "python"))): 3.0})
    store = Store()
    store.add(st)
    d = Daemon(Settings())
    d.k8s = e
    d._pod_labels(store)          # queues the PIDs
    e.resolve_pids()              # the background task
    per_device, info = d._pod_labels(store)
    text = Renderer(load_schema(default_mappings_dir() / "canonical.yaml")).render(
        store, [info], (), per_device).text.decode()
    lines = [ln for ln in text.splitlines() if ln.startswith(("gpu_process_memory_bytes{", "gpu_pod_info{",
                                                              "gpu_memory_used_bytes{"))]
    assert any('pid="1001"' in ln and 'pod="share-a"' in ln and 'workload="llm-train"' in ln for ln in lines)
    assert any('pid="1002"' in ln and 'pod="share-b"' in ln and 'container="b"' in ln for ln in lines)
    assert sum(ln.startswith("gpu_pod_info{") for ln in lines) == 2
    (used,) = [ln for ln in lines if ln.startswith("gpu_memory_used_bytes{")]
    assert "pod=" not in used  # the shared GPU's own series belong to no single pod


def test_api_errors_keep_the_last_pod_list(tmp_path, sock_dir):
    token = tmp_path / "token"
    token.write_text("right")
    api = FakeApiServer("right", PODS)
    try:
        e = PodResourcesEnricher({"socket": str(sock_dir / "none"), "api": "on", "api_server": api.url,
                                  "node_name": "node-1", "token_file": str(token), "timeout_seconds": 2})
        assert e.refresh_pods()
        token.write_text("rotated-but-wrong")  # the token is re-read each refresh
        assert e.refresh_pods() is False and e.api_errors == 1
        assert len(e._by_uid) == len(PODS)
        e.options.max_pods = 2
        e._lister = e._make_lister()
        token.write_text("right")
        assert e.refresh_pods() is False  # more pods than max_pods: refused, not truncated
        assert len(e._by_uid) == len(PODS)
    finally:
        api.stop()


@pytest.mark.asyncio
async def test_background_refresh_keeps_scrape_path_off_kubelet(sock_dir):
    path = str(sock_dir / "kubelet.sock")
    kubelet = FakeKubelet(path)
    e = PodResourcesEnricher({"socket": path, "refresh_seconds": 0.2, "api": "off"})
    task = asyncio.create_task(e.run())
    try:
        for _ in range(200):
            await asyncio.sleep(0.05)
            if kubelet.calls >= 1 and labels_for(e, dev("nvidia", "0", uuid=NV_UUID)):
                break
        calls = kubelet.calls
        nv = dev("nvidia", "0", uuid=NV_UUID)
        for _ in range(1000):  # 1000 "scrapes" do not call the kubelet
            assert e.labeler(nv)(head(nv))[2] == ("pod", "train-0")
        assert kubelet.calls == calls
        for _ in range(200):
            await asyncio.sleep(0.05)
            if kubelet.calls >= calls + 1:
                break
        assert kubelet.calls >= calls + 1  # the background task keeps refreshing
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        kubelet.stop()


def test_nvml_source_reports_mig_uuids_that_attribution_matches(sock_dir):
    """The NVML source (faked at the library boundary) fills Device.partitions with each MIG
    instance's UUID from nvmlDeviceGetUUID; the kubelet's MIG device IDs match them."""
    from exporter.sources.nvml import NvmlSource
    from tests.fakes import pynvml_fake as pf

    fake = pf.make_module([pf.a100_mig(0)])
    src = NvmlSource(SourceContext(options={"xid": False}), module=fake)
    src.open()
    try:
        (gpu,) = src.poll().devices
    finally:
        src.close()
    parts = dict(gpu.partitions)
    assert set(parts) == {"5", "11", "13"}
    assert all(u.startswith("MIG-") for u in parts.values())
    gi, mig_uuid = sorted(parts.items())[0]
    path = str(sock_dir / "kubelet.sock")
    kubelet = FakeKubelet(path)
    r = pb.ListPodResourcesResponse()
    p = r.pod_resources.add(name="mig-pod", namespace="ml")
    p.containers.add(name="c").devices.add(resource_name="nvidia.com/mig-1g.5gb", device_ids=[mig_uuid])
    kubelet.response = r
    try:
        e = PodResourcesEnricher({"socket": path, "api": "off"})
        assert e.refresh_once()
    finally:
        kubelet.stop()
    lab = e.labeler(gpu)
    h = (("vendor", gpu.vendor), ("gpu", gpu.index), ("uuid", gpu.uuid))
    assert dict(lab(h + (("gpu_instance", gi),)))["pod"] == "mig-pod"
    others = [g for g in parts if g != gi]
    assert lab(h + (("gpu_instance", others[0]),)) == ()
    assert lab(h) == ()


def test_no_pid_attribution_in_a_containers_own_pid_namespace(sock_dir, tmp_path):
    """Without hostPID, /proc is the exporter's own PID namespace: host PIDs from the driver would
    name unrelated processes there, so none is attributed."""
    token = tmp_path / "token"
    token.write_text("t")
    api = FakeApiServer("t", PODS, page=10)
    proc = tmp_path / "proc"
    write_proc(proc, 1, CGROUP_SHAPES["containerd-v2-systemd"][0])  # PID 1 inside a pod
    write_proc(proc, 1002, CGROUP_SHAPES["crio-v2-systemd"][0])
    try:
        e = PodResourcesEnricher({"socket": str(sock_dir / "none"), "api": "on", "api_server": api.url,
                                  "node_name": "node-1", "token_file": str(token)}, procfs=proc)
        assert e.refresh_pods()
    finally:
        api.stop()
    shared = dev("nvidia", "3", uuid=SHARED_UUID)
    e.labeler(shared, ["1", "1002"])
    assert e.resolve_pids() == 0
    assert e.labeler(shared, ["1", "1002"]) is None
    assert e._pids.reads == 0


@pytest.mark.asyncio
async def test_daemon_serves_pod_labels_from_the_kubelet(sock_dir, tmp_path):
    """The whole path: config -> daemon -> background refresh from the gRPC kubelet -> /metrics."""
    import time

    import aiohttp
    from aiohttp.test_utils import TestServer

    from exporter.run.daemon import Daemon, Settings
    from exporter.serve.server import make_app
    from exporter.simulate import SimulatorSource
    from exporter.testing import load_mappings

    # the demo scenario's NVIDIA GPUs on this host (simulated UUIDs derive from the host name)
    h100_0, h100_1 = [s.dev.uuid for s in SimulatorSource(SourceContext(options={"scenario": "demo"}, mappings=load_mappings()))._states
                      if s.dev.vendor == "nvidia"]
    path = str(sock_dir / "kubelet.sock")
    kubelet = FakeKubelet(path)
    r = pb.ListPodResourcesResponse()
    for name, ids in (("solo", [h100_0]), ("ts-a", [h100_1 + "::0"]), ("ts-b", [h100_1 + "::1"])):
        p = r.pod_resources.add(name=name, namespace="ml")
        p.containers.add(name="main").devices.add(resource_name="nvidia.com/gpu", device_ids=ids)
    kubelet.response = r
    cfg = tmp_path / "config.yml"
    cfg.write_text(f"enrich:\n  cloud: {{enabled: false}}\n  kubernetes: {{socket: {path}, api: 'off', "
                   f"refresh_seconds: 0.2}}\n")
    daemon = Daemon(Settings(config_path=cfg, simulate="demo", procfs=tmp_path))
    await daemon.start()
    server = TestServer(make_app(daemon))
    await server.start_server()
    body = ""
    try:
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                async with session.get(str(server.make_url("/metrics"))) as resp:
                    body = await resp.text()
                if "gpu_pod_info{" in body and 'pod="solo"' in body:
                    break
                await asyncio.sleep(0.1)
    finally:
        await server.close()
        await daemon.stop()
        kubelet.stop()
    lines = body.splitlines()
    solo = [ln for ln in lines if ln.startswith("gpu_memory_used_bytes{") and h100_0 in ln]
    assert solo and all('namespace="ml"' in ln and 'pod="solo"' in ln and 'container="main"' in ln
                        for ln in solo)
    shared = [ln for ln in lines if ln.startswith("gpu_memory_used_bytes{") and h100_1 in ln]
    assert shared and not any("pod=" in ln for ln in shared)  # two pods: GPU-level series name neither
    info = sorted(ln.split('pod="')[1].split('"')[0] for ln in lines if ln.startswith("gpu_pod_info{"))
    assert info == ["solo", "ts-a", "ts-b"]


def test_without_the_kubelet_socket_processes_still_name_their_pods(sock_dir, tmp_path):
    """docs/privileges.md "What to run instead, without uid 0": the socket is what needs uid 0;
    with it out of reach (here: absent) the API server's pod list and each process's cgroup
    still name the pod of every process, while the GPU-level series and gpu_pod_info name none."""
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    api = FakeApiServer("s3cret", PODS, page=10)
    proc = tmp_path / "proc"
    write_proc(proc, 1001, CGROUP_SHAPES["containerd-v2-systemd"][0])   # share-a
    write_proc(proc, 1002, CGROUP_SHAPES["crio-v2-systemd"][0])         # share-b
    try:
        e = PodResourcesEnricher({"socket": str(sock_dir / "kubelet.sock"), "timeout_seconds": 0.5,
                                  "api": "on", "api_server": api.url, "node_name": "node-1",
                                  "token_file": str(token)}, procfs=proc)
        assert e.refresh_once() is False  # no allocations: the kubelet is out of reach
    finally:
        api.stop()
    gpu = dev("nvidia", "0", uuid=NV_UUID)
    assert e.labeler(gpu, ["1001", "1002"]) is None  # queued for the background task
    assert e.resolve_pids() == 2
    lab = e.labeler(gpu, ["1001", "1002"])
    h = head(gpu)
    assert dict(lab(h + (("pid", "1001"),)))["pod"] == "share-a"
    assert dict(lab(h + (("pid", "1002"),)))["pod"] == "share-b"
    assert lab(h) == () and e.info_series(gpu) == []
