"""Fast sampling on demand (issue 35): the indicators sample at the fast interval, and the fast polls
that feed them run, only while a GPU is near contention (``IndicatorFeed.wants_fast``); a calm
node steps the indicators once per full poll and runs no fast poll."""

from __future__ import annotations

import asyncio
import collections
import time

import pytest

from exporter.indicators import IndicatorConfig
from exporter.map.store import SourceState, Store
from exporter.run.daemon import Daemon, Settings
from exporter.run.feed import CALM_INTERVAL, FAST_HOLD_SECONDS, IndicatorFeed
from exporter.run.periodic import Ticker
from exporter.run.reload_carry import carry_indicator_state
from exporter.simulate import SimulatorSource
from tests.amd_fixture_tree import arrange_mi300x_node

OTHERS = ("nvml", "dcgm", "amdsmi", "intel", "levelzero", "fdinfo", "upstream", "profiles")
DEV = ("amd", "0", "GPU-calm")
BW = "gpu_memory_bandwidth_utilization_percent"


def _feed(**contention) -> tuple[IndicatorFeed, Store, SourceState]:
    config = IndicatorConfig(contention=contention) if contention else IndicatorConfig()
    feed = IndicatorFeed(config, None, 0.5, full_interval=1.0)
    store, state = Store(), SourceState("amdgpu")
    store.add(state)
    return feed, store, state


def _set(state: SourceState, bandwidth: float | None) -> None:
    frame = {("gpu_compute_utilization_percent", ()): 40.0}
    if bandwidth is not None:
        frame[(BW, ())] = bandwidth
    state.frames = {DEV: frame}  # a new full poll (a new frames object)


def test_a_calm_gpu_wants_no_fast_sampling_one_moving_memory_does_for_the_hold():
    feed, store, state = _feed()
    _set(state, 20.0)
    feed.advance(100.0, store)
    assert not feed.wants_fast(100.0)
    _set(state, 49.9)
    feed.advance(101.0, store)
    assert not feed.wants_fast(101.0)
    _set(state, 50.0)  # at the bar
    feed.advance(102.0, store)
    assert feed.wants_fast(102.0)
    _set(state, 3.0)  # calm again: fast sampling holds
    feed.advance(103.0, store)
    assert feed.wants_fast(102.0 + FAST_HOLD_SECONDS - 0.01)
    assert not feed.wants_fast(102.0 + FAST_HOLD_SECONDS)


def test_a_gpu_without_a_bandwidth_signal_is_calm_unless_its_state_is_near_contention(monkeypatch):
    feed, store, state = _feed()
    _set(state, None)
    feed.advance(10.0, store)
    assert not feed.wants_fast(10.0)
    for near in ("contended", "memory_bound", "shared"):
        monkeypatch.setattr(feed.engine, "state", lambda dev, near=near: near)
        feed.fast_until = 0.0
        feed.advance(11.0, store)
        assert feed.wants_fast(11.0), near
    for calm in ("idle", "healthy", "throttled", "unknown", None):
        monkeypatch.setattr(feed.engine, "state", lambda dev, calm=calm: calm)
        feed.fast_until = 0.0
        feed.advance(12.0, store)
        assert not feed.wants_fast(12.0), calm


def test_a_mig_instance_moving_memory_turns_fast_sampling_on():
    """In MIG mode the bandwidth is on the instances' series only (nvml.yaml label_map)."""
    feed, store, state = _feed()
    state.frames = {DEV: {("gpu_compute_utilization_percent", ()): 40.0,
                          (BW, (("gpu_instance", "1"), ("mig_profile", "1g.18gb"))): 20.0,
                          (BW, (("gpu_instance", "2"), ("mig_profile", "3g.71gb"))): 20.0}}
    feed.advance(1.0, store)
    assert not feed.wants_fast(1.0)
    state.frames = {DEV: {("gpu_compute_utilization_percent", ()): 40.0,
                          (BW, (("gpu_instance", "1"), ("mig_profile", "1g.18gb"))): 20.0,
                          (BW, (("gpu_instance", "2"), ("mig_profile", "3g.71gb"))): 65.0}}
    feed.advance(2.0, store)
    assert feed.wants_fast(2.0)


def test_a_step_after_a_stall_books_at_most_two_calm_intervals():
    feed, store, state = _feed()
    assert feed.engine._max_dt == 2.0  # two calm intervals (1 s), whatever the full poll's
    slow = IndicatorFeed(IndicatorConfig(), None, 0.5, full_interval=15.0)
    assert slow.engine._max_dt == 2.0
    quick = IndicatorFeed(IndicatorConfig(), None, 0.1, full_interval=0.25)
    assert quick.engine._max_dt == 0.5


def test_a_bar_of_zero_samples_fast_always():
    feed, store, state = _feed(fast_bandwidth_percent=0)
    assert feed.wants_fast(0.0)
    _set(state, None)
    feed.advance(1.0, store)
    assert feed.wants_fast(1e9)
    assert all(feed.due(0.5 * i, 7) for i in range(10))  # every fast tick, the store unchanged


def test_a_calm_node_steps_once_per_full_poll():
    feed, store, state = _feed()
    _set(state, 10.0)
    assert feed.due(0.0, store.version)
    feed.advance(0.0, store)
    assert not feed.due(0.5, store.version)  # nothing new
    store.touch()
    assert not feed.due(0.6, store.version)  # new, but too soon after the last step
    assert feed.due(0.95, store.version)
    store.touch()  # a second source's poll of the same round
    assert not feed.due(1.2, store.version)
    assert feed.due(1.9, store.version)
    assert not feed.due(2.9, store.version)  # no poll since
    assert feed.due(3.85, store.version)  # a late poll: a step after two intervals, whatever changed


def test_a_calm_loop_waits_for_a_poll_no_longer_than_the_step_it_would_take_without_one():
    """``calm_wait``: a whole step after the last one once the store changed (a poll out of phase
    is stepped with the next round), 1.9 steps without a change (as ``due``); None while sampling
    fast (every fast tick)."""
    feed, store, state = _feed()
    _set(state, 10.0)
    assert feed.due(0.0, store.version)
    feed.advance(0.0, store)
    assert feed.calm_wait(0.25, store.version) == pytest.approx(1.9 - 0.25)  # no poll yet
    assert not feed.due(0.25 + feed.calm_wait(0.25, store.version) - 0.01, store.version)
    store.touch()
    assert feed.calm_wait(0.25, store.version) == pytest.approx(1.0 - 0.25)  # a poll out of phase
    assert feed.due(0.25 + feed.calm_wait(0.25, store.version), store.version)
    feed.fast_until = 1e9
    assert feed.calm_wait(5.0, store.version) is None


def test_where_full_polls_are_slower_than_a_second_a_calm_node_samples_once_a_second():
    feed = IndicatorFeed(IndicatorConfig(), None, 0.25, full_interval=15.0)
    assert feed.sampling_interval(0.0) == CALM_INTERVAL == 1.0
    # fast ticks over 10 s, no full poll, a fast poll's values once a second (the runner's rule)
    steps = [t / 4 for t in range(40) if feed.due(t / 4, t // 4)]
    assert steps == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0], steps
    feed.fast_until = 1e9  # near contention: every fast tick
    assert feed.sampling_interval(0.0) == 0.25
    slow = IndicatorFeed(IndicatorConfig(), None, 2.0, full_interval=15.0)  # a fast interval above 1 s
    assert slow.sampling_interval(0.0) == 2.0


def test_a_reload_keeps_fast_sampling_on_for_its_hold_and_a_bar_of_zero_stays_always():
    old, store, state = _feed()
    _set(state, 80.0)
    old.advance(50.0, store)
    new, _, _ = _feed()
    carry_indicator_state(old, new)
    assert new.wants_fast(50.0 + FAST_HOLD_SECONDS - 1)
    always, _, _ = _feed(fast_bandwidth_percent=0)
    carry_indicator_state(old, always)
    assert always.wants_fast(1e9)
    back, _, _ = _feed()
    carry_indicator_state(always, back)
    assert not back.wants_fast(0.0)


async def _run(tmp_path, monkeypatch, phase: str, every: float = 0.4, fast_every: float = 0.1,
               polls: int = 10, config=None) -> tuple[int, int, int]:
    """(full polls, fast polls, indicator steps) of a daemon on the demo held in ``phase``."""
    counts = {"full": 0, "fast": 0, "steps": 0}
    real_poll, real_fast, real_advance = SimulatorSource.poll, SimulatorSource.poll_fast, IndicatorFeed.advance

    def poll(self):
        counts["full"] += 1
        return real_poll(self)

    def poll_fast(self):
        counts["fast"] += 1
        return real_fast(self)

    def advance(self, now, store):
        counts["steps"] += 1
        return real_advance(self, now, store)

    monkeypatch.setattr(SimulatorSource, "poll", poll)
    monkeypatch.setattr(SimulatorSource, "poll_fast", poll_fast)
    monkeypatch.setattr(IndicatorFeed, "advance", advance)
    daemon = Daemon(Settings(simulate="demo", simulate_phase=phase, poll_interval=every, fast_interval=fast_every,
                             state_dir=tmp_path / "state", collectors={c: False for c in OTHERS},
                             config_path=config))
    await daemon.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and counts["full"] < polls:
            await asyncio.sleep(0.05)
    finally:
        await daemon.stop()
    return counts["full"], counts["fast"], counts["steps"]


async def test_a_calm_daemon_runs_no_fast_poll_and_steps_the_indicators_with_its_full_polls(tmp_path, monkeypatch):
    full, fast, steps = await _run(tmp_path, monkeypatch, "idle")
    assert full >= 10
    assert fast == 0
    # once per full poll (a poll late by more than its interval adds one); every fast tick would be ~4 per poll
    assert 1 <= steps <= 1.5 * full + 2, (full, steps)


async def test_a_calm_daemon_with_slow_full_polls_fast_polls_once_a_second(tmp_path, monkeypatch):
    t0 = time.monotonic()
    full, fast, steps = await _run(tmp_path, monkeypatch, "idle", every=2.5, fast_every=0.1, polls=3)
    elapsed = time.monotonic() - t0
    assert full >= 3
    # a sample a second between full polls 2.5 s apart, not one every 0.1 s
    assert 1 <= fast <= elapsed / 0.9 + 1, (full, fast, elapsed)
    assert steps <= elapsed / 0.9 + 2, (steps, elapsed)


async def test_a_source_polled_slower_than_the_daemon_fast_polls_once_a_second_on_a_calm_node(
        tmp_path, monkeypatch):
    """A collector's own ``interval`` (3 s) above the global poll interval (1 s): its fast polls
    come once a second and each one is stepped (none polled for nothing)."""
    conf = tmp_path / "c.yaml"
    conf.write_text("collectors:\n  simulator:\n    interval: 2.5s\n")
    t0 = time.monotonic()
    full, fast, steps = await _run(tmp_path, monkeypatch, "idle", every=1.0, fast_every=0.1, polls=3,
                                   config=conf)
    elapsed = time.monotonic() - t0
    assert 1 <= fast <= elapsed / 0.9 + 1, (full, fast, elapsed)
    assert steps >= fast - 1, (steps, fast)  # each fast poll's values stepped (two close changes: one step)
    assert steps <= elapsed / 0.9 + 2, (steps, elapsed)


async def test_a_calm_daemon_wakes_for_its_polls_not_for_fast_ticks(tmp_path, monkeypatch):
    """Calm: the fast loops wait for a GPU near contention and the indicator loop for the polls;
    neither wakes at the fast ticks (4 a poll here) to find nothing to do."""
    ticks: collections.Counter[str] = collections.Counter()
    real = Ticker.__call__

    async def counting(self):
        ticks[asyncio.current_task().get_name()] += 1
        return await real(self)

    monkeypatch.setattr(Ticker, "__call__", counting)
    full, fast, steps = await _run(tmp_path, monkeypatch, "idle")
    assert full >= 10 and steps >= 5
    assert {k: v for k, v in ticks.items() if k.startswith("fast-") or k == "indicators"} == {}, ticks
    assert ticks["source-simulator"] >= full - 2  # the full polls' own ticker still runs


async def test_a_calm_daemon_with_two_sources_steps_right_after_each_round_of_polls(tmp_path, monkeypatch):
    """Two sources (the simulator and amdgpu on a fixture tree, calm): a step waits for the
    round's other poll, so each step has both sources' values of the round (stepping at the
    first publish leaves the other's a round old; stepping 0.9 of an interval after the last
    step drifts ahead of the rounds)."""
    sysfs = tmp_path / "sys"
    arrange_mi300x_node(sysfs)
    for f in sysfs.glob("class/drm/card*/device/*_busy_percent"):
        f.write_text("5\n")  # calm: well below fast_bandwidth_percent
    published: dict[str, list[float]] = collections.defaultdict(list)
    stepped: list[float] = []
    real_polled, real_advance = Daemon._polled_one, IndicatorFeed.advance

    def polled(self, name):
        published[name].append(time.monotonic())
        return real_polled(self, name)

    def advance(self, now, store):
        stepped.append(time.monotonic())
        return real_advance(self, now, store)

    monkeypatch.setattr(Daemon, "_polled_one", polled)
    monkeypatch.setattr(IndicatorFeed, "advance", advance)
    daemon = Daemon(Settings(simulate="demo", simulate_phase="idle", poll_interval=0.4, fast_interval=0.1,
                             state_dir=tmp_path / "state", sysfs=sysfs,
                             collectors={**{c: False for c in OTHERS}, "amdgpu": True}))
    await daemon.start()
    try:
        assert {rt.state.name for rt in daemon.runtimes} >= {"simulator", "amdgpu"}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(stepped) < 15:
            await asyncio.sleep(0.05)
    finally:
        await daemon.stop()
    assert daemon.feed is not None and not daemon.feed.wants_fast(time.monotonic())
    assert set(published) == {"simulator", "amdgpu"}
    # per step after the start: the age of the oldest source's last values (a round: 0.4 s)
    ages = sorted(max(t - max((p for p in times if p <= t), default=0.0) for times in published.values())
                  for t in stepped[3:])
    assert ages and ages[len(ages) // 2] < 0.2, ages  # at most the settle limit (0.1 s) when the polls lag


async def test_fast_polls_start_at_the_step_that_finds_a_gpu_near_contention(tmp_path, monkeypatch):
    """A calm daemon whose GPU nears contention: its fast loops, waiting, run from the next step."""
    near = {"on": False}
    monkeypatch.setattr(IndicatorFeed, "wants_fast", lambda self, now: near["on"])
    counts = {"fast": 0}
    real_fast = SimulatorSource.poll_fast

    def poll_fast(self):
        counts["fast"] += 1
        return real_fast(self)

    monkeypatch.setattr(SimulatorSource, "poll_fast", poll_fast)
    daemon = Daemon(Settings(simulate="demo", simulate_phase="idle", poll_interval=0.4, fast_interval=0.1,
                             state_dir=tmp_path / "state", collectors={c: False for c in OTHERS}))
    await daemon.start()
    try:
        await asyncio.sleep(1.5)
        assert counts["fast"] == 0
        near["on"] = True
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and counts["fast"] < 3:
            await asyncio.sleep(0.05)
        assert counts["fast"] >= 3
    finally:
        await daemon.stop()


@pytest.mark.parametrize("phase", ["training", "memory_bound"])
async def test_a_daemon_near_contention_samples_at_the_fast_interval(tmp_path, monkeypatch, phase):
    full, fast, steps = await _run(tmp_path, monkeypatch, phase)
    assert full >= 10
    assert fast >= full - 2  # a fast poll in (nearly) every gap of 0.4 s at 0.1 s
    assert steps >= 2 * full, (full, fast, steps)


def test_the_docs_state_the_hold_the_code_has():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    said = f"for {FAST_HOLD_SECONDS:g} s after"
    for doc in ("README.md", "docs/detection.md", "docs/configuration.md"):
        assert said in " ".join((root / doc).read_text().split()), doc


def test_contention_on_a_calm_gpu_is_seen_by_the_next_sample_and_counted_from_the_one_before():
    """The trade-off of sampling a calm node once per full poll: a 3 s episode on a GPU that was
    calm before it is counted (3 s, give or take the calm interval), and fast sampling runs from
    the first sample that sees it until FAST_HOLD_SECONDS after its last."""
    from tests.engine_frames import frame

    feed, store, state = _feed()
    calm = {"gpu_memory_bandwidth_utilization_percent": 20.0, "gpu_compute_occupancy_percent": 70.0,
            'gpu_process_utilization_percent{pid="101",process="train"}': 90.0}
    contended = {"gpu_memory_bandwidth_utilization_percent": 92.0, "gpu_compute_occupancy_percent": 30.0,
                 'gpu_process_utilization_percent{pid="101",process="train"}': 45.0,
                 'gpu_process_utilization_percent{pid="202",process="infer"}': 40.0}
    counter = ("gpu_memory_contention_seconds_total", (("basis", "occupancy"),))
    stepped, fast_at = [], []
    for tick in range(0, 240):  # fast ticks of 0.5 s over 120 s; a full poll every second
        now = tick * 0.5
        if tick % 2 == 0:
            state.frames = {DEV: frame(contended if 40.2 <= now < 43.2 else calm)}
            store.touch()
        if feed.due(now, (store.version, store.fast_version)):
            feed.advance(now, store)
            stepped.append(now)
            if feed.wants_fast(now):
                fast_at.append(now)
    assert feed.latest[DEV][counter] == pytest.approx(3.0, abs=1.0)
    assert fast_at[0] == 41.0  # the first full poll that sees the episode
    # held FAST_HOLD_SECONDS after the last step near contention (the engine holds a client it saw
    # busy over a few polls: the state stays near contention a moment after the episode)
    assert 43.0 + FAST_HOLD_SECONDS <= fast_at[-1] <= 43.0 + FAST_HOLD_SECONDS + 5
    calm_steps = [t for t in stepped if t < 41.0 or t > fast_at[-1] + 0.5]
    assert all(b - a >= 0.9 for a, b in zip(calm_steps, calm_steps[1:], strict=False))  # once per poll
    assert len([t for t in stepped if 41.0 <= t <= fast_at[-1]]) >= 2 * FAST_HOLD_SECONDS  # every tick
