"""Pod attribution's data side: kubelet pod-resources decoding, the device IDs each vendor's
device plugin or DRA driver uses, the GPU -> pods index and the per-series labeler.  The
enricher (``kubernetes.py``) refreshes these in the background."""

from __future__ import annotations

import fnmatch
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..model import Device, Labels
from .options import DEFAULT_DRA_DRIVERS, DEFAULT_RESOURCES, DEFAULT_SOCKET  # noqa: F401 - importable here

log = logging.getLogger("exporter.enrich.kubernetes")

LIST_METHOD = "/v1.PodResourcesLister/List"
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
_LABEL_NAME_RE = re.compile(r"[^a-zA-Z0-9_]")



# ----------------------------------------------------------------------------------------------
# What the kubelet reports, decoded with the generated protobuf module
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    resource_name: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    driver: str
    pool: str
    device: str
    claim: str  # namespace/name of the ResourceClaim


@dataclass(frozen=True, slots=True)
class ContainerResources:
    name: str
    devices: tuple[ContainerDevices, ...]
    claims: tuple[ClaimDevice, ...] = ()


@dataclass(frozen=True, slots=True)
class PodResources:
    name: str
    namespace: str
    containers: tuple[ContainerResources, ...]


def decode_list_response(buf: bytes) -> list[PodResources]:
    """Decode a serialized ``v1.ListPodResourcesResponse`` (raises ``google.protobuf``'s
    ``DecodeError`` on garbage)."""
    from . import podresources_v1_pb2 as pb

    return from_message(pb.ListPodResourcesResponse.FromString(buf))


def from_message(msg: Any) -> list[PodResources]:
    out = []
    for p in msg.pod_resources:
        containers = []
        for c in p.containers:
            devs = tuple(ContainerDevices(d.resource_name, tuple(d.device_ids)) for d in c.devices)
            claims = tuple(ClaimDevice(r.driver_name, r.pool_name, r.device_name,
                                       f"{dr.claim_namespace}/{dr.claim_name}")
                           for dr in c.dynamic_resources for r in dr.claim_resources)
            containers.append(ContainerResources(c.name, devs, claims))
        out.append(PodResources(p.name, p.namespace, tuple(containers)))
    return out


def list_pod_resources(socket_path: str, timeout: float) -> list[PodResources]:
    """One blocking ``List`` call over the unix socket (run it in a thread)."""
    import grpc  # optional dependencies: pip install '.[kubernetes]' (grpcio, protobuf)

    from . import podresources_v1_pb2 as pb

    target = f"unix://{socket_path}"
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    with grpc.insecure_channel(target, options=options) as channel:
        call = channel.unary_unary(LIST_METHOD,
                                   request_serializer=pb.ListPodResourcesRequest.SerializeToString,
                                   response_deserializer=pb.ListPodResourcesResponse.FromString)
        msg = call(pb.ListPodResourcesRequest(), timeout=timeout)
    return from_message(msg)


# ----------------------------------------------------------------------------------------------
# Device ID normalisation and the index
# ----------------------------------------------------------------------------------------------

_PCI_RE = re.compile(r"^(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])$")
_PCI_DASHED_RE = re.compile(r"(?:^|[^0-9a-f])([0-9a-f]{4})-([0-9a-f]{2})-([0-9a-f]{2})-([0-7])(?:$|[^0-9a-f])")
_UUID_IN_RE = re.compile(r"((?:gpu|mig)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})")
_INTEL_SHARE_RE = re.compile(r"^(card\d+)-\d+$")
_GKE_MIG_RE = re.compile(r"^(nvidia\d+)/gi\d+(?:/vgpu\d+)?$")
_NV_DRA_GPU_RE = re.compile(r"^gpu-(\d+)$")


def normalize_pci(addr: str) -> str | None:
    """``00000000:3B:00.0`` (NVML) / ``0000:3b:00.0`` (sysfs) / ``3b:00.0`` -> ``0000:3b:00.0``."""
    m = _PCI_RE.match(addr.strip().lower())
    if m is None:
        return None
    dom, bus, dev, fn = m.groups()
    return f"{int(dom or '0', 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{fn}"


def id_keys(device_id: str) -> set[str]:
    """Keys under which one device-plugin device ID is indexed."""
    d = device_id.strip().lower()
    keys = {d}
    base = d.split("::", 1)[0]  # NVIDIA time-slicing replicas, AWS
    keys.add(base)
    if (m := _INTEL_SHARE_RE.match(base)) is not None:
        keys.add(m.group(1))
    if (m := _GKE_MIG_RE.match(base)) is not None:
        keys.add(m.group(1))
    if (pci := normalize_pci(base)) is not None:
        keys.add(pci)
    return keys


def claim_keys(c: ClaimDevice) -> set[str]:
    """Keys under which one DRA-allocated device is indexed."""
    name = c.device.strip().lower()
    if not name:
        return set()
    keys = {name, f"{c.pool.lower()}/{name}"}
    if (m := _UUID_IN_RE.search(name)) is not None:
        keys.add(m.group(1))
    if (m := _PCI_DASHED_RE.search(name)) is not None:
        keys.add(f"{m.group(1)}:{m.group(2)}:{m.group(3)}.{m.group(4)}")
    if "nvidia" in c.driver.lower() and (m := _NV_DRA_GPU_RE.match(name)) is not None:
        keys.add(f"nvidia{m.group(1)}")
    return keys


def device_keys(device: Device, extra_ids: Iterable[str] = ()) -> set[str]:
    """Keys under which a GPU can appear in the kubelet's device IDs."""
    keys: set[str] = set()
    for ident in (device.uuid, device.key, *extra_ids):
        if ident:
            keys.add(ident.strip().lower())
    for addr in (device.pci_bus_id, device.key):
        if addr and (pci := normalize_pci(addr)) is not None:
            keys.add(pci)
    if device.index != "":
        if device.vendor == "nvidia":
            keys.add(f"nvidia{device.index}")
        else:
            keys.add(f"card{device.index}")
    return keys


@dataclass(frozen=True, slots=True, order=True)
class PodRef:
    namespace: str
    pod: str
    container: str
    resource: str

    def labels(self) -> dict[str, str]:
        return {"namespace": self.namespace, "pod": self.pod, "container": self.container}


def build_index(pods: Iterable[PodResources], patterns: Iterable[str],
                dra_drivers: Iterable[str] = DEFAULT_DRA_DRIVERS) -> dict[str, tuple[PodRef, ...]]:
    pats, drivers = tuple(patterns), tuple(dra_drivers)
    acc: dict[str, set[PodRef]] = {}
    for pod in pods:
        for c in pod.containers:
            for dev in c.devices:
                if not any(fnmatch.fnmatchcase(dev.resource_name, p) for p in pats):
                    continue
                ref = PodRef(pod.namespace, pod.name, c.name, dev.resource_name)
                for device_id in dev.device_ids:
                    for k in id_keys(device_id):
                        acc.setdefault(k, set()).add(ref)
            for claim in c.claims:
                if not any(fnmatch.fnmatchcase(claim.driver, p) for p in drivers):
                    continue
                ref = PodRef(pod.namespace, pod.name, c.name, f"dra:{claim.driver}")
                for k in claim_keys(claim):
                    acc.setdefault(k, set()).add(ref)
    return {k: tuple(sorted(v)) for k, v in acc.items()}


# ----------------------------------------------------------------------------------------------
# Labels for the renderer
# ----------------------------------------------------------------------------------------------


def label_name(pod_label: str) -> str:
    return "label_" + _LABEL_NAME_RE.sub("_", pod_label)


class SeriesLabeler:
    """Extra labels for one GPU's series, chosen by the series' own labels: a per-process series
    (``pid``) gets its process's pod, a MIG series (``gpu_instance``) its instance's pod, any other
    series the GPU's pod when exactly one container holds it."""

    __slots__ = ("device", "by_gi", "by_pid")

    def __init__(self, device: Labels, by_gi: dict[str, Labels], by_pid: dict[str, Labels]) -> None:
        self.device = device
        self.by_gi = by_gi
        self.by_pid = by_pid

    def __call__(self, labels: Labels) -> Labels:
        gi = None
        for k, v in labels:  # the extra labels (or all: identity names none of these)
            if k == "pod":
                return ()  # already attributed (gpu_pod_info)
            if k == "pid" and v in self.by_pid:
                return self.by_pid[v]
            if k == "gpu_instance":
                gi = v
        if gi is not None and gi in self.by_gi:
            return self.by_gi[gi]
        return self.device
