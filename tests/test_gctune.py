"""The exporter spaces out the cyclic collector's passes and freezes its long-lived state
(exporter/run/gctune.py).  That is only sound while a poll cycle leaves no cyclic garbage behind:
checked here on the simulated node and on an amdgpu tree with the real gpu_metrics table."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import time
from collections import Counter

from exporter.run import gctune
from exporter.run.daemon import Daemon, Settings
from tests.amd_fixture_tree import REAL_CARDS, arrange_real_card

OTHERS = ("nvml", "dcgm", "amdsmi", "intel", "levelzero", "fdinfo", "upstream", "profiles")


async def _cycles_leave_no_garbage(daemon: Daemon) -> list[str]:
    daemon.load()
    daemon.build_runtimes()
    daemon.build_feed()
    runners = [rt for rt in daemon.runtimes if rt.source is not None]
    assert runners
    try:
        for _ in range(3):  # warm up: plans compiled, rates seeded, windows created
            for rt in runners:
                await rt.poll_once()
            daemon.feed.advance(time.monotonic(), daemon.store)
            await daemon.render()
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(4):
                for rt in runners:
                    await rt.poll_once()
                    if rt.fast_mapper is not None:
                        await rt.worker.submit(lambda rt=rt: rt._fast_cycle(daemon.mappings))
                daemon.feed.advance(time.monotonic(), daemon.store)
                _ = daemon.feed.latest
                await daemon.render()
                _ = daemon.rendered.openmetrics, daemon.rendered.text_gz
            gc.collect()
            garbage = [type(o).__name__ for o in gc.garbage]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    finally:
        for rt in daemon.runtimes:
            await rt.close()
        daemon._render_worker.stop()
        daemon._state_worker.stop()
        daemon._load_worker.stop()
    return garbage


def test_simulated_poll_cycles_leave_no_cyclic_garbage(tmp_path):
    daemon = Daemon(Settings(simulate="demo", state_dir=tmp_path / "state"))
    garbage = asyncio.run(_cycles_leave_no_garbage(daemon))
    assert garbage == [], Counter(garbage).most_common(10)


def test_amdgpu_poll_cycles_leave_no_cyclic_garbage(tmp_path, shared_fixtures):
    table = (shared_fixtures / "amd" / "gpu_metrics_v1_3_rx6900xt_navi21.bin").read_bytes()
    for number, name in enumerate(REAL_CARDS):
        arrange_real_card(tmp_path / "sys", shared_fixtures, name, number, table)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("collectors:\n  amdgpu:\n    options: {pcie_bw: false, keep_open: always}\n")
    daemon = Daemon(Settings(config_path=cfg, sysfs=tmp_path / "sys", state_dir=tmp_path / "state",
                             collectors={**{c: False for c in OTHERS}, "amdgpu": True}))
    garbage = asyncio.run(_cycles_leave_no_garbage(daemon))
    assert garbage == [], Counter(garbage).most_common(10)


def test_the_exporter_process_runs_with_spaced_out_collections():
    """Only the CLI's process is tuned (an embedding process, such as this test run, is not)."""
    assert not gctune._tuned
    code = ("import gc; from exporter.run import gctune; gctune.after_load(); gctune.after_warmup(); "
            "print(gc.get_threshold(), gc.get_freeze_count() > 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.getcwd()}, check=True).stdout.strip()
    assert out == f"{(gctune.GEN0, gctune.GEN1, gctune.GEN2)} True"


def test_after_warmup_does_nothing_in_an_embedding_process():
    before = gc.get_freeze_count()
    gctune.after_warmup()
    assert gc.get_freeze_count() == before
