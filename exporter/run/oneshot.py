"""The one-shot modes: ``--once`` (poll every source, render once, report failures) and
``--list-devices`` (poll every source once, print the GPUs found).  Neither serves: they start
no enricher task and no indicator loop, read the HPC job mapping once (``--once``) and stop
every thread they started before they return."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .daemon import Daemon

log = logging.getLogger("unified_gpu_exporter")


async def run_once(daemon: Daemon, cycles: int = 2) -> tuple[bytes, int]:
    """Poll every source ``cycles`` times (rates need two), render, report failures: the
    exposition and the exit status (1: a source enabled explicitly failed)."""
    daemon._load_once()
    daemon.build_runtimes()
    daemon.build_feed()
    assert daemon.feed is not None
    if daemon.cloud is not None:
        daemon.cloud.apply_static()  # the simulated node's scenario labels; nothing is asked
    daemon.enrichers.read_jobs(daemon.config.enrich.hpc_jobs)
    for i in range(cycles):
        if i:
            await asyncio.sleep(daemon.poll_interval)
        await asyncio.gather(*(daemon.poll_once(rt) for rt in daemon.runtimes))
        daemon.feed.update(time.monotonic(), daemon.store)
    rendered = await daemon.render()
    failed = [rt.state for rt in daemon.runtimes if rt.state.explicit and not rt.stats.up]
    for st in failed:
        log.error("explicitly enabled source failed", extra={"source": st.name, "reason": st.stats.reason})
    await daemon._close_sources(daemon.runtimes)
    daemon.enrichers.stop()
    daemon.otlp.flush()
    daemon.feed.save()
    daemon.stop_workers()
    return rendered.text, (1 if failed else 0)


async def list_devices(daemon: Daemon) -> int:
    """One poll of every source; a line per GPU found (source, vendor, index, model, uuid, PCI
    address); exit status 1 when none is found."""
    daemon.build_runtimes()
    for rt in daemon.runtimes:
        await daemon.poll_once(rt)
    found = daemon.store.info_devices()
    for source, dev in found:
        print(f"{source}\t{dev.vendor}\t{dev.index}\t{dev.model}\t{dev.uuid}\t{dev.pci_bus_id}")
    await daemon._close_sources(daemon.runtimes)
    return 0 if found else 1
