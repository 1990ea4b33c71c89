"""What the render thread is handed: a snapshot of the store, the indicators' output for the
GPUs still present, and per-GPU pod attribution.  The daemon renders once after sources change
(off the event loop) and caches the bytes for the server."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from ..map.store import Store
from ..model import DeviceId, Frames

if TYPE_CHECKING:  # imported where attribution runs (exporter/run/loading.py), not by every start
    from ..enrich.kubernetes import PodResourcesEnricher


def snapshot(store: Store) -> Store:
    """A copy of the store the render thread can read while sources keep updating."""
    snap = Store()
    snap.version = store.version
    for st in store.sources.values():
        c = copy.copy(st)  # frames: replaced, never mutated, on each poll
        c.stats = st.stats.snapshot()  # counters: copied, the source keeps counting
        snap.add(c)
    return snap


def present(store: Store) -> set[DeviceId]:
    """The GPUs the store has and that answer their source."""
    return {d.id for st in store.sources.values()
            for k, d in st.devices.items() if st.device_up.get(k, True)}


def present_only(frames: Frames, store: Store) -> Frames:
    """The indicators' output, only for devices the store still has (a lost GPU's indicators go
    with its other series)."""
    keep = frames.keys() & present(store)
    return frames if len(keep) == len(frames) else {d: f for d, f in frames.items() if d in keep}


def pod_labels(k8s: PodResourcesEnricher | None, store: Store) -> tuple[dict, Frames]:
    """Per GPU, what pod attribution adds to its series (by series: its process's pod, its MIG
    instance's pod, or the GPU's one pod), and a gpu_pod_info series per allocation."""
    if k8s is None or not k8s.enabled:
        return {}, {}
    pids: dict[DeviceId, set[str]] = {}
    for st in store.sources.values():
        for dev_id, frame in st.frames.items():
            for name, extra in frame:
                if extra and name.startswith("gpu_process_"):
                    for k, v in extra:
                        if k == "pid":
                            pids.setdefault(dev_id, set()).add(v)
    out: dict = {}
    info: Frames = {}
    for _, dev in store.info_devices():
        key = dev.id
        labeler = k8s.labeler(dev, pids.get(key, ()))
        if labeler is not None:
            out[key] = labeler
        rows = {("gpu_pod_info", ls): 1.0 for ls in k8s.info_series(dev)}
        if rows:
            info[key] = rows
    return out, info
