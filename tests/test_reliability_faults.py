"""Faults through the real daemon (and the CLI): lost and returning GPUs, vanishing files, counter
resets, wall-clock jumps, state that must stay bounded while devices come and go.

The hanging / raising / flaky sources and the invalid SIGHUP reload are in test_daemon.py.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path
from typing import ClassVar

import pytest

from exporter import safefile
from exporter.map.schema import default_mappings_dir
from exporter.run.daemon import Daemon, Settings
from exporter.sources import amdgpu_sysfs, registry
from exporter.sources.base import Device, PollResult
from exporter.sources.context import SourceContext
from exporter.sources.drm_fdinfo import DrmFdinfoSource
from exporter.sources.nvml import NvmlSource
from exporter.testing import samples
from tests.amd_fixture_tree import arrange_mi300x_node, mi300x_pci
from tests.fakes import pynvml_fake as pf
from tests.fdinfo_trees import add_card as add_drm_card
from tests.fdinfo_trees import add_fd, some_card
from tests.reliability_util import CHURN_MAPPING, ExporterProcess, mapper_state_size, parse_metrics, pick

HW_COLLECTORS = [n for n in registry.COLLECTORS if n != "simulator"]


def only(*names: str) -> dict[str, bool]:
    """--collector.<name> for ``names``, --no-collector.<name> for every other hardware collector."""
    return {n: n in names for n in HW_COLLECTORS}


def cli_only(*names: str) -> list[str]:
    return [f"--collector.{n}" if n in names else f"--no-collector.{n}" for n in HW_COLLECTORS]


def gpu_series(metrics: dict[str, float], gpu: str) -> dict[str, float]:
    """Canonical series of one GPU, without gpu_info and the exporter's self-metrics."""
    return {k: v for k, v in metrics.items()
            if f'gpu="{gpu}"' in k and not k.startswith(("gpu_info", "unified_gpu_exporter_"))}


async def render(daemon: Daemon) -> dict[str, float]:
    return parse_metrics((await daemon.render()).text.decode())


async def wait_for(cond, timeout: float = 5.0, step: float = 0.02):
    deadline = time.monotonic() + timeout
    while True:
        value = await cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(step)


# ------------------------------------------------------------------------------------------------
# an amdgpu card removed from the sysfs tree while the exporter runs, then put back


def test_amdgpu_card_removed_and_readded_while_the_cli_serves(tmp_path):
    sysfs = tmp_path / "sys"
    devs = arrange_mi300x_node(sysfs, cards=(0, 1, 2))
    parked = tmp_path / "parked"
    with ExporterProcess(["--path.sysfs", str(sysfs), "--path.procfs", str(tmp_path),
                          "--poll.interval", "0.1", *cli_only("amdgpu")], tmp_path) as exp:
        def until(cond, timeout=5.0):
            deadline = time.monotonic() + timeout
            while True:
                m = exp.metrics()
                if cond(m):
                    return m
                assert time.monotonic() < deadline, f"not reached in {timeout}s; last scrape:\n{m}"
                time.sleep(0.05)

        up1 = 'unified_gpu_exporter_device_up{gpu="1",source="amdgpu",uuid="1122334455660001",vendor="amd"}'
        before = until(lambda m: gpu_series(m, "1") and m.get(up1) == 1)
        util1 = 'gpu_compute_utilization_percent{gpu="1",uuid="1122334455660001",vendor="amd"}'
        assert before[util1] == 51
        n_series = len(gpu_series(before, "1"))
        assert n_series > 20

        shutil.move(devs[1], parked)                                  # hot-unplug of card1
        # device_up drops at the next poll; every series of the card (its indicators too, which
        # are computed one cycle later) is gone within a couple of poll cycles
        gone = until(lambda m: m.get(up1) == 0 and gpu_series(m, "1") == {}, timeout=2.0)
        assert gone['unified_gpu_exporter_source_up{source="amdgpu"}'] == 1
        assert gone['unified_gpu_exporter_source_errors_total{kind="device_lost",source="amdgpu"}'] >= 1
        assert gone['gpu_compute_utilization_percent{gpu="0",uuid="1122334455660000",vendor="amd"}'] == 50
        assert gone['gpu_compute_utilization_percent{gpu="2",uuid="1122334455660002",vendor="amd"}'] == 52
        assert len(gpu_series(gone, "0")) > 20 and len(gpu_series(gone, "2")) > 20
        assert pick(gone, "gpu_info", gpu="1"), "the card's identity stays known while it is lost"

        # it comes back with different values: the new ones are served, never the old ones
        (parked / "gpu_busy_percent").write_text("77\n")
        (parked / "mem_info_vram_used").write_text("123456789\n")
        shutil.move(parked, devs[1])
        back = until(lambda m: m.get(up1) == 1 and gpu_series(m, "1"))
        assert back[util1] == 77
        assert back['gpu_memory_used_bytes{gpu="1",uuid="1122334455660001",vendor="amd"}'] == 123456789
        assert len(gpu_series(back, "1")) > 20
        assert back['unified_gpu_exporter_source_up{source="amdgpu"}'] == 1
        rc, elapsed = exp.stop()
    assert rc == 0 and elapsed < 2.0


# ------------------------------------------------------------------------------------------------
# files that vanish between discovery (listdir at open) and the read


def _amd_daemon(sysfs: Path, tmp_path: Path, interval: float = 0.1) -> Daemon:
    return Daemon(Settings(sysfs=sysfs, procfs=tmp_path, poll_interval=interval, collectors=only("amdgpu")))


async def test_amdgpu_files_vanishing_before_the_read_drop_only_their_series(tmp_path, monkeypatch):
    sysfs = tmp_path / "sys"
    devs = arrange_mi300x_node(sysfs, cards=(0, 1))
    vanish: set[str] = set()
    real_reader = amdgpu_sysfs.default_reader

    def racing_reader(path: Path) -> bytes:
        # the kernel removed the attribute (or the whole hwmon dir) after the source listed it
        if path.name in vanish or path.parent.name in vanish or any(
                v in os.path.realpath(path) for v in vanish):
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_reader(path)

    monkeypatch.setattr(amdgpu_sysfs, "default_reader", racing_reader)
    daemon = _amd_daemon(sysfs, tmp_path)
    daemon.load()
    daemon.build_runtimes()
    rt = daemon.runtimes[0]
    try:
        assert await daemon.poll_once(rt)
        full = await render(daemon)
        used0 = 'gpu_memory_used_bytes{gpu="0",uuid="1122334455660000",vendor="amd"}'
        power0 = 'gpu_power_watts{gpu="0",uuid="1122334455660000",vendor="amd"}'
        assert full[used0] == 1024 ** 3 and used0 in full and power0 in full

        vanish.update({"mem_info_vram_used", "hwmon2"})
        assert await daemon.poll_once(rt)
        m = await render(daemon)
        assert used0 not in m, "a vanished file's last value was served again"
        # the power falls back to the gpu_metrics table (curr_socket_power), not to a stale hwmon value
        assert m[power0] == 300
        assert m['unified_gpu_exporter_source_up{source="amdgpu"}'] == 1
        errors = pick(m, "unified_gpu_exporter_source_errors_total", source="amdgpu")
        assert {k: v for k, v in errors.items() if v} == {}  # absent is silent (kinds start at 0)

        # gone for real on disk too, then the whole card directory between is_dir() and the reads
        vanish.clear()
        (devs[0] / "mem_info_vram_used").unlink()
        vanish.add(mi300x_pci(1))
        assert await daemon.poll_once(rt)
        m = await render(daemon)
        assert used0 not in m
        assert gpu_series(m, "1") == {}
        assert m['unified_gpu_exporter_source_up{source="amdgpu"}'] == 1

        (devs[0] / "mem_info_vram_used").write_text("42\n")
        vanish.clear()
        assert await daemon.poll_once(rt)
        m = await render(daemon)
        assert m[used0] == 42
        assert len(gpu_series(m, "1")) == len(gpu_series(full, "1"))
    finally:
        await daemon._close_sources(daemon.runtimes)


AMD_FDINFO = ("pos:\t0\nflags:\t02100002\ndrm-driver:\tamdgpu\ndrm-pdev:\t0000:08:00.0\n"
              "drm-client-id:\t{cid}\ndrm-memory-vram:\t{kib} KiB\ndrm-engine-gfx:\t{ns} ns\n")


def test_fdinfo_process_exiting_between_listdir_and_read(tmp_path, monkeypatch):
    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    add_drm_card(sysfs, 1, "0000:08:00.0")
    for pid in (200, 201, 202):
        add_fd(proc, pid, 5, "/dev/dri/renderD128", AMD_FDINFO.format(cid=pid, kib=pid, ns=0), comm=f"p{pid}")
    exiting: set[str] = set()
    real_read_at = safefile.read_at

    def racing_read_at(dir_fd, name, *args, **kwargs):  # the fdinfo/ folder is held: its pid exits
        parts = os.readlink(f"/proc/self/fd/{dir_fd}").split("/")
        if "fdinfo" in parts and parts[parts.index("fdinfo") - 1] in exiting:
            shutil.rmtree(proc / parts[parts.index("fdinfo") - 1], ignore_errors=True)
        return real_read_at(dir_fd, name, *args, **kwargs)

    monkeypatch.setattr(safefile, "read_at", racing_read_at)
    some_card(sysfs)  # a node with a DRM card (else the source is absent)
    src = DrmFdinfoSource(SourceContext(sysfs=sysfs, procfs=proc, options={"processes": "series"}))
    src.open()
    first = src.poll()
    assert {dict(r.labels)["pid"] for r in first.readings if r.field.startswith("process.")} == {"200", "201", "202"}
    exiting.add("201")
    second = src.poll()
    assert {dict(r.labels)["pid"] for r in second.readings if r.field.startswith("process.")} == {"200", "202"}
    assert not second.errors
    # the fd/ directory vanishing between scandir and open is silent too
    shutil.rmtree(proc / "202" / "fd")
    (proc / "202" / "fdinfo").chmod(0o000) if os.geteuid() else shutil.rmtree(proc / "202" / "fdinfo")
    third = src.poll()
    assert {dict(r.labels)["pid"] for r in third.readings if r.field.startswith("process.")} == {"200"}
    src.close()


# ------------------------------------------------------------------------------------------------
# counters that reset or go backwards


async def test_energy_counter_reset_never_makes_the_exported_counter_decrease(tmp_path):
    sysfs = tmp_path / "sys"
    devs = arrange_mi300x_node(sysfs, cards=(0,))
    energy = devs[0] / "hwmon" / "hwmon2" / "energy1_input"
    daemon = _amd_daemon(sysfs, tmp_path)
    daemon.load()
    daemon.build_runtimes()
    rt = daemon.runtimes[0]
    key = 'gpu_energy_joules_total{gpu="0",uuid="1122334455660000",vendor="amd"}'
    exported = []
    try:
        # microjoules; the driver reload resets the counter to ~0, then it grows again
        for raw in ("5000000000", "6000000000", "1000000", "3000000", "3000000", "4000000"):
            energy.write_text(raw + "\n")
            assert await daemon.poll_once(rt)
            exported.append((await render(daemon)).get(key))
    finally:
        await daemon._close_sources(daemon.runtimes)
    assert exported == [5000.0, 6000.0, 6001.0, 6003.0, 6003.0, 6004.0]


async def test_counter_fallback_between_two_raw_counters_never_goes_backwards(tmp_path, monkeypatch):
    """amdgpu maps energy from hwmon energy1_input first and gpu_metrics energy_accumulator as a
    fallback.  The two count from different origins: when the preferred file fails one poll, the
    exported counter must not jump to the other counter's value (Prometheus would see a reset)."""
    sysfs = tmp_path / "sys"
    devs = arrange_mi300x_node(sysfs, cards=(0,))                        # gpu_metrics: 1000 J
    energy = devs[0] / "hwmon" / "hwmon2" / "energy1_input"
    energy.write_text("5000000000\n")                                    # hwmon: 5000 J
    fail: set[str] = set()
    real_reader = amdgpu_sysfs.default_reader

    def reader(path: Path) -> bytes:
        if path.name in fail:
            raise OSError(5, "Input/output error", str(path))
        return real_reader(path)

    monkeypatch.setattr(amdgpu_sysfs, "default_reader", reader)
    daemon = _amd_daemon(sysfs, tmp_path)
    daemon.load()
    daemon.build_runtimes()
    rt = daemon.runtimes[0]
    key = 'gpu_energy_joules_total{gpu="0",uuid="1122334455660000",vendor="amd"}'
    exported = []
    try:
        for failing in (False, True, False):
            fail.clear()
            if failing:
                fail.add("energy1_input")
            assert await daemon.poll_once(rt)
            exported.append((await render(daemon)).get(key))
    finally:
        await daemon._close_sources(daemon.runtimes)
    assert exported[0] == 5000.0
    values = [v for v in exported if v is not None]
    assert values == sorted(values), f"exported energy went backwards: {exported}"


class ScriptedSource:
    """One device whose raw counters follow ``SCRIPT`` (one entry per poll)."""

    name: ClassVar[str] = "scripted"
    SCRIPT: ClassVar[list[dict[str, float]]] = []

    def __init__(self, context=None):  # a SourceContext
        self.polls = 0

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def poll(self) -> PollResult:
        dev = Device(key="0000:01:00.0", vendor="nvidia", index="0", mapping="churn", uuid="GPU-S-0")
        s = PollResult(devices=[dev], monotonic=1000.0 + self.polls)           # 1 s apart
        for k, v in self.SCRIPT[self.polls].items():
            s.add(dev.key, k, v)
        self.polls += 1
        return s


@pytest.fixture
def churn_mappings(tmp_path):
    d = tmp_path / "mappings"
    d.mkdir()
    shutil.copy(default_mappings_dir() / "canonical.yaml", d)
    (d / "churn.yaml").write_text(CHURN_MAPPING)
    return d


@pytest.fixture
def test_collectors(monkeypatch):
    for name, module, cls in [("scripted", __name__, "ScriptedSource"),
                              ("churn", "tests.reliability_util", "ChurnSource"),
                              ("fakenvml", __name__, "FakeNvmlSource")]:
        monkeypatch.setitem(registry.COLLECTORS, name, registry.Collector(name, module, cls, False, name))


async def test_rate_of_a_counter_going_backwards_skips_one_poll(tmp_path, churn_mappings, test_collectors):
    ScriptedSource.SCRIPT = [{"busy_ms": v, "energy_mj": e} for v, e in
                             [(0, 1000), (500, 2000), (1000, 3000), (200, 50), (700, 1050), (1200, 2050)]]
    daemon = Daemon(Settings(mappings_dir=churn_mappings, collectors={**only(), "scripted": True},
                             sysfs=tmp_path, procfs=tmp_path, poll_interval=1.0))
    daemon.load()
    daemon.build_runtimes()
    rt = daemon.runtimes[0]
    bw, energy = [], []
    for _ in ScriptedSource.SCRIPT:
        assert await daemon.poll_once(rt)
        m = await render(daemon)
        bw.append(m.get('gpu_memory_bandwidth_utilization_percent{gpu="0",uuid="GPU-S-0",vendor="nvidia"}'))
        energy.append(m.get('gpu_energy_joules_total{gpu="0",uuid="GPU-S-0",vendor="nvidia"}'))
    await daemon._close_sources(daemon.runtimes)
    # first poll: no rate yet; the reset poll: no rate (never a negative or huge spike)
    assert bw == [None, 50.0, 50.0, None, 50.0, 50.0]
    assert energy == pytest.approx([1.0, 2.0, 3.0, 3.05, 4.05, 5.05])


async def test_counter_missing_for_one_poll_keeps_its_reset_offset(tmp_path, churn_mappings, test_collectors):
    """A counter that was reset once (offset folded in) and then misses a single poll (a transient
    read error, a malformed value) must continue from its running total, not restart at the raw
    value: otherwise the exported counter falls from 3.05 J to 1.05 J."""
    ScriptedSource.SCRIPT = [{"energy_mj": 1000}, {"energy_mj": 2000}, {"energy_mj": 3000},
                             {"energy_mj": 50}, {}, {"energy_mj": 1050}]
    daemon = Daemon(Settings(mappings_dir=churn_mappings, collectors={**only(), "scripted": True},
                             sysfs=tmp_path, procfs=tmp_path, poll_interval=1.0))
    daemon.load()
    daemon.build_runtimes()
    rt = daemon.runtimes[0]
    energy = []
    for _ in ScriptedSource.SCRIPT:
        assert await daemon.poll_once(rt)
        energy.append((await render(daemon)).get('gpu_energy_joules_total{gpu="0",uuid="GPU-S-0",vendor="nvidia"}'))
    await daemon._close_sources(daemon.runtimes)
    assert energy[:5] == pytest.approx([1.0, 2.0, 3.0, 3.05, None])
    assert energy[5] == pytest.approx(4.05), f"exported energy went backwards after one missed poll: {energy}"


# ------------------------------------------------------------------------------------------------
# NVML GpuIsLost through the daemon (the source-level behaviour is in test_nvml_source.py)

FAKE_NVML: list = []


class FakeNvmlSource(NvmlSource):
    name: ClassVar[str] = "fakenvml"

    def __init__(self, context):
        super().__init__(context, module=FAKE_NVML[0])


async def test_nvml_gpu_is_lost_and_recovers_through_the_daemon(tmp_path, test_collectors):
    fake = pf.make_module([pf.h100(0), pf.t4(1)])
    FAKE_NVML[:] = [fake]
    conf = tmp_path / "config.yaml"
    conf.write_text("collectors:\n  fakenvml: {options: {xid: false}}\n")
    daemon = Daemon(Settings(config_path=conf, collectors={**only(), "fakenvml": True},
                             sysfs=tmp_path, procfs=tmp_path, poll_interval=1.0))
    daemon.load()
    daemon.build_runtimes()
    rt = daemon.runtimes[0]
    h100 = "GPU-h1000000-0000-0000-0000-000000000000"
    up0 = f'unified_gpu_exporter_device_up{{gpu="0",source="fakenvml",uuid="{h100}",vendor="nvidia"}}'
    energy0 = f'gpu_energy_joules_total{{gpu="0",uuid="{h100}",vendor="nvidia"}}'

    async def cycle() -> dict[str, float]:
        assert await daemon.poll_once(rt)
        fake.fake_advance(1.0)
        return await render(daemon)

    try:
        await cycle()
        ok = await cycle()
        assert ok[up0] == 1 and len(gpu_series(ok, "0")) > 10
        fake.fake_lose(0)
        lost = await cycle()
        assert lost[up0] == 0
        assert gpu_series(lost, "0") == {}, "a lost GPU's series are served stale"
        assert len(gpu_series(lost, "1")) == len(gpu_series(ok, "1"))
        assert lost['unified_gpu_exporter_source_up{source="fakenvml"}'] == 1
        assert lost['unified_gpu_exporter_source_errors_total{kind="device_lost",source="fakenvml"}'] == 1
        still = await cycle()
        assert still[up0] == 0 and gpu_series(still, "0") == {}
        assert still['unified_gpu_exporter_source_errors_total{kind="device_lost",source="fakenvml"}'] == 1
        fake.fake_recover(0)
        back = await cycle()
        assert back[up0] == 1 and gpu_series(back, "0")
        assert back[energy0] >= ok[energy0], "energy went backwards across the loss"
    finally:
        await daemon._close_sources(daemon.runtimes)


# ------------------------------------------------------------------------------------------------
# wall-clock jumps: scheduling and windows use monotonic time; only timestamps follow the wall clock


async def test_wall_clock_jumps_do_not_disturb_polling_counters_or_indicators(tmp_path, monkeypatch):
    sysfs = tmp_path / "sys"
    devs = arrange_mi300x_node(sysfs, cards=(0, 1))
    energy = devs[0] / "hwmon" / "hwmon2" / "energy1_input"
    energy.write_text("1000000\n")
    real_time = time.time
    offset = [0.0]
    monkeypatch.setattr(time, "time", lambda: real_time() + offset[0])
    daemon = _amd_daemon(sysfs, tmp_path, interval=0.05)
    await daemon.start()
    history: list[dict[str, float]] = []
    try:
        for jump in (0.0, 86400.0 * 365, -86400.0 * 365 * 2, 0.0):
            offset[0] = jump
            tmp = energy.with_name("energy1_input.tmp")          # atomic, as sysfs reads are
            tmp.write_text(f"{int(energy.read_text()) + 1000000}\n")
            os.replace(tmp, energy)
            polls_before = daemon.store.sources["amdgpu"].stats.polls
            await asyncio.sleep(0.4)
            m = await render(daemon)
            history.append(m)
            st = daemon.store.sources["amdgpu"]
            assert st.stats.polls - polls_before >= 5, f"polling stalled after a {jump:+.0f}s wall-clock jump"
            assert m['unified_gpu_exporter_source_up{source="amdgpu"}'] == 1
            errors = pick(m, "unified_gpu_exporter_source_errors_total", source="amdgpu")
            assert not {k: v for k, v in errors.items() if v}
            ts = m['unified_gpu_exporter_source_last_success_timestamp_seconds{source="amdgpu"}']
            assert abs(ts - time.time()) < 2.0      # a unix timestamp follows the wall clock
            assert pick(m, "gpu_compute_utilization_percent")
    finally:
        await daemon.stop()
    # counters (energy, contention seconds, ...) never decrease across the jumps
    for prev, cur in zip(history, history[1:], strict=False):
        for k, v in prev.items():
            name = k.split("{", 1)[0]
            if name.endswith("_total") and not name.startswith("unified_gpu_exporter_") and k in cur:
                assert cur[k] >= v, f"{k} went from {v} to {cur[k]} across a wall-clock jump"
    key = 'gpu_energy_joules_total{gpu="0",uuid="1122334455660000",vendor="amd"}'
    assert [h[key] for h in history] == [2.0, 3.0, 4.0, 5.0]
    indicator = [k for k in history[-1] if k.startswith("gpu_memory_contention")]
    assert indicator, "the contention indicators stopped after the clock jumps"


async def test_fast_sampling_never_marks_a_healthy_source_down(tmp_path):
    """The fast loop (poll_fast, for the indicators) and the full poll share one worker.  A full
    poll that comes due while a fast call is running must wait for it, not report the source
    down with "previous call still running" (which also drops all its series for a cycle)."""
    # fast ticks closer together than full polls (a tick right after a full poll is skipped)
    daemon = Daemon(Settings(simulate="demo", poll_interval=0.05, fast_interval=0.02,
                             collectors=only(), sysfs=tmp_path, procfs=tmp_path))
    await daemon.start()
    down = []
    try:
        for _ in range(150):
            await asyncio.sleep(0.01)
            st = daemon.store.sources["simulator"]
            if st.stats.polls and not st.stats.up:
                down.append(st.stats.reason)
        errors = dict(daemon.store.sources["simulator"].stats.errors)
    finally:
        await daemon.stop()
    assert not down and not errors, f"healthy source reported down {len(down)}x: {down[:1]}, errors {errors}"


# ------------------------------------------------------------------------------------------------
# bounded memory while devices and labels come and go


async def test_mapper_and_store_state_stay_bounded_under_device_churn(tmp_path, churn_mappings, test_collectors):
    daemon = Daemon(Settings(mappings_dir=churn_mappings, collectors={**only(), "churn": True},
                             sysfs=tmp_path, procfs=tmp_path, poll_interval=1.0))
    daemon.load()
    daemon.build_runtimes()
    rt = daemon.runtimes[0]
    sizes = []
    for i in range(1500):
        assert await daemon.poll_once(rt)
        if i % 100 == 99:
            rendered = await daemon.render()
            sizes.append((mapper_state_size(rt.mapper), len(rt.state.devices), rt.state.series_count(),
                          len(rt.stats.errors), rendered.series))
    await daemon._close_sources(daemon.runtimes)
    # live: 4 devices x (energy, busy rate, 2 link counters) = 16 counter states; state of series
    # that went away may be kept for a grace period, but it must not grow with the number of polls
    # (unbounded: ~1000 device ids x 2 counters + x 50 link labels, over 10000 entries here)
    assert max(s[0] for s in sizes[8:]) <= 1.25 * max(s[0] for s in sizes[:8]), sizes
    assert max(s[0] for s in sizes) < 4000, sizes
    assert all(s[1] == 4 for s in sizes), sizes
    assert max(s[2] for s in sizes) <= 4 * 5
    assert max(s[4] for s in sizes) - min(s[4] for s in sizes) <= 8, sizes


async def test_flapping_cards_keep_every_internal_table_the_same_size(tmp_path):
    """The realistic churn: the same cards lost and found again for many cycles (daemon, mapper,
    store, indicator feed): nothing grows with the number of cycles."""
    sysfs = tmp_path / "sys"
    devs = arrange_mi300x_node(sysfs, cards=(0, 1, 2, 3))
    parked = tmp_path / "parked"
    parked.mkdir()
    daemon = _amd_daemon(sysfs, tmp_path)
    daemon.load()
    daemon.build_runtimes()
    daemon.build_feed()
    rt = daemon.runtimes[0]

    def sizes() -> tuple:
        feed = daemon.feed
        eng = feed.engine
        return (mapper_state_size(rt.mapper), len(rt.state.devices), len(rt.stats.errors),
                sum(len(cached[2]) for cached in feed._by_source.values()), len(feed._known), len(eng._devices))

    seen = []
    latest_sizes: list[int] = []
    latest_keys: set = set()
    try:
        for i in range(300):
            card = (i // 2) % 4
            if i % 2:
                shutil.move(parked / mi300x_pci(card), devs[card])
            else:
                shutil.move(devs[card], parked / mi300x_pci(card))
            assert await daemon.poll_once(rt)
            daemon.feed.update(time.monotonic(), daemon.store)
            if i >= 8 and i % 8 == 0:
                seen.append(sizes())
                latest = samples(daemon.feed.latest)
                latest_sizes.append(len(latest))
                latest_keys.update((name, labels) for name, labels, _ in latest)
    finally:
        await daemon._close_sources(daemon.runtimes)
    assert len(set(seen)) == 1, f"internal state grew while cards flapped: {seen[0]} -> {seen[-1]}"
    # the indicator output legitimately gains series as its windows fill (after about a second),
    # so it is bounded, not constant: every series ever served belongs to one of the 4 cards'
    # fixed set (3 cards are present at each check, so the union is at most 4/3 of the largest
    # output; a table that leaked keys per cycle would exceed it many times over 36 checks)
    assert latest_sizes and max(latest_sizes) > 0
    assert len(latest_keys) <= 4 * max(latest_sizes) / 3 + 1, (len(latest_keys), latest_sizes)
    assert len({dict(labels)["gpu"] for _, labels in latest_keys}) <= 4
