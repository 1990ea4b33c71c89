"""CPU cost of Kubernetes pod attribution (not a test; `python bench/bench_pod_attribution.py`).

A node of GPUS GPUs, each time-sliced by two pods and running PROCS processes, with SERIES
canonical series per GPU. Measures, as process CPU time:

* the render path: ``Daemon._pod_labels`` (per-GPU labelers + gpu_pod_info) plus
  ``Renderer.render`` with them, against ``Renderer.render`` without attribution;
* the background PID pass: ``resolve_pids`` over a fake host /proc (cgroup v2, containerd) with
  every PID cached (steady state) and with every PID new (after a restart).

    python bench/bench_pod_attribution.py [--gpus 8] [--procs 10] [--series 150] [--renders 200]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, installed or not
from exporter.enrich.kube_pods import PodMeta  # noqa: E402
from exporter.enrich.kubernetes import (  # noqa: E402
    ContainerDevices,
    ContainerResources,
    PodResources,
    PodResourcesEnricher,
    build_index,
)
from exporter.map.schema import default_mappings_dir, load_schema  # noqa: E402
from exporter.map.store import SourceState, Store  # noqa: E402
from exporter.render.exposition import Renderer  # noqa: E402
from exporter.run.daemon import Daemon, Settings  # noqa: E402
from exporter.sources.base import Device  # noqa: E402


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def uid(n: int) -> str:
    return f"{n:08x}-0000-4000-8000-{n:012x}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--procs", type=int, default=10)
    ap.add_argument("--series", type=int, default=150)
    ap.add_argument("--renders", type=int, default=200)
    a = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        proc = Path(tmp)
        (proc / "1").mkdir()
        (proc / "1" / "cgroup").write_text("0::/init.scope\n")
        (proc / "1" / "stat").write_text("1 (systemd) S " + " ".join(["0"] * 50) + "\n")
        e = PodResourcesEnricher({"api": "off", "socket": "/nonexistent", "pid_cache_size": 100000},
                                 procfs=proc)
        st = SourceState(name="nvml")
        pods, metas = [], []
        for g in range(a.gpus):
            gpu_uuid = f"GPU-{g:08x}-0000-0000-0000-000000000000"
            d = Device(key=gpu_uuid, vendor="nvidia", index=str(g), mapping="nvidia.yaml", uuid=gpu_uuid)
            st.devices[gpu_uuid] = d
            frame = st.frames[d.id] = {}
            for i in range(a.series):
                frame[("gpu_memory_used_bytes", (("link", str(i)),))] = float(i)
            for k in range(2):
                n = g * 2 + k
                cid = f"{n:064x}"
                pods.append(PodResources(f"pod-{n}", "ml", (ContainerResources(
                    "main", (ContainerDevices("nvidia.com/gpu", (f"{gpu_uuid}::{k}",)),)),)))
                metas.append(PodMeta(uid(n), "ml", f"pod-{n}", {"app.kubernetes.io/name": f"w{n}"},
                                     containers={cid: "main"}))
                for p in range(a.procs // 2):
                    pid = 10000 + n * 100 + p
                    (proc / str(pid)).mkdir()
                    (proc / str(pid) / "cgroup").write_text(
                        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                        f"{uid(n).replace('-', '_')}.slice/cri-containerd-{cid}.scope\n")
                    (proc / str(pid) / "stat").write_text(f"{pid} (python) S " + " ".join(["7"] * 50) + "\n")
                    frame[("gpu_process_memory_bytes", (("pid", str(pid)), ("process", "python")))] = 1.0
        e._index = build_index(pods, e.resource_names)
        e._by_uid = {m.uid: m for m in metas}
        e._meta = {(m.namespace, m.name): m for m in metas}
        store = Store()
        store.add(st)
        daemon = Daemon(Settings())
        daemon.k8s = e
        renderer = Renderer(load_schema(default_mappings_dir() / "canonical.yaml"))

        daemon._pod_labels(store)
        t0 = cpu()
        resolved = e.resolve_pids()
        cold = cpu() - t0
        for _ in range(3):
            daemon._pod_labels(store)
        t0 = cpu()
        for _ in range(20):
            daemon._pod_labels(store)
            e.resolve_pids()
        warm = (cpu() - t0) / 20

        t0 = cpu()
        for _ in range(a.renders):
            per_device, info = daemon._pod_labels(store)
            renderer.render(store, info, (), per_device)
        with_attr = (cpu() - t0) / a.renders
        t0 = cpu()
        for _ in range(a.renders):
            renderer.render(store, (), (), None)
        without = (cpu() - t0) / a.renders
        text = renderer.render(store, info, (), per_device).text.decode()
        labelled = sum(1 for ln in text.splitlines() if ln.startswith("gpu_process_memory_bytes{") and "pod=" in ln)

    print(f"pod attribution: {a.gpus} GPUs x 2 pods, {st.series_count()} series, {resolved} PIDs "
          f"({labelled} process series labelled)")
    print(f"render: {1e3 * with_attr:.2f} ms CPU with attribution, {1e3 * without:.2f} ms without "
          f"(+{1e3 * (with_attr - without):.2f} ms)")
    print(f"resolve_pids: {1e3 * cold:.2f} ms all new, {1e3 * warm:.2f} ms steady (per {resolved} PIDs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
