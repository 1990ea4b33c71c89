"""The detection scenarios (mappings/scenarios/detection.yaml) in-process, on a fake clock.

The same path as the daemon run of tests/test_detection_scenarios.py, without the processes,
the HTTP and the wall clock: the built-in simulator (its clock replaced) polled every
``FULL`` fake seconds through ``poll_and_map`` into a ``Store``, fast polls every ``FAST`` seconds
in between (only the ``fast: true`` series, laid on top as the runner's ``fast_loop`` does, and
only while ``IndicatorFeed.sampling_interval`` asks for them), the ``IndicatorFeed`` advanced when
``IndicatorFeed.due`` says (the daemon's indicator loop: every fast interval while a GPU is near
contention, else once per full poll), and the served
indicator output (``present_only``, as the renderer takes it) read every ``SCRAPE`` seconds.
One run of ~100 fake seconds takes a few CPU seconds, so it is the loop to use while changing the
engine; the daemon run stays in ``make test`` for what only it covers (the worker threads, the
render loop, the exposition, real time).

What the daemon does and this does not: a poll that overruns its timeout (the simulator never
hangs), the render cadence (the daemon serves the indicators as of its last render, at most one
full poll old: a scrape here reads them as of the last feed step; expectation windows leave that
margin), and the process's own start-up (its time zero is the simulator's first poll here, the
first scrape after start-up there).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from exporter.config import load_config
from exporter.map.mapper import Mapper
from exporter.map.store import SourceState, Store
from exporter.render.render_cycle import present_only
from exporter.run.feed import IndicatorFeed
from exporter.run.pipeline import poll_and_map
from exporter.run.runner import fast_frames, overlay
from exporter.simulate import SimulatorSource, load_scenario
from exporter.sources.context import SourceContext
from exporter.testing import FakeClock, load_mappings

FULL, FAST, SCRAPE = 1.0, 0.25, 0.5  # the daemon run's --poll.interval, --poll.fast-interval, scrapes
CONFIG = "indicators:\n  state:\n    drop_confirm_seconds: 20\n"
VARIANTS = {"default evidence": "", "without process data": "simulate:\n  processes: off\n"}
T0 = 5000.0


@dataclass
class Run:
    """What the scrapes saw: per scrape (seconds since start, {device: state}), the last
    contended seconds per device."""

    timeline: list[tuple[float, dict[str, str]]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    steps: int = 0  # indicator steps taken (IndicatorFeed.due)


def run_variant(config_text: str, tmp: Path, seconds: float, scenario: str = "detection") -> Run:
    path = tmp / "config.yml"
    path.write_text(config_text)
    config = load_config(path)
    mappings = load_mappings()
    options = {"scenario": scenario, **config.simulate.options_dict()}  # as collector_policy does
    source = SimulatorSource(SourceContext.from_mappings(mappings, options=options))
    clock = FakeClock(T0)
    source.clock = clock
    source.open()
    store, state = Store(), SourceState("simulator", interval=FULL)
    store.add(state)
    full, fast = Mapper(mappings, interval=FULL), Mapper(mappings)
    fast_fields = mappings.raw_fields(mappings.schema.fast_metrics)

    def keep(r, devices) -> bool:  # the runner's fast-cycle filter
        d = devices.get(r.device)
        return d is not None and r.field in fast_fields.get(d.mapping, ())

    feed = IndicatorFeed(config.indicators, None, FAST, full_interval=FULL)
    run = Run()
    polled_at = fast_at = None
    steps = round(seconds / FAST)
    per_full, per_scrape = round(FULL / FAST), round(SCRAPE / FAST)
    for i in range(steps + 1):
        clock.now = now = T0 + i * FAST
        if i % per_full == 0:
            _full_poll(source, store, state, full, now)
            polled_at = now
        elif state.stats.up and polled_at is not None and now - polled_at >= FAST and _fast_due(
                feed.sampling_interval(now), now, max(polled_at, fast_at or polled_at)):
            fast_at = now
            cycle = poll_and_map(source.poll_fast, store, state, fast, now=now, keep=keep)
            got = fast_frames(cycle.result.frames, mappings.schema.fast_metrics)
            if got:
                state.fast = overlay(state.fast, got)
                store.fast_version += 1
        if feed.due(now, (store.version, store.fast_version)):
            feed.advance(now, store)
            run.steps += 1
        if i % per_scrape == 0:
            _scrape(run, i * FAST, present_only(feed.latest, store))
    source.close()
    return run


def _fast_due(step: float, now: float, last: float) -> bool:
    """The runner's fast-loop rule (``SourceRunner.fast_loop``) for a source polled every FULL."""
    return step <= FAST or (step < FULL and now - last >= 0.9 * step)


def _full_poll(source, store: Store, state: SourceState, mapper: Mapper, now: float) -> None:
    """``SourceRunner.poll_once``'s publishing, without the worker: a failed poll takes the
    source's series away (``SourceState.clear``)."""
    try:
        cycle = poll_and_map(source.poll, store, state, mapper, now=now)
    except Exception:  # noqa: BLE001 - a scenario's poll_error: the source is down
        state.clear()
        state.stats.state = "down"
        store.touch()
        return
    state.devices = cycle.devices
    state.device_up = {k: cycle.sample.device_up.get(k, True) for k in cycle.devices}
    state.frames, state.fast = cycle.result.frames, {}
    state.stats.up, state.stats.state = True, "up"
    store.touch()


def _scrape(run: Run, t: float, frames) -> None:
    states: dict[str, str] = {}
    seconds: dict[str, float] = defaultdict(float)
    for (vendor, gpu, _), frame in frames.items():
        dev = f"{vendor}:{gpu}"
        for (name, extra), v in frame.items():
            labels = dict(extra)
            if "gpu_instance" in labels:
                continue  # MIG instances: the GPU's own (derived) state is what a case expects
            if name == "gpu_memory_state" and v == 1.0:
                states[dev] = labels["state"]
            elif name == "gpu_memory_contention_seconds_total":
                seconds[dev] += v
    run.timeline.append((t, states))
    run.seconds = dict(seconds)


def failures(scenario_name: str, runs: dict[str, Run], skip: dict[str, str] | None = None) -> list[str]:
    """Every expectation of the scenario file a run did not meet (``skip``: device -> why it is
    not judged in-process)."""
    scenario = load_scenario(scenario_name)
    out = []
    for dev, exp in scenario.expect.items():
        if skip and dev in skip:
            continue
        for variant, run in runs.items():
            e = exp if variant == "default evidence" or exp.without_process_data is None else exp.without_process_data
            for w in e.states:
                seen = Counter(st.get(dev, "absent") for t, st in run.timeline if w.start <= t <= w.end)
                if set(seen) != {w.state}:
                    out.append(f"{dev} ({exp.case}, {variant}) {w.start:.0f}-{w.end:.0f} s: "
                               f"expected {w.state}, got {dict(seen)}")
            got = run.seconds.get(dev, 0.0)
            if e.contended_seconds is not None:
                lo, hi = e.contended_seconds
                if not lo <= got <= hi:
                    out.append(f"{dev} ({exp.case}, {variant}): contended {got:.2f} s, expected {lo}-{hi}")
    return out


def run_seconds(scenario_name: str = "detection") -> float:
    """Long enough for every expectation window of the scenario (the daemon run's 100 s at least)."""
    scenario = load_scenario(scenario_name)
    ends = [w.end for e in scenario.expect.values()
            for v in (e, e.without_process_data) if v is not None for w in v.states]
    return max([100.0, *ends])
