"""Pod / namespace / container of each GPU from the kubelet pod-resources API (v1 ``List``).

The kubelet serves ``v1.PodResourcesLister`` (gRPC) on the unix socket
``/var/lib/kubelet/pod-resources/kubelet.sock``.  ``List`` returns, per pod and container, the
device IDs that device plugins allocated, by resource name.  We keep an index of those IDs that
a background task refreshes every ``refresh_seconds``; lookups (``labels_for``) are dict reads,
so the scrape path never calls the kubelet (dcgm-exporter calls it on every scrape, which users
see as CPU spikes and empty labels under load).

Device IDs per device plugin (what we match, case-insensitively):

* NVIDIA (``nvidia.com/gpu``, ``nvidia.com/mig-<profile>``): GPU UUID ``GPU-…`` or MIG UUID
  ``MIG-…``; time-slicing replicas and AWS add ``::<n>``; with ``deviceIDStrategy=index`` or on
  GKE the device name ``nvidia<N>`` (GKE MIG: ``nvidia<N>/gi<M>``).
* AMD (``amd.com/gpu``): the PCI address ``0000:03:00.0``.
* Intel (``gpu.intel.com/i915``, ``gpu.intel.com/xe``): ``card<N>-<share>``.

So a GPU is found by UUID, by device name (``nvidia<index>`` / ``card<index>``) or by PCI address
(normalised to a 4-digit domain, lower case).  MIG UUIDs are not derivable from the parent GPU's
identity; pass them as ``extra_ids`` (the NVIDIA source knows them).

The protobuf messages are decoded by a small wire-format reader below (the request is empty and
the response uses only strings, nested messages and packed ints), so only ``grpcio`` is needed,
not ``protobuf`` and generated stubs.  Dynamic resources (DRA claims) are not read yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import logging
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from exporter.sources.base import Device

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
DEFAULT_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-*", "amd.com/gpu",
                     "gpu.intel.com/i915", "gpu.intel.com/xe")
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


# ----------------------------------------------------------------------------------------------
# Protobuf wire format (only what ListPodResourcesResponse needs)
# ----------------------------------------------------------------------------------------------


class WireError(ValueError):
    """The bytes are not a valid protobuf message."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise WireError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 64:
            raise WireError("varint too long")


def iter_fields(buf: bytes) -> Iterable[tuple[int, int, Any]]:
    """Yield ``(field number, wire type, value)``; value is int or bytes (length-delimited)."""
    pos = 0
    n = len(buf)
    while pos < n:
        key, pos = _varint(buf, pos)
        number, wtype = key >> 3, key & 7
        if number == 0:
            raise WireError("field number 0")
        if wtype == 0:
            value, pos = _varint(buf, pos)
        elif wtype == 1:
            if pos + 8 > n:
                raise WireError("truncated fixed64")
            value, pos = int.from_bytes(buf[pos:pos + 8], "little"), pos + 8
        elif wtype == 2:
            length, pos = _varint(buf, pos)
            if pos + length > n:
                raise WireError("truncated length-delimited field")
            value, pos = buf[pos:pos + length], pos + length
        elif wtype == 5:
            if pos + 4 > n:
                raise WireError("truncated fixed32")
            value, pos = int.from_bytes(buf[pos:pos + 4], "little"), pos + 4
        else:
            raise WireError(f"unsupported wire type {wtype}")
        yield number, wtype, value


def _text(v: Any) -> str:
    if not isinstance(v, bytes):
        raise WireError("expected a string field")
    return v.decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    resource_name: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ContainerResources:
    name: str
    devices: tuple[ContainerDevices, ...]


@dataclass(frozen=True, slots=True)
class PodResources:
    name: str
    namespace: str
    containers: tuple[ContainerResources, ...]


def _container_devices(buf: bytes) -> ContainerDevices:
    name, ids = "", []
    for num, wt, v in iter_fields(buf):
        if num == 1 and wt == 2:
            name = _text(v)
        elif num == 2 and wt == 2:
            ids.append(_text(v))
        # 3: TopologyInfo (ignored)
    return ContainerDevices(name, tuple(ids))


def _container_resources(buf: bytes) -> ContainerResources:
    name, devices = "", []
    for num, wt, v in iter_fields(buf):
        if num == 1 and wt == 2:
            name = _text(v)
        elif num == 2 and wt == 2:
            devices.append(_container_devices(v))
        # 3: cpu_ids, 4: memory, 5: dynamic_resources (ignored)
    return ContainerResources(name, tuple(devices))


def _pod_resources(buf: bytes) -> PodResources:
    name, namespace, containers = "", "", []
    for num, wt, v in iter_fields(buf):
        if num == 1 and wt == 2:
            name = _text(v)
        elif num == 2 and wt == 2:
            namespace = _text(v)
        elif num == 3 and wt == 2:
            containers.append(_container_resources(v))
    return PodResources(name, namespace, tuple(containers))


def decode_list_response(buf: bytes) -> list[PodResources]:
    """Decode a ``v1.ListPodResourcesResponse``."""
    return [_pod_resources(v) for num, wt, v in iter_fields(buf) if num == 1 and wt == 2]


# ----------------------------------------------------------------------------------------------
# Device ID normalisation and the index
# ----------------------------------------------------------------------------------------------

_PCI_RE = re.compile(r"^(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])$")
_INTEL_SHARE_RE = re.compile(r"^(card\d+)-\d+$")
_GKE_MIG_RE = re.compile(r"^(nvidia\d+)/gi\d+(?:/vgpu\d+)?$")


def normalize_pci(addr: str) -> str | None:
    """``00000000:3B:00.0`` (NVML) / ``0000:3b:00.0`` (sysfs) / ``3b:00.0`` -> ``0000:3b:00.0``."""
    m = _PCI_RE.match(addr.strip().lower())
    if m is None:
        return None
    dom, bus, dev, fn = m.groups()
    return f"{int(dom or '0', 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{fn}"


def id_keys(device_id: str) -> set[str]:
    """Keys under which one allocated device ID is indexed."""
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


def build_index(pods: Iterable[PodResources], patterns: Iterable[str]) -> dict[str, tuple[PodRef, ...]]:
    pats = tuple(patterns)
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
    return {k: tuple(sorted(v)) for k, v in acc.items()}


# ----------------------------------------------------------------------------------------------
# The enricher
# ----------------------------------------------------------------------------------------------


def list_pod_resources(socket_path: str, timeout: float) -> list[PodResources]:
    """One blocking ``List`` call over the unix socket (run it in a thread)."""
    import grpc  # optional dependency: pip install grpcio

    target = f"unix://{socket_path}"
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    with grpc.insecure_channel(target, options=options) as channel:
        call = channel.unary_unary(LIST_METHOD, request_serializer=lambda _req: b"",
                                   response_deserializer=lambda b: b)
        raw = call(b"", timeout=timeout)
    return decode_list_response(raw)


class PodResourcesEnricher:
    """Cached GPU -> pods index; ``run()`` refreshes it in the background."""

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        o = dict(options or {})
        unknown = set(o) - {"enabled", "socket", "refresh_seconds", "timeout_seconds", "resource_names"}
        if unknown:
            raise ValueError(f"kubernetes: unknown option(s) {', '.join(sorted(unknown))}")
        self.enabled = bool(o.get("enabled", True))
        self.socket = str(o.get("socket", DEFAULT_SOCKET))
        self.refresh = float(o.get("refresh_seconds", 30.0))
        self.timeout = float(o.get("timeout_seconds", 5.0))
        self.resource_names = tuple(o.get("resource_names", DEFAULT_RESOURCES))
        self._index: dict[str, tuple[PodRef, ...]] = {}
        self.last_success: float = 0.0  # unix time of the last good List
        self.errors = 0
        self._warned = False

    def pods_for(self, device: Device, extra_ids: Iterable[str] = ()) -> tuple[PodRef, ...]:
        index = self._index  # one reference: the refresh swaps the dict, never mutates it
        found: set[PodRef] = set()
        for k in device_keys(device, extra_ids):
            found.update(index.get(k, ()))
        return tuple(sorted(found))

    def labels_for(self, device: Device, extra_ids: Iterable[str] = ()) -> list[dict[str, str]]:
        """One label set per (namespace, pod, container) using the GPU; empty when unallocated."""
        seen: dict[tuple[str, str, str], dict[str, str]] = {}
        for ref in self.pods_for(device, extra_ids):
            seen.setdefault((ref.namespace, ref.pod, ref.container), ref.labels())
        return list(seen.values())

    def refresh_once(self) -> bool:
        """Blocking refresh; keeps the previous index on failure. Returns success."""
        try:
            pods = list_pod_resources(self.socket, self.timeout)
        except Exception as e:  # grpc.RpcError, WireError, ImportError: never fatal
            self.errors += 1
            if not self._warned:
                log.warning("kubelet pod-resources %s unavailable (%s); GPUs keep their last pod "
                            "labels", self.socket, _short(e))
                self._warned = True
            return False
        self._index = build_index(pods, self.resource_names)
        self.last_success = time.time()
        if self._warned:
            log.info("kubelet pod-resources %s reachable again", self.socket)
            self._warned = False
        return True

    async def run(self) -> None:
        """Background task: refresh now and then every ``refresh_seconds`` in a worker thread."""
        if not self.enabled:
            return
        while True:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.refresh_once)
            await asyncio.sleep(self.refresh)


def _short(e: BaseException) -> str:
    code = getattr(e, "code", None)
    if callable(code):
        with contextlib.suppress(Exception):
            return f"{code().name}: {e.details()}"  # type: ignore[attr-defined]
    return f"{type(e).__name__}: {e}"
