"""What the render thread is handed: a snapshot of the store, the indicators' output for the
GPUs still present, and per-GPU pod attribution.  The daemon renders once after sources change
(off the event loop) and caches the bytes for the server."""

from __future__ import annotations

import copy
from collections import Counter
from typing import TYPE_CHECKING

from .model import IDENTITY_WIDTH, DeviceId, Labels, device_id_of, identity_labels
from .store import Store

if TYPE_CHECKING:  # imported where attribution runs (exporter/loading.py), not by every start
    from .enrich.kubernetes import PodResourcesEnricher

Extra = list[tuple[str, Labels, float]]


def snapshot(store: Store) -> Store:
    """A copy of the store the render thread can read while sources keep updating."""
    snap = Store()
    snap.version = store.version
    for st in store.sources.values():
        c = copy.copy(st)
        c.errors = Counter(st.errors)
        c.series = st.series  # replaced, never mutated, on each poll
        snap.add(c)
    return snap


def present_only(latest: Extra, store: Store) -> Extra:
    """The indicators' output, only for devices the store still has (a lost GPU's indicators go
    with its other series)."""
    present = {d.id for st in store.sources.values()
               for k, d in st.devices.items() if st.device_up.get(k, True)}
    # device_id_of(labels), inlined: this runs for every indicator series of every cycle
    return [s for s in latest if (s[1][0][1], s[1][1][1], s[1][2][1]) in present]


def pod_labels(k8s: PodResourcesEnricher | None, store: Store) -> tuple[dict, Extra]:
    """Per GPU, what pod attribution adds to its series (by series: its process's pod, its MIG
    instance's pod, or the GPU's one pod), and a gpu_pod_info series per allocation."""
    if k8s is None or not k8s.enabled:
        return {}, []
    pids: dict[DeviceId, set[str]] = {}
    for st in store.sources.values():
        for name, labels in st.series:
            if len(labels) > IDENTITY_WIDTH and name.startswith("gpu_process_"):
                for k, v in labels[IDENTITY_WIDTH:]:
                    if k == "pid":
                        pids.setdefault(device_id_of(labels), set()).add(v)
    out: dict = {}
    info: Extra = []
    for _, dev in store.info_devices():
        key = dev.id
        labeler = k8s.labeler(dev, pids.get(key, ()))
        if labeler is not None:
            out[key] = labeler
        head = identity_labels(dev)
        info.extend(("gpu_pod_info", head + ls, 1.0) for ls in k8s.info_series(dev))
    return out, info
