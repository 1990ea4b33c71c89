"""The daemon's enrichers and their lifecycle: what they run, when they start and stop, and what
they add to a render.

- The cloud and kubelet enrichers (``enrich.cloud``, ``enrich.kubernetes``; built by
  ``loading.prepare``) run as asyncio tasks, started after the first render (their probes and the
  kubelet connection do not compete with the first polls for the CPU) and again, fresh, after
  every reload.
- The HPC job reader (``enrich.hpc_jobs``, ``enrich/hpc_jobs.py``) reads the prolog's mapping
  directory on a thread of its own: handed the options before the first render (which serves its
  first read), and a reload's options after the reload; stopped with the daemon (and after
  ``--once``).
- A render (``labels``, ``static_labels``) reads only what they cached: no file, no socket.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ..enrich.hpc_jobs import JobReader, job_info
from ..model import Frames, Labels
from ..render.render_cycle import pod_labels

if TYPE_CHECKING:
    from ..enrich.cloud import CloudEnricher
    from ..enrich.kubernetes import PodResourcesEnricher
    from ..enrich.options import HpcJobsOptions
    from ..map.store import Store


class Enrichers:
    def __init__(self) -> None:
        self.jobs = JobReader()
        self._tasks: list[asyncio.Task] = []

    def start_tasks(self, cloud: CloudEnricher | None, k8s: PodResourcesEnricher | None) -> None:
        """(Re)start the cloud and kubelet enrichers' tasks (the running ones are cancelled)."""
        for t in self._tasks:
            t.cancel()
        self._tasks = [asyncio.create_task(e.run(), name=type(e).__name__)
                       for e in (cloud, k8s) if e is not None and e.enabled]

    def read_jobs(self, options: HpcJobsOptions | None) -> None:
        """The HPC job reader follows ``options`` (read at once when new; None: stopped)."""
        self.jobs.configure(options)

    def labels(self, k8s: PodResourcesEnricher | None, store: Store) -> tuple[dict, Frames]:
        """Per-GPU labelers and the gpu_pod_info series, with gpu_job_info and ``hpc_job``."""
        per_device, info = pod_labels(k8s, store)
        return job_info(self.jobs, store, per_device, info)

    @staticmethod
    def static_labels(cloud: CloudEnricher | None, static: Labels) -> Labels:
        """The configured static labels, and the cloud's where the configuration has none of that name."""
        if cloud is None or not cloud.labels():
            return static
        own = {k for k, _ in static}
        return static + tuple(sorted((k, v) for k, v in cloud.labels().items() if k not in own))

    def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        self._tasks = []
        self.jobs.stop()
