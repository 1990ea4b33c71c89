"""The simulated node as a newcomer meets it: a held phase stays, simulated GPUs differ per host,
the demo carries list prices, and its values stay clear of the alert thresholds (no flapping)."""

from __future__ import annotations

import pytest

from exporter.run.daemon import Settings
from exporter.run.loading import prepare
from exporter.simulate import SimulatorSource, load_scenario
from exporter.sources.context import SourceContext
from exporter.testing import FakeClock, load_mappings


def _source(**options) -> tuple[SimulatorSource, FakeClock]:
    source = SimulatorSource(SourceContext(options={"scenario": "demo", **options}, mappings=load_mappings()))
    clock = FakeClock(100.0)
    source.clock = clock
    source.open()
    return source, clock


def test_a_held_phase_stays_until_stopped():
    loop = sum(p.duration for p in load_scenario("demo").phases)
    source, clock = _source(phase="thermal_throttle")
    for t in (0.0, 33.0, 58.0, loop / 2, loop * 3 + 1):
        clock.now = 100.0 + t
        source.poll()
        assert source.current_phase() == "thermal_throttle", t


def test_without_a_held_phase_the_phases_run_in_turn_and_speed_compresses_them():
    scenario = load_scenario("demo")
    first, second = scenario.phases[0], scenario.phases[1]
    source, clock = _source()
    source.poll()
    assert source.current_phase() == first.name
    clock.now = 100.0 + first.duration + 1
    assert source.current_phase() == second.name
    fast, fclock = _source(speed=20)
    fast.poll()
    fclock.now = 100.0 + (first.duration + 1) / 20
    assert fast.current_phase() == second.name


def test_simulated_uuids_differ_per_host_and_stay_the_same_on_one():
    a = {s.dev.uuid for s in _source(host="node-a")[0]._states}
    a_again = {s.dev.uuid for s in _source(host="node-a")[0]._states}
    b = {s.dev.uuid for s in _source(host="node-b")[0]._states}
    assert len(a) == 5 and a == a_again and a.isdisjoint(b)


def test_the_demos_list_prices_stand_in_for_a_missing_price_table(tmp_path):
    prices = prepare(Settings(simulate="demo")).config.indicators.cost.prices
    assert {p.vendor for p in prices} == {"nvidia", "amd", "intel"}
    assert all(p.dollars_per_hour > 0 for p in prices)
    cfg = tmp_path / "c.yml"
    cfg.write_text("indicators:\n  cost:\n    prices:\n      - {dollars_per_hour: 9.5}\n")
    own = prepare(Settings(simulate="demo", config_path=cfg)).config.indicators.cost.prices
    assert [p.dollars_per_hour for p in own] == [9.5]
    assert prepare(Settings()).config.indicators.cost.prices == ()  # a real node: no prices invented


# (series, alert threshold): the demo's noise ranges must not straddle them, or the alert flaps
THRESHOLDS = [
    ('gpu_memory_arbitration_stalls_percent{source="ncu"}', 20),
    ('gpu_temperature_celsius{sensor="gpu"}', 85), ('gpu_temperature_celsius{sensor="edge"}', 85),
    ('gpu_temperature_celsius{sensor="memory"}', 95), ('gpu_temperature_celsius{sensor="junction"}', 100),
    ("gpu_memory_bandwidth_utilization_percent", 85), ("gpu_compute_occupancy_percent", 50),
    ("gpu_compute_utilization_percent", 85),
]


@pytest.mark.parametrize(("series", "threshold"), THRESHOLDS)
def test_demo_values_stay_clear_of_alert_thresholds(series, threshold):
    for phase in load_scenario("demo").phases:
        value = phase.values.get(series)
        if isinstance(value, list):
            lo, hi = (value + value)[:2]
            assert not lo <= threshold <= hi, (phase.name, series, value)
