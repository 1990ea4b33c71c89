"""End to end: the simulated node's scripted phases -> mapping -> indicator engine.

Drives the built-in ``demo`` scenario with a fake monotonic clock at a 250 ms fast interval,
maps every poll through the devices' own mapping files, hands the canonical series to the engine
in the shape the daemon uses (``name`` or ``name{label="v",...}`` per device) and checks the
indicators of each phase on the NVIDIA devices.
"""

from __future__ import annotations

import pytest

from exporter.indicators import IndicatorConfig
from exporter.map.mapper import Mapper
from exporter.map.store import SourceState, Store
from exporter.run.pipeline import poll_and_map
from exporter.simulate import SimulatorSource
from exporter.sources.context import SourceContext
from exporter.testing import FakeClock, flat, load_mappings
from tests.engine_frames import TextEngine

FAST = 0.25


def series_by_device(mapped: dict) -> dict[tuple[str, str, str], dict[str, float]]:
    per: dict[tuple[str, str, str], dict[str, float]] = {}
    for (name, labels), value in mapped.items():
        extra = dict(labels)
        device = (extra.pop("vendor", ""), extra.pop("gpu", ""), extra.pop("uuid", ""))
        key = name if not extra else name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(extra.items())) + "}"
        per.setdefault(device, {})[key] = value
    return per


def run_phase(phase: str, seconds: float = 20.0) -> dict[tuple[str, str, str], list]:
    """Last indicator output of every device after ``seconds`` into ``phase``."""
    mappings = load_mappings()
    source = SimulatorSource(SourceContext(options={"scenario": "demo", "phase": phase}, mappings=mappings))
    clock = FakeClock(5000.0)
    source.clock = clock
    source.open()
    mapper, store, state = Mapper(mappings), Store(), SourceState("simulator")
    store.add(state)
    engine = TextEngine(IndicatorConfig(), None, FAST)
    last: dict[tuple[str, str, str], list] = {}
    for i in range(round(seconds / FAST)):
        clock.now = 5000.0 + i * FAST
        cycle = poll_and_map(source.poll, store, state, mapper, now=clock.now)
        state.devices = cycle.devices
        per = series_by_device(flat(cycle.result.frames))
        if i == 0:
            for device in per:
                engine.set_device_info(device, vendor=device[0])
        # devices are independent: one update per device keeps each device's output apart
        last = {device: engine.update(clock.now, {device: series}) for device, series in per.items()}
    assert source.current_phase() == phase
    return last


def nvidia(last):
    return {d: out for d, out in last.items() if d[0] == "nvidia"}


def cause(out) -> str:
    (c,) = [lab["cause"] for n, lab, _ in out if n == "gpu_contention_cause_info"]
    return c


def value(out, name, **labels):
    hits = [v for n, lab, v in out if n == name and all(lab.get(k) == x for k, x in labels.items())]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


@pytest.mark.parametrize("phase", ["idle", "training"])
def test_quiet_phases_show_no_contention(phase):
    for device, out in nvidia(run_phase(phase)).items():
        contention = [v for n, _, v in out if n == "gpu_memory_contention"]
        assert contention == [0.0], device
        assert cause(out) == "none", device


def test_thermal_phase_is_attributed_to_thermal_throttling():
    devices = nvidia(run_phase("thermal_throttle"))
    assert len(devices) == 2
    for device, out in devices.items():
        assert value(out, "gpu_contention_cause", cause="thermal_throttle") == 1.0, device
        assert value(out, "gpu_contention_cause", cause="power_throttle") == 0.0, device
        assert cause(out) == "thermal_throttle", device


def test_variability_of_the_simulated_noise():
    # training: utilization uniform in [96, 100] -> CoV ~0.012, clean; not heavy-tailed
    for device, out in nvidia(run_phase("training")).items():
        assert value(out, "gpu_metric_cov", metric="utilization") < 0.05, device
        assert value(out, "gpu_metric_heavy_tail", metric="utilization") == 0.0, device
        p50 = value(out, "gpu_metric_percentile", metric="utilization", percentile="50")
        assert 96.0 <= p50 <= 100.0, device


@pytest.mark.parametrize("phase", ["bandwidth_saturation", "memory_pressure"])
def test_contention_phases_raise_memory_contention_on_occupancy(phase):
    for device, out in nvidia(run_phase(phase)).items():
        assert value(out, "gpu_memory_contention", basis="occupancy") == 1.0, device


@pytest.mark.parametrize(("phase", "expected"), [
    ("idle", "idle"), ("training", "healthy"), ("bandwidth_saturation", "contended"),
    ("memory_pressure", "contended"), ("thermal_throttle", "throttled"),
])
def test_every_vendor_reads_the_phase_state(phase, expected):
    """NVIDIA (occupancy + NVML processes) and AMD (no occupancy; DRM fdinfo clients); the demo's
    Intel GPU is a spare, idle, until the degraded phase (Intel with DRM fdinfo clients: the
    detection scenario, tests/test_detection_scenarios.py)."""
    last = run_phase(phase)
    assert {d[0] for d in last} == {"nvidia", "amd", "intel"}
    for device, out in last.items():
        if device[0] == "intel":
            assert value(out, "gpu_memory_state", state="idle") == 1.0, (device, out)
            continue
        assert value(out, "gpu_memory_state", state=expected) == 1.0, (device, out)
        contention = [v for n, _, v in out if n == "gpu_memory_contention"]
        assert contention == [1.0 if expected == "contended" else 0.0], device
        if expected in ("idle", "healthy"):
            assert cause(out) == "none", device


def test_the_simulated_fast_poll_gives_only_the_indicator_inputs_and_leaves_counters_alone():
    """The simulator's fast poll is not a full poll: only raw fields feeding the ``fast: true``
    metrics (canonical.yaml), and the counters it integrates advance with full polls only."""
    mappings = load_mappings()
    FAST_METRICS = mappings.schema.fast_metrics
    clock = FakeClock()
    source = SimulatorSource(SourceContext(options={"scenario": "demo", "phase": "bandwidth_saturation"}, mappings=mappings))
    source.clock = clock
    source.open()
    store, state, mapper, fast_mapper = Store(), SourceState("simulator"), Mapper(mappings), Mapper(mappings)
    store.add(state)
    full = poll_and_map(source.poll, store, state, mapper, now=clock.now)
    counters = dict(next(iter(source._states)).counters)
    clock.now += 0.5
    fast = poll_and_map(source.poll_fast, store, state, fast_mapper, now=clock.now)
    assert fast.sample.readings and len(fast.sample.readings) < len(full.sample.readings) / 3
    assert {name for name, _ in flat(fast.result.frames)} <= FAST_METRICS
    assert {name for name, _ in flat(full.result.frames)} & FAST_METRICS == {name for name, _ in flat(fast.result.frames)}
    assert dict(next(iter(source._states)).counters) == counters
    clock.now += 0.5
    poll_and_map(source.poll, store, state, mapper, now=clock.now)
    assert dict(next(iter(source._states)).counters) != counters  # the full poll still integrates


@pytest.mark.parametrize("phase", ["degraded", "gpu_lost", "hardware_fault"])
def test_the_busy_intel_gpu_without_bandwidth_or_evidence_cannot_be_evaluated(phase):
    """The demo's Intel GPU reports no memory bandwidth and has no co-tenancy evidence: busy, it
    reads unknown (no_bandwidth_signal), the input of GPUContentionNotEvaluable."""
    (out,) = [out for d, out in run_phase(phase).items() if d[0] == "intel"]
    assert value(out, "gpu_memory_state", state="unknown") == 1.0
    assert value(out, "gpu_memory_state_info", state="unknown", reason="no_bandwidth_signal") == 1.0
    assert not [n for n, _, _ in out if n == "gpu_memory_contention"]
