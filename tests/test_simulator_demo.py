"""The simulated node as a newcomer meets it: a held phase stays, simulated GPUs differ per host,
the demo carries list prices, its values stay clear of the alert thresholds (no flapping), and its
faults behave as the real ones do (a lost GPU, counter events, a failing library)."""

from __future__ import annotations

import pytest
import yaml

from exporter.run.daemon import Settings
from exporter.run.loading import prepare
from exporter.simulate import SimulatorSource, load_scenario
from exporter.sources.base import PollFailed
from exporter.sources.context import SourceContext
from exporter.testing import FakeClock, load_mappings
from exporter.yamlfile import ConfigError


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


def _at(source, clock, phase: str, offset: float = 1.0):
    start = 0.0
    for p in load_scenario("demo").phases:
        if p.name == phase:
            break
        start += p.duration
    clock.now = 100.0 + start + offset
    return source.poll()


def _xid(sample) -> dict[tuple[str, str], float]:
    return {(r.device, dict(r.labels)["xid"]): r.value for r in sample.readings if r.field == "xid.count"}


def test_a_lost_gpu_is_listed_but_answers_nothing_and_its_xid_shows_when_it_is_back():
    source, clock = _source()
    _at(source, clock, "degraded")
    lost = _at(source, clock, "gpu_lost")
    assert lost.device_up == {"sim-nvidia-1": False, "sim-nvidia-1#profiles/ncu": False}
    assert {d.key for d in lost.devices} >= {"sim-nvidia-1", "sim-nvidia-0"}
    assert not [r for r in lost.readings if r.device.startswith("sim-nvidia-1")]
    assert _xid(lost) == {}  # like the driver: no XID series before the first event
    back = _at(source, clock, "hardware_fault")
    assert back.device_up == {}
    # XID 79 of the lost phase and XID 13 of this one, once each
    assert _xid(back) == {("sim-nvidia-1", "79"): 1.0, ("sim-nvidia-1", "13"): 1.0}
    ecc = {r.device: r.value for r in back.readings if r.field == "ecc.volatile.uncorrected"}
    assert ecc == {"sim-nvidia-0": 0.0, "sim-nvidia-1": 2.0}
    # later polls and phases: the counters stay (reported, no new events) until the next loop
    assert _xid(_at(source, clock, "hardware_fault", 300)) == _xid(back)
    assert _xid(_at(source, clock, "idle")) == _xid(back)
    loop = sum(p.duration for p in load_scenario("demo").phases)
    _at(source, clock, "gpu_lost", loop)
    assert _xid(_at(source, clock, "hardware_fault", loop)) == {("sim-nvidia-1", "79"): 2.0,
                                                               ("sim-nvidia-1", "13"): 2.0}


def test_the_driver_failure_phase_fails_every_poll():
    source, clock = _source(phase="driver_failure")
    with pytest.raises(PollFailed, match="Driver/library version mismatch") as failed:
        source.poll()
    assert failed.value.errors == {"read_error": 1}
    with pytest.raises(PollFailed):
        source.poll_fast()


def test_the_intel_gpu_reports_no_bandwidth_and_no_evidence():
    source, clock = _source(phase="degraded")
    fields = {r.field for r in source.poll().readings if r.device.startswith("sim-intel")}
    assert fields and not {f for f in fields if "bandwidth" in f or f.startswith("drm")}
    assert "xe.gtidle.rc.idle_residency_ms" in fields  # busy: compute utilization is there


@pytest.mark.parametrize(("phase", "error"), [
    ({"lost": ["nvidia:7"]}, "no device nvidia:7"),
    ({"devices": {"tpu:0": {}}}, "no device tpu:0"),
    ({"events": {"nvidia:0": {"gpu_power_watts": 1}}}, "only a counter"),
    ({"events": {"nvidia:0": {"gpu_xid_errors_total": -1}}}, "positive amount"),
])
def test_a_scenario_naming_a_missing_device_or_stepping_a_gauge_is_refused(tmp_path, phase, error):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": "s", "devices": [{"vendor": "nvidia", "mapping": "nvml", "model": "H100"}],
        "phases": [{"name": "p", "duration": "1m", **phase}]}))
    with pytest.raises(ConfigError, match=error):
        load_scenario(str(path))
