"""Pod attribution: which namespace / pod / container (and workload) uses each GPU, MIG device
and GPU process.

Three inputs, all read by background tasks; the scrape path only reads dicts they swap in:

* the kubelet pod-resources API (``v1.PodResourcesLister/List`` over the unix socket
  ``/var/lib/kubelet/pod-resources/kubelet.sock``), decoded with the protobuf code generated from
  the vendored ``podresources_v1.proto`` (``podresources_v1_pb2``): device-plugin allocations per
  container, and dynamic-resource (DRA) claims where the kubelet reports them;
* ``<procfs>/<pid>/cgroup`` for every PID that per-process series name (``cgroup_pods``):
  the pod UID and container ID, so every pod on a shared (time-sliced) GPU gets its own processes;
* optionally the API server's list of this node's pods (``kube_pods``): UID -> pod, container ID
  -> container name, the pod labels copied onto series (an allow-list) and the ``workload`` label.

Device IDs per device plugin (matched case-insensitively):

* NVIDIA (``nvidia.com/gpu``, ``nvidia.com/mig-<profile>``): GPU UUID ``GPU-…`` or MIG UUID
  ``MIG-…``; time-slicing replicas and AWS add ``::<n>``; with ``deviceIDStrategy=index`` or on
  GKE the device name ``nvidia<N>`` (GKE MIG: ``nvidia<N>/gi<M>``).
* AMD (``amd.com/gpu``): the PCI address ``0000:03:00.0``.
* Intel (``gpu.intel.com/i915``, ``gpu.intel.com/xe``): ``card<N>-<share>``.
* DRA claims: the claim's ``device_name`` (and ``pool/device``); a GPU/MIG UUID or a PCI address
  written with dashes inside it (``0000-3b-00-0``) is recognised; NVIDIA's driver names a GPU
  ``gpu-<minor>`` (the /dev/nvidia<minor> number, matched like the device plugin's ``nvidia<N>``
  against the NVML index, which equals it on usual systems). NVIDIA's DRA MIG devices
  (``gpu-<minor>-mig-<profile>-<start>-<size>``) carry no MIG UUID or instance id and are not
  attributed. Drivers are matched by ``dra_drivers`` patterns.

MIG instances are matched by their MIG UUIDs (``Device.partitions``, filled by the NVML source).

Labels: a series of a GPU (or MIG instance) allocated to exactly one container gets
``namespace``, ``pod``, ``container`` (+ ``workload`` and the allow-listed pod labels as
``label_<name>``). A GPU shared by several containers gets them only on its per-process series
(each process's own pod, from its cgroup); its device-level series stay unlabelled because they
belong to no single pod. ``gpu_pod_info`` (one series per GPU and container) lists every
allocation either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from ..model import Device, Labels
from .cgroup_pods import ContainerRef, PidCache
from .kube_pods import PodLister, PodMeta, in_cluster_server, workload_name
from .options import DEFAULT_SOCKET, KubernetesOptions, parse  # noqa: F401 - DEFAULT_SOCKET importable here
from .pod_index import (  # noqa: F401 - the index's names stay importable from here
    ClaimDevice,
    ContainerDevices,
    ContainerResources,
    PodRef,
    PodResources,
    SeriesLabeler,
    build_index,
    claim_keys,
    decode_list_response,
    device_keys,
    id_keys,
    label_name,
    list_pod_resources,
    normalize_pci,
)

log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------
# The enricher
# ----------------------------------------------------------------------------------------------


def parse_options(options: KubernetesOptions | Mapping[str, Any] | None) -> KubernetesOptions:
    return parse(KubernetesOptions, options)


class PodResourcesEnricher:
    """Cached GPU -> pods index and PID -> pod cache; ``run()`` refreshes both in the background."""

    def __init__(self, options: KubernetesOptions | Mapping[str, Any] | None = None,
                 procfs: str | os.PathLike = "/proc") -> None:
        o = self.options = parse_options(options)
        self.enabled = o.enabled is not False  # None (auto) is decided by the loader: built, it runs
        self.socket = o.socket
        self.refresh = o.refresh_seconds
        self.timeout = o.timeout_seconds
        self.resource_names = tuple(o.resource_names)
        self._index: dict[str, tuple[PodRef, ...]] = {}
        self._meta: dict[tuple[str, str], PodMeta] = {}   # (namespace, pod) -> metadata
        self._by_uid: dict[str, PodMeta] = {}
        self._pid_labels: dict[str, Labels] = {}          # pid -> labels (() = not in a pod)
        self._wanted: set[str] = set()                    # PIDs the series name, set by the renderer
        self._pids = PidCache(str(procfs), o.pid_cache_size)
        self._host_pids: bool | None = None  # procfs shows the host's PID namespace
        self.last_success: float = 0.0  # unix time of the last good List
        self.errors = 0
        self.api_errors = 0
        self._warned = False
        self._api_warned = False
        self._lister = self._make_lister()

    # -- API server pod list -------------------------------------------------------------------
    def _make_lister(self) -> PodLister | None:
        o = self.options
        if o.api == "off":
            return None
        server = o.api_server or in_cluster_server()
        node = o.node_name or os.environ.get("NODE_NAME", "")
        if o.api == "auto" and (server is None or not node or not os.path.exists(o.token_file)):
            return None
        if server is None or not node:
            raise ValueError("api: on needs api_server (or KUBERNETES_SERVICE_HOST/PORT) and "
                             "node_name (or NODE_NAME)")
        return PodLister(server, node, token_file=o.token_file, ca_file=o.ca_file,
                         timeout=o.timeout_seconds, max_pods=o.max_pods)

    def refresh_pods(self) -> bool:
        if self._lister is None:
            return False
        try:
            pods = self._lister.list()
        except Exception as e:  # URLError, HTTPError, PodListError, JSON errors: never fatal
            self.api_errors += 1
            if not self._api_warned:
                log.warning("pod list from the API server failed (%s); pod labels stay as they were",
                            _short(e))
                self._api_warned = True
            return False
        self._meta = {(p.namespace, p.name): p for p in pods}
        self._by_uid = {p.uid: p for p in pods}
        self._api_warned = False
        return True

    # -- label sets ------------------------------------------------------------------------------
    def _labels(self, namespace: str, pod: str, container: str, meta: PodMeta | None) -> Labels:
        out = {"namespace": namespace, "pod": pod, "container": container}
        if meta is not None:
            out["workload"] = workload_name(meta, self.options.workload_label)
            for key in self.options.pod_labels:
                if key in meta.labels:
                    out[label_name(key)] = meta.labels[key]
        return tuple(sorted(out.items()))

    def _refs(self, keys: Iterable[str]) -> tuple[PodRef, ...]:
        index = self._index  # one reference: the refresh swaps the dict, never mutates it
        found: set[PodRef] = set()
        for k in keys:
            found.update(index.get(k, ()))
        return tuple(sorted(found))

    def pods_for(self, device: Device, extra_ids: Iterable[str] = ()) -> tuple[PodRef, ...]:
        return self._refs(device_keys(device, extra_ids))

    def _sets(self, refs: Iterable[PodRef]) -> list[Labels]:
        meta = self._meta
        seen: dict[tuple[str, str, str], Labels] = {}
        for ref in refs:
            key = (ref.namespace, ref.pod, ref.container)
            if key not in seen:
                seen[key] = self._labels(*key, meta.get((ref.namespace, ref.pod)))
        return list(seen.values())

    def label_sets(self, device: Device, extra_ids: Iterable[str] = ()) -> list[Labels]:
        """One label set per (namespace, pod, container) using the GPU; empty when unallocated."""
        return self._sets(self.pods_for(device, extra_ids))

    def mig_label_sets(self, mig_uuid: str) -> list[Labels]:
        return self._sets(self._refs(id_keys(mig_uuid)))

    def labeler(self, device: Device, pids: Iterable[str] = ()) -> SeriesLabeler | None:
        """What the renderer adds to this GPU's series; None when nothing applies. Only dict
        reads: PIDs not resolved yet are queued for the background task."""
        by_gi: dict[str, Labels] = {}
        for gi, mig_uuid in device.partitions:
            sets = self.mig_label_sets(mig_uuid)
            if len(sets) == 1:  # a MIG instance shared by several containers names none of them
                by_gi[gi] = sets[0]
        by_pid: dict[str, Labels] = {}
        known, wanted = self._pid_labels, self._wanted
        for pid in pids:
            if pid.isdigit() and len(wanted) < self.options.pid_cache_size:
                wanted.add(pid)
            if pid in known:
                by_pid[pid] = known[pid]
        whole = self.label_sets(device)
        device_labels = whole[0] if len(whole) == 1 else ()
        if not device_labels and not by_gi and not by_pid:
            return None
        return SeriesLabeler(device_labels, by_gi, by_pid)

    def info_series(self, device: Device) -> list[Labels]:
        """Label sets (after the device labels) of one ``gpu_pod_info`` series per container
        holding the GPU or one of its MIG instances."""
        out = list(self.label_sets(device))
        for gi, mig_uuid in device.partitions:
            for ls in self.mig_label_sets(mig_uuid):
                out.append(tuple(sorted((*ls, ("gpu_instance", gi)))))
        return out

    # -- PID -> pod ------------------------------------------------------------------------------
    def resolve_pids(self) -> int:
        """Blocking: resolve the PIDs the series name to pods (cgroup + pod list). Returns how many
        PIDs now have labels. PIDs whose pod cannot be named yet keep the GPU-level fallback."""
        # swap first, then copy at C level: the render thread may still add to the old set
        old, self._wanted = self._wanted, set()
        wanted = frozenset(old)
        if not wanted:
            return len(self._pid_labels)
        if not self._host_pid_namespace():
            return 0
        out: dict[str, Labels] = {}
        by_uid = self._by_uid
        for pid in sorted(wanted, key=int)[: self.options.pid_cache_size]:
            ref = self._pids.lookup(int(pid))
            labels = self._pid_to_labels(ref, by_uid)
            if labels is not None:
                out[pid] = labels
        self._pid_labels = out
        return len(out)

    def _host_pid_namespace(self) -> bool:
        """GPU drivers report host PIDs: look them up only in a procfs that shows the host's PID
        namespace (hostPID, or the host's /proc mounted). In a container's own namespace PID 1
        is the container's entrypoint, inside a pod cgroup, and PID numbers name other processes."""
        if self._host_pids is None:
            from .cgroup_pods import read_pid

            init = read_pid(self._pids.procfs, 1)
            self._host_pids = init is not None and not init.pod_uid
            if not self._host_pids:
                log.warning("%s is not the host's PID namespace (PID 1 is %s): processes are not "
                            "attributed to pods; run with hostPID or mount the host's /proc "
                            "(--path.procfs)", self._pids.procfs,
                            "unreadable" if init is None else "in a pod")
        return self._host_pids

    def _pid_to_labels(self, ref: ContainerRef | None, by_uid: dict[str, PodMeta]) -> Labels | None:
        if ref is None:
            return None  # gone, or no host /proc: keep the GPU-level fallback
        if not ref.pod_uid:
            return ()  # a host process: none of the GPU's pods
        meta = by_uid.get(ref.pod_uid)
        if meta is None:
            return None
        container = meta.containers.get(ref.container_id, "")
        return self._labels(meta.namespace, meta.name, container, meta)

    # -- refresh loops ---------------------------------------------------------------------------
    def refresh_once(self) -> bool:
        """Blocking refresh of the pod-resources index (and the pod list); keeps the previous
        index on failure. Returns success of the pod-resources call."""
        self.refresh_pods()
        try:
            pods = list_pod_resources(self.socket, self.timeout)
        except Exception as e:  # grpc.RpcError, DecodeError, ImportError: never fatal
            self.errors += 1
            if not self._warned:
                log.warning("kubelet pod-resources %s unavailable (%s); GPUs keep their last pod "
                            "labels", self.socket, _short(e))
                self._warned = True
            return False
        self._index = build_index(pods, self.resource_names, self.options.dra_drivers)
        self.last_success = time.time()
        if self._warned:
            log.info("kubelet pod-resources %s reachable again", self.socket)
            self._warned = False
        return True

    async def run(self) -> None:
        """Background tasks: the index every ``refresh_seconds``, PIDs every ``pid_refresh_seconds``
        (in worker threads)."""
        if not self.enabled:
            return

        async def index_loop() -> None:
            while True:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self.refresh_once)
                await asyncio.sleep(self.refresh)

        async def pid_loop() -> None:
            while True:
                await asyncio.sleep(self.options.pid_refresh_seconds)
                if self._wanted:
                    with contextlib.suppress(Exception):
                        await asyncio.to_thread(self.resolve_pids)

        await asyncio.gather(index_loop(), pid_loop())


def _short(e: BaseException) -> str:
    code = getattr(e, "code", None)
    if callable(code):
        with contextlib.suppress(Exception):
            return f"{code().name}: {e.details()}"  # type: ignore[attr-defined]
    return f"{type(e).__name__}: {e}"
