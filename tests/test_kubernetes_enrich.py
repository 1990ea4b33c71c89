"""Pod attribution from the kubelet pod-resources API, against a real gRPC server on a unix socket."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from concurrent import futures
from pathlib import Path

import pytest

from exporter.enrich.kubernetes import (
    PodRef,
    PodResourcesEnricher,
    WireError,
    decode_list_response,
    device_keys,
    id_keys,
    normalize_pci,
)
from exporter.sources.base import Device

grpc = pytest.importorskip("grpc", reason="grpcio not installed (pip install grpcio)")


# ---- an independent protobuf encoder (test side), written from the wire-format spec ----------
def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def ld(field: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return varint(field << 3 | 2) + varint(len(data)) + data


def devices(resource: str, *ids: str) -> bytes:  # ContainerDevices
    topology = ld(1, ld(1, varint(0)))  # TopologyInfo{nodes:[NUMANode{ID:0}]} -> ignored
    return ld(1, resource) + b"".join(ld(2, i) for i in ids) + ld(3, topology)


def container(name: str, *devs: bytes) -> bytes:  # ContainerResources
    cpu_ids = ld(3, varint(2) + varint(3))  # packed int64 cpu_ids -> ignored
    return ld(1, name) + b"".join(ld(2, d) for d in devs) + cpu_ids


def pod(name: str, namespace: str, *containers: bytes) -> bytes:  # PodResources
    return ld(1, name) + ld(2, namespace) + b"".join(ld(3, c) for c in containers)


def response(*pods: bytes) -> bytes:  # ListPodResourcesResponse
    return b"".join(ld(1, p) for p in pods)


NV_UUID = "GPU-3a9ad3c6-8b0e-ef35-5bb0-34b9fd2b3a1f"
MIG_UUID = "MIG-b3b7e2d4-6f43-5c8e-9f3e-2b1c0d9e8f7a"

NODE = response(
    pod("train-0", "ml", container("trainer", devices("nvidia.com/gpu", NV_UUID))),
    pod("infer-1", "serve", container("server", devices("nvidia.com/mig-1g.10gb", MIG_UUID))),
    pod("rocm-job", "hpc", container("main", devices("amd.com/gpu", "0000:c1:00.0"))),
    pod("transcode", "media", container("ffmpeg", devices("gpu.intel.com/i915", "card1-0")),
        container("sidecar", devices("gpu.intel.com/i915", "card1-1"))),
    pod("nic", "net", container("c", devices("example.com/sriov", "0000:c1:00.0"))),  # not a GPU
    pod("share-a", "ts", container("a", devices("nvidia.com/gpu", "GPU-aaaa::0"))),
    pod("share-b", "ts", container("b", devices("nvidia.com/gpu", "GPU-AAAA::1"))),
    pod("cpu-only", "default", container("c")),
)


# ---- golden bytes, hand-assembled from the spec (tag = field<<3 | wiretype) --------------------
def test_decoder_on_hand_written_bytes():
    # ListPodResourcesResponse{pod_resources:[{name:"p", namespace:"n",
    #   containers:[{name:"c", devices:[{resource_name:"amd.com/gpu", device_ids:["x"]}]}]}]}
    devs = b"\x0a\x0b" + b"amd.com/gpu" + b"\x12\x01x"              # 13 + 3 = 16 bytes
    cont = b"\x0a\x01c" + b"\x12\x10" + devs                       # 3 + 2 + 16 = 21 bytes
    podb = b"\x0a\x01p" + b"\x12\x01n" + b"\x1a\x15" + cont        # 3 + 3 + 2 + 21 = 29 bytes
    raw = b"\x0a\x1d" + podb
    (p,) = decode_list_response(raw)
    assert (p.name, p.namespace) == ("p", "n")
    assert p.containers[0].name == "c"
    assert p.containers[0].devices[0].resource_name == "amd.com/gpu"
    assert p.containers[0].devices[0].device_ids == ("x",)
    assert raw == response(pod("p", "n", ld(1, "c") + ld(2, ld(1, "amd.com/gpu") + ld(2, "x"))))


def test_decoder_skips_unknown_fields_and_rejects_garbage():
    unknown = varint(9 << 3 | 0) + varint(300) + varint(10 << 3 | 5) + b"\x01\x02\x03\x04" \
        + varint(11 << 3 | 1) + bytes(8)
    (p,) = decode_list_response(ld(1, ld(1, "p") + unknown))
    assert p.name == "p"
    for bad in (b"\x0a\x05ab", b"\x0a", b"\x0b", b"\x80\x80"):
        with pytest.raises(WireError):
            decode_list_response(bad)


def test_id_normalisation():
    assert normalize_pci("00000000:3B:00.0") == "0000:3b:00.0"
    assert normalize_pci("0000:c1:00.0") == "0000:c1:00.0"
    assert normalize_pci("3b:00.1") == "0000:3b:00.1"
    assert normalize_pci("GPU-1234") is None
    assert id_keys("GPU-AbC::3") == {"gpu-abc::3", "gpu-abc"}
    assert id_keys("card2-5") == {"card2-5", "card2"}
    assert id_keys("nvidia1/gi3") == {"nvidia1/gi3", "nvidia1"}
    assert "0000:c1:00.0" in id_keys("0000:C1:00.0")


def test_device_keys():
    nv = Device(key="00000000:3B:00.0", vendor="nvidia", index="2", mapping="nvidia.yaml", uuid=NV_UUID,
                pci_bus_id="00000000:3B:00.0")
    assert device_keys(nv) == {NV_UUID.lower(), "00000000:3b:00.0", "0000:3b:00.0", "nvidia2"}
    intel = Device(key="0000:03:00.0", vendor="intel", index="1", mapping="intel.yaml")
    assert device_keys(intel) == {"0000:03:00.0", "card1"}


# ---- a real gRPC server on a unix socket ------------------------------------------------------
class FakeKubelet:
    def __init__(self, path: str) -> None:
        self.payload = NODE
        self.calls = 0
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))

        def list_handler(request: bytes, _ctx) -> bytes:
            assert request == b""  # ListPodResourcesRequest{} is empty on the wire
            self.calls += 1
            return self.payload

        handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            "List": grpc.unary_unary_rpc_method_handler(
                list_handler, request_deserializer=lambda b: b, response_serializer=lambda b: b)})
        self.server.add_generic_rpc_handlers((handler,))
        self.server.add_insecure_port(f"unix:{path}")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=None).wait()


@pytest.fixture
def sock_dir():
    d = tempfile.mkdtemp(prefix="podres", dir="/tmp")  # unix socket paths must stay < 108 bytes
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


def dev(vendor, index, uuid="", pci="", key=None):
    return Device(key=key or pci or uuid, vendor=vendor, index=index, mapping=f"{vendor}.yaml",
                  uuid=uuid, pci_bus_id=pci)


def test_list_over_unix_socket_and_matching(sock_dir):
    path = str(sock_dir / "kubelet.sock")
    kubelet = FakeKubelet(path)
    try:
        e = PodResourcesEnricher({"socket": path, "timeout_seconds": 2})
        assert e.refresh_once() is True
        assert kubelet.calls == 1
    finally:
        kubelet.stop()
    # NVIDIA by UUID (NVML gives an 8-digit PCI domain; unrelated here)
    nv = dev("nvidia", "0", uuid=NV_UUID, pci="00000000:3B:00.0")
    assert e.labels_for(nv) == [{"namespace": "ml", "pod": "train-0", "container": "trainer"}]
    # MIG instance: by MIG UUID supplied by the NVIDIA source
    parent = dev("nvidia", "1", uuid="GPU-ffff", pci="00000000:3C:00.0")
    assert e.labels_for(parent) == []
    assert e.pods_for(parent, extra_ids=[MIG_UUID]) == (
        PodRef("serve", "infer-1", "server", "nvidia.com/mig-1g.10gb"),)
    # AMD by PCI address; the SR-IOV NIC on the same address is not a GPU resource
    amd = dev("amd", "128", pci="0000:C1:00.0")
    assert e.labels_for(amd) == [{"namespace": "hpc", "pod": "rocm-job", "container": "main"}]
    # Intel by device name card<index>, two containers share the GPU
    intel = dev("intel", "1", pci="0000:03:00.0")
    assert e.labels_for(intel) == [{"namespace": "media", "pod": "transcode", "container": "ffmpeg"},
                                   {"namespace": "media", "pod": "transcode", "container": "sidecar"}]
    # time-sliced GPU shared by two pods (replica suffix ::N, case differs)
    shared = dev("nvidia", "3", uuid="GPU-aaaa")
    assert [x["pod"] for x in e.labels_for(shared)] == ["share-a", "share-b"]


def test_failure_keeps_last_index_and_recovers(sock_dir):
    path = str(sock_dir / "kubelet.sock")
    kubelet = FakeKubelet(path)
    e = PodResourcesEnricher({"socket": path, "timeout_seconds": 1})
    nv = dev("nvidia", "0", uuid=NV_UUID)
    try:
        assert e.refresh_once()
        kubelet.payload = response()  # pod finished
    finally:
        kubelet.stop()
    assert e.refresh_once() is False  # kubelet down
    assert e.errors == 1
    assert e.labels_for(nv) == [{"namespace": "ml", "pod": "train-0", "container": "trainer"}]
    kubelet = FakeKubelet(path)  # kubelet restarted, new socket, pod gone
    kubelet.payload = response()
    try:
        assert e.refresh_once() is True
    finally:
        kubelet.stop()
    assert e.labels_for(nv) == []


def test_missing_socket_is_not_fatal(sock_dir):
    e = PodResourcesEnricher({"socket": str(sock_dir / "absent.sock"), "timeout_seconds": 0.5})
    assert e.refresh_once() is False
    assert e.labels_for(dev("nvidia", "0", uuid=NV_UUID)) == []


def test_resource_names_configurable(sock_dir):
    path = str(sock_dir / "kubelet.sock")
    kubelet = FakeKubelet(path)
    try:
        e = PodResourcesEnricher({"socket": path, "resource_names": ["amd.com/gpu"]})
        assert e.refresh_once()
    finally:
        kubelet.stop()
    assert e.labels_for(dev("nvidia", "0", uuid=NV_UUID)) == []
    assert len(e.labels_for(dev("amd", "0", pci="0000:c1:00.0"))) == 1


@pytest.mark.asyncio
async def test_background_refresh_keeps_scrape_path_off_kubelet(sock_dir):
    path = str(sock_dir / "kubelet.sock")
    kubelet = FakeKubelet(path)
    e = PodResourcesEnricher({"socket": path, "refresh_seconds": 0.2})
    task = asyncio.create_task(e.run())
    try:
        for _ in range(50):
            await asyncio.sleep(0.05)
            if kubelet.calls >= 1:
                break
        calls = kubelet.calls
        nv = dev("nvidia", "0", uuid=NV_UUID)
        for _ in range(1000):  # 1000 "scrapes" do not call the kubelet
            assert e.labels_for(nv)[0]["pod"] == "train-0"
        assert kubelet.calls == calls
        await asyncio.sleep(0.5)
        assert kubelet.calls >= calls + 1  # the background task keeps refreshing
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        kubelet.stop()


def test_disabled_and_unknown_options():
    assert asyncio.run(PodResourcesEnricher({"enabled": False}).run()) is None
    with pytest.raises(ValueError, match="unknown option"):
        PodResourcesEnricher({"sock": "/x"})
