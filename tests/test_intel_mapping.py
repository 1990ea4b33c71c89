"""Canonical values from the real Intel captures through mappings/intel.yaml (end to end)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from exporter.sources.context import SourceContext
from exporter.sources.intel_sysfs import IntelSysfsSource
from exporter.testing import map_source_once
from tests.intel_trees import sysfs_root, write


class Stepping:
    """Runs ``steps[i]`` (a change to the tree) before poll i: counters move between polls."""

    name = "intel"

    def __init__(self, source, steps: list[Callable[[], None]]):
        self.source, self.steps = source, list(steps)

    def open(self):
        self.source.open()

    def close(self):
        self.source.close()

    def poll(self):
        if self.steps:
            self.steps.pop(0)()
        return self.source.poll()


def _series(res):
    return {(name, tuple(sorted((k, v) for k, v in labels if k not in ("vendor", "uuid")))): value
            for (name, labels), value in res.items()}


def _dev(res):
    return {(k, v) for _, labels in res for k, v in labels if k in ("vendor", "uuid", "gpu")}


def noop():
    pass


def test_a380_i915_canonical(shared_fixtures, tmp_path):
    root = sysfs_root(shared_fixtures, tmp_path, "sysfs-lact-a380-i915", copy=True)
    card = root / "class/drm/card1"

    def busy_second():
        write(card / "gt/gt0/rc6_residency_ms", str(6534 + 750))  # 750 ms idle in 1 s
        write(card / "device/hwmon/hwmon1/energy1_input", str(25637161804 + 30_000_000))  # 30 J
        write(card / "gt/gt0/rps_act_freq_mhz", "2000")
        write(card / "gt/gt0/throttle_reason_pl1", "1")

    res = map_source_once(Stepping(IntelSysfsSource(SourceContext(sysfs=root, options={})), [noop, busy_second]))
    assert _dev(res) == {("vendor", "intel"), ("uuid", ""), ("gpu", "1")}
    g = (("gpu", "1"),)
    gt = (("gpu", "1"), ("gt", "0"))
    assert _series(res) == pytest.approx({
        ("gpu_clock_mhz", (("domain", "graphics"),) + gt): 2000.0,
        ("gpu_clock_max_mhz", (("domain", "graphics"),) + gt): 2450.0,
        ("gpu_clock_min_mhz", (("domain", "graphics"),) + gt): 300.0,
        ("gpu_compute_utilization_percent", g): 25.0,
        ("gpu_energy_joules_total", g): 25667.161804,
        ("gpu_power_watts", g): 30.0,
        ("gpu_power_limit_watts", g): 55.0,
        ("gpu_temperature_celsius", (("gpu", "1"), ("sensor", "gpu"))): 55.0,
        ("gpu_fan_speed_rpm", (("fan", "1"), ("gpu", "1"))): 0.0,
        ("gpu_voltage_volts", (("gpu", "1"), ("rail", "gpu"))): 0.603,
        ("gpu_throttle_active", gt + (("reason", "power_cap"),)): 1.0,
        ("gpu_throttle_active", gt + (("reason", "current"),)): 0.0,
        ("gpu_throttle_active", gt + (("reason", "thermal"),)): 0.0,
        ("gpu_throttle_active", gt + (("reason", "prochot"),)): 0.0,
        # the GPU function's link to the card's on-board PCIe switch (device/current_link_*)
        ("gpu_pcie_link_speed_gts", g): 2.5,
        ("gpu_pcie_link_width", g): 1.0,
    })


def test_a380_xe_idle_act_freq_is_zero_not_missing(shared_fixtures, tmp_path):
    root = sysfs_root(shared_fixtures, tmp_path, "sysfs-lact-a380-xe", copy=True)
    gt0 = root / "class/drm/card0/device/tile0/gt0"
    hw = root / "class/drm/card0/device/hwmon/hwmon0"

    def idle_second():
        write(gt0 / "gtidle/idle_residency_ms", str(2547784 + 1000))  # idle the whole second
        write(hw / "energy2_input", str(59540970520 + 4_500_000))  # 4.5 J: pkg is the only channel

    s = _series(map_source_once(Stepping(IntelSysfsSource(SourceContext(sysfs=root, options={})), [noop, idle_second])))
    gt = (("gpu", "0"), ("gt", "0"))
    assert s[("gpu_clock_mhz", (("domain", "graphics"),) + gt)] == 0.0
    assert s[("gpu_clock_max_mhz", (("domain", "graphics"),) + gt)] == 2450.0
    assert s[("gpu_compute_utilization_percent", (("gpu", "0"),))] == pytest.approx(0.0)
    assert s[("gpu_power_watts", (("gpu", "0"),))] == pytest.approx(4.5)
    assert s[("gpu_energy_joules_total", (("gpu", "0"),))] == pytest.approx(59540.97052 + 4.5)
    assert s[("gpu_power_limit_watts", (("gpu", "0"),))] == 55.0  # power2_max (pkg PL1)
    assert s[("gpu_temperature_celsius", (("gpu", "0"), ("sensor", "gpu")))] == 56.0
    assert s[("gpu_temperature_celsius", (("gpu", "0"), ("sensor", "memory")))] == 54.0
    assert s[("gpu_fan_speed_rpm", (("fan", "1"), ("gpu", "0")))] == 945.0
    assert s[("gpu_voltage_volts", (("gpu", "0"), ("rail", "gpu")))] == 0.605


def test_b580_two_gts_and_media_busy(shared_fixtures, tmp_path):
    root = sysfs_root(shared_fixtures, tmp_path, "sysfs-lact-b580", copy=True)
    tile = root / "class/drm/card1/device/tile0"

    def second():
        write(tile / "gt0/gtidle/idle_residency_ms", str(308607 + 400))  # render GT 60 % busy
        write(tile / "gt1/gtidle/idle_residency_ms", str(312192 + 900))  # media GT 10 % busy
        write(tile / "gt0/freq0/act_freq", "2850")

    s = _series(map_source_once(Stepping(IntelSysfsSource(SourceContext(sysfs=root, options={})), [noop, second])))
    g = (("gpu", "1"),)
    assert s[("gpu_compute_utilization_percent", g)] == pytest.approx(60.0)
    assert s[("gpu_engine_utilization_percent", (("engine", "video"), ("gpu", "1")))] == pytest.approx(10.0)
    assert s[("gpu_clock_mhz", (("domain", "graphics"), ("gpu", "1"), ("gt", "0")))] == 2850.0
    assert s[("gpu_clock_mhz", (("domain", "graphics"), ("gpu", "1"), ("gt", "1")))] == 0.0  # media GT in C6
    assert s[("gpu_clock_max_mhz", (("domain", "graphics"), ("gpu", "1"), ("gt", "1")))] == 1500.0
    assert s[("gpu_energy_joules_total", g)] == pytest.approx(11031.745544)  # card channel
    assert s[("gpu_temperature_celsius", (("gpu", "1"), ("sensor", "memory")))] == 56.0
    assert {k for k in s if k[0] == "gpu_fan_speed_rpm"} == {
        ("gpu_fan_speed_rpm", (("fan", str(i)), ("gpu", "1"))) for i in (1, 2, 3)}
    assert ("gpu_power_limit_watts", g) not in s  # the capture has no power1_max: no fake value


def test_b580_kernel_616_energy_falls_back_to_pkg(shared_fixtures, tmp_path):
    # derived from the B580 capture as the 6.16 kernel reports it: card energy stuck at 0
    root = sysfs_root(shared_fixtures, tmp_path, "sysfs-lact-b580", copy=True)
    hw = root / "class/drm/card1/device/hwmon/hwmon2"
    write(hw / "energy1_input", "0")

    def second():
        write(hw / "energy2_input", str(19014248107 + 15_000_000))

    s = _series(map_source_once(Stepping(IntelSysfsSource(SourceContext(sysfs=root, options={})), [noop, second])))
    assert s[("gpu_energy_joules_total", (("gpu", "1"),))] == pytest.approx(19014.248107 + 15.0)
    assert s[("gpu_power_watts", (("gpu", "1"),))] == pytest.approx(15.0)


def test_cometlake_legacy_clocks(shared_fixtures, tmp_path):
    res = map_source_once(IntelSysfsSource(SourceContext(sysfs=sysfs_root(shared_fixtures, tmp_path, "sysfs-lact-cometlake"), options={})))
    g = (("domain", "graphics"), ("gpu", "0"))
    assert _series(res) == {("gpu_clock_mhz", g): 300.0, ("gpu_clock_max_mhz", g): 1150.0,
                            ("gpu_clock_min_mhz", g): 300.0}
