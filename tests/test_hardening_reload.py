"""Issue 20, reload: one at a time (SIGHUPs coalesced), loaded off the event loop, every failure
reported, learned state and counters carried across reloads with or without --state.dir."""

from __future__ import annotations

import asyncio
import threading

from exporter.run.daemon import Daemon
from exporter.testing import flat
from tests.test_daemon import mappings_dir, settings, test_collectors  # noqa: F401 - fixtures


async def test_overlapping_sighups_are_coalesced(mappings_dir, tmp_path, test_collectors):  # noqa: F811
    daemon = Daemon(settings(mappings_dir, tmp_path, ["good"], config="labels: {node: a}\n"))
    await daemon.start()
    loads = 0
    release = threading.Event()
    real = daemon._prepare

    def slow_prepare():
        nonlocal loads
        loads += 1
        release.wait(10)
        return real()
    daemon._prepare = slow_prepare  # type: ignore[method-assign]
    threads_before = threading.active_count()
    try:
        for _ in range(40):  # 40 SIGHUPs while the first reload is still loading
            daemon.request_reload()
        await asyncio.sleep(0.05)
        assert loads == 1
        assert threading.active_count() <= threads_before + 2
        release.set()
        while daemon._reload_task is not None and not daemon._reload_task.done():
            await asyncio.sleep(0.01)
        assert loads == 2  # the 39 later ones became one more reload, not 39
        assert daemon.renderer.reload_ok
    finally:
        release.set()
        await daemon.stop()


def _hold_prepare(daemon: Daemon) -> tuple[threading.Event, threading.Event]:
    """Make the daemon's next file load wait: ``entered`` is set once it runs, ``release`` lets it go."""
    entered, release = threading.Event(), threading.Event()
    real = daemon._prepare

    def blocking_prepare():
        entered.set()
        release.wait(10)
        return real()
    daemon._prepare = blocking_prepare  # type: ignore[method-assign]
    return entered, release


async def test_reload_loads_off_the_event_loop(mappings_dir, tmp_path, test_collectors):  # noqa: F811
    daemon = Daemon(settings(mappings_dir, tmp_path, ["good"], config="labels: {node: a}\n"))
    await daemon.start()
    entered, release = _hold_prepare(daemon)
    try:
        task = daemon.request_reload()
        while not entered.is_set():
            await asyncio.sleep(0.01)
        ticks = 0
        for _ in range(5):  # the loop keeps running while the file is being loaded
            await asyncio.sleep(0.01)
            ticks += 1
        assert ticks == 5 and not task.done()
        release.set()
        await asyncio.wait_for(task, 10)
    finally:
        release.set()
        await daemon.stop()


async def test_any_reload_failure_is_reported(mappings_dir, tmp_path, test_collectors):  # noqa: F811
    daemon = Daemon(settings(mappings_dir, tmp_path, ["good"], config="labels: {node: a}\n"))
    await daemon.start()
    try:
        def broken():
            raise MemoryError("simulated")
        daemon._prepare = broken  # type: ignore[method-assign]
        assert not await daemon.reload()
        text = (await daemon.render()).text.decode()
        assert "unified_gpu_exporter_config_last_reload_successful 0.0" in text
        assert daemon.config.labels == {"node": "a"}
        del daemon._prepare
        (mappings_dir / "broken.yaml").write_text("vendor: nvidia\nfields: [{raw: x, metric: nope}]\n")
        assert not await daemon.reload()  # a mapping error, not the config file
        (mappings_dir / "broken.yaml").unlink()
        assert await daemon.reload()
        assert daemon.renderer.reload_ok
    finally:
        await daemon.stop()


async def test_reload_keeps_baselines_and_counters_without_state_dir(  # noqa: F811
        mappings_dir, tmp_path, test_collectors):  # noqa: F811
    daemon = Daemon(settings(mappings_dir, tmp_path, ["good"], config="labels: {node: a}\n"))
    await daemon.start()
    try:
        assert daemon.settings.state_dir is None
        engine = daemon.feed.engine
        dev = ("nvidia", "0", "GPU-X")
        engine._baseline("GPU-X", "bandwidth").learn(50.0, 120.0)
        engine.baselines.set_flag("GPU-X", "bandwidth", True)
        engine._state(dev).contention_seconds["bandwidth"] = 42.0
        engine._state(dev).cost_dollars = 1.5
        assert await daemon.reload()
        new = daemon.feed.engine
        assert new is not engine
        assert new.baselines.peek("GPU-X", "bandwidth").learned_seconds == 120.0
        assert new.baselines.was_flagged("GPU-X", "bandwidth")  # a raised flag is not re-learned
        assert new._devices[dev].contention_seconds["bandwidth"] == 42.0  # a counter never goes back
        assert new._devices[dev].cost_dollars == 1.5
    finally:
        await daemon.stop()


def test_deeply_nested_state_file_is_set_aside_and_stale_tmp_removed(tmp_path):
    from exporter.indicators.baseline import BaselineStore
    from exporter.run.baseline_file import STATE_FILE, BaselineFile
    (tmp_path / STATE_FILE).write_text("[" * 200_000 + "]" * 200_000)
    stale = tmp_path / f".{STATE_FILE}.abc123.tmp"
    stale.write_text("half a write")
    store, file = BaselineStore(), BaselineFile(tmp_path)
    assert file.load(store) is False  # no RecursionError: starts fresh
    assert (tmp_path / (STATE_FILE + ".corrupt")).exists()
    assert not stale.exists()
    assert file.save(store) and file.load(store)


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads line")


def test_forty_sighups_in_a_burst_leave_no_threads_behind(tmp_path):
    import signal
    import time

    from tests.reliability_util import ExporterProcess
    cfg = tmp_path / "c.yaml"
    cfg.write_text("labels: {node: a}\n")
    exp = ExporterProcess(["--simulate", "--config.file", str(cfg)], tmp_path)
    try:
        before = _threads(exp.pid)
        for _ in range(40):
            exp.send(signal.SIGHUP)
        deadline = time.monotonic() + 30
        ok = None
        while time.monotonic() < deadline:  # wait for the (coalesced) reloads to finish
            m = exp.metrics()
            ok = m.get("unified_gpu_exporter_config_last_reload_successful")
            if ok == 1.0 and "reloaded" in exp.log() and _threads(exp.pid) <= before + 2:
                break
            time.sleep(0.1)
        assert ok == 1.0
        assert _threads(exp.pid) <= before + 2, (before, _threads(exp.pid))
        assert exp.log().count("configuration reloaded") <= 3  # coalesced, not 40
        assert exp.proc.poll() is None
    finally:
        exp.stop()


async def test_counter_never_goes_back_across_reload(mappings_dir, tmp_path, test_collectors):  # noqa: F811
    daemon = Daemon(settings(mappings_dir, tmp_path, ["good"], config="labels: {node: a}\n"))
    await daemon.start()

    def energy() -> float:
        st = daemon.store.sources["good"]
        return next(v for (n, _), v in flat(st.frames).items() if n == "gpu_energy_joules_total")
    try:
        while daemon.store.sources["good"].stats.polls < 4:
            await asyncio.sleep(0.02)
        before = energy()
        assert before >= 4.0
        assert await daemon.reload()  # a new source object: its raw counter starts again at 1 J
        polls = daemon.store.sources["good"].stats.polls
        while daemon.store.sources["good"].stats.polls < polls + 2:
            await asyncio.sleep(0.02)
        assert energy() >= before
    finally:
        await daemon.stop()


async def test_stop_during_a_reload_does_not_restart_sources(mappings_dir, tmp_path, test_collectors):  # noqa: F811
    daemon = Daemon(settings(mappings_dir, tmp_path, ["good"], config="labels: {node: a}\n"))
    await daemon.start()
    entered, release = _hold_prepare(daemon)
    task = daemon.request_reload()
    while not entered.is_set():
        await asyncio.sleep(0.01)
    await daemon.stop()
    release.set()
    assert task.done()
    await asyncio.sleep(0.05)
    assert not daemon._tasks  # nothing polling after stop()
