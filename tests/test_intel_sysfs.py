"""IntelSysfsSource on the real LACT captures (i915 and xe) and on trees derived from them."""

from __future__ import annotations

import os

import pytest

from exporter.sources.base import SourceUnavailable
from exporter.sources.context import SourceContext
from exporter.sources.intel_sysfs import IntelSysfsSource
from tests.intel_trees import sysfs_root, write


def _open(root):
    src = IntelSysfsSource(SourceContext(sysfs=root, options={}))
    src.open()
    return src


def _raw(sample):
    """{(field, labels): value}; fails on a duplicate reading."""
    out = {}
    for r in sample.readings:
        k = (r.field, r.labels)
        assert k not in out, f"duplicate reading {k}"
        out[k] = r.value
    return out


GT0, GT1 = (("gt", "0"),), (("gt", "1"),)
REASONS = ("pl1", "pl2", "pl4", "prochot", "ratl", "thermal", "vr_tdc", "vr_thermalert")


def test_a380_i915_per_gt_files(shared_fixtures, tmp_path):
    s = _open(sysfs_root(shared_fixtures, tmp_path, "sysfs-lact-a380-i915")).poll()
    (dev,) = s.devices
    assert (dev.key, dev.index, dev.vendor, dev.mapping, dev.driver, dev.model) == (
        "0000:0b:00.0", "1", "intel", "intel", "i915", "8086:56a5")
    raw = _raw(s)
    expected = {
        ("i915.gt.rps_act_freq_mhz", GT0): 600, ("i915.gt.rps_cur_freq_mhz", GT0): 600,
        ("i915.gt.rps_min_freq_mhz", GT0): 300, ("i915.gt.rps_max_freq_mhz", GT0): 2450,
        ("i915.gt.rps_boost_freq_mhz", GT0): 2450, ("i915.gt.rps_RP0_freq_mhz", GT0): 2450,
        ("i915.gt.rps_RP1_freq_mhz", GT0): 600, ("i915.gt.rps_RPn_freq_mhz", GT0): 300,
        ("i915.gt.punit_req_freq_mhz", GT0): 600, ("i915.gt.rc6_residency_ms", GT0): 6534,
        ("i915.gt.throttle_reason_status", GT0): 0,
        **{(f"i915.gt.throttle_reason_{r}", GT0): 0 for r in REASONS},
        ("i915.hwmon.energy_uj", ()): 25637161804,  # single unlabelled channel
        ("i915.hwmon.fan_input", (("fan", "1"),)): 0,  # a stopped fan reads a real 0
        ("i915.hwmon.in0_input", ()): 603, ("i915.hwmon.power1_max", ()): 55000000,
        ("i915.hwmon.power1_rated_max", ()): 0, ("i915.hwmon.temp.temp1", ()): 55000,
        # the GPU function's link to the card's on-board PCIe switch ("2.5 GT/s PCIe", x1)
        ("pcie.current_link_speed", ()): 2.5, ("pcie.current_link_width", ()): 1,
    }
    assert raw == expected  # card-level gt_*_freq_mhz are not read when gt/gt0 exists
    assert not s.errors and s.device_up == {"0000:0b:00.0": True}


def test_a380_xe_idle_act_freq_zero_and_pkg_only_energy(shared_fixtures, tmp_path):
    s = _open(sysfs_root(shared_fixtures, tmp_path, "sysfs-lact-a380-xe")).poll()
    (dev,) = s.devices
    assert (dev.key, dev.index, dev.driver) == ("0000:08:00.0", "0", "xe")
    raw = _raw(s)
    assert raw[("xe.freq0.act_freq", GT0)] == 0  # GT in C6: 0 is reported, not dropped
    assert raw[("xe.freq0.cur_freq", GT0)] == 300
    assert raw[("xe.freq0.rp0_freq", GT0)] == 2450
    assert raw[("xe.freq0.min_freq", GT0)] == 300
    assert raw[("xe.gtidle.rc.idle_residency_ms", GT0)] == 2547784
    # `reasons` = none: every reason named by a reason_* file is 0, status 0
    assert {k: v for k, v in raw.items() if k[0].startswith("xe.throttle")} == {
        **{(f"xe.throttle.reason_{r}", GT0): 0 for r in REASONS}, ("xe.throttle.status", GT0): 0}
    assert raw[("xe.hwmon.energy_uj", ())] == 59540970520  # only energy2 (pkg) exists
    assert raw[("xe.hwmon.power2_max", ())] == 55000000
    assert raw[("xe.hwmon.temp.pkg", ())] == 56000 and raw[("xe.hwmon.temp.vram", ())] == 54000
    assert raw[("xe.hwmon.fan_input", (("fan", "1"),))] == 945
    assert raw[("xe.hwmon.in1_input", ())] == 605


def test_b580_two_gts_card_energy(shared_fixtures, tmp_path):
    s = _open(sysfs_root(shared_fixtures, tmp_path, "sysfs-lact-b580")).poll()
    raw = _raw(s)
    assert s.devices[0].key == "0000:09:00.0" and s.devices[0].index == "1"
    assert raw[("xe.freq0.act_freq", GT0)] == 0 and raw[("xe.freq0.act_freq", GT1)] == 0
    assert raw[("xe.freq0.rp0_freq", GT0)] == 2850 and raw[("xe.freq0.rp0_freq", GT1)] == 1500
    assert raw[("xe.gtidle.rc.idle_residency_ms", GT0)] == 308607  # gt0-rc
    assert raw[("xe.gtidle.mc.idle_residency_ms", GT1)] == 312192  # gt1-mc (media GT)
    assert raw[("xe.hwmon.energy_uj", ())] == 11031745544  # card channel preferred over pkg
    assert raw[("xe.hwmon.power1_cap", ())] == 190000000
    assert raw[("xe.hwmon.temp.mctrl", ())] == 55000
    assert raw[("xe.hwmon.temp.vram_ch_11", ())] == 54000
    assert {k[1] for k in raw if k[0] == "xe.hwmon.fan_input"} == {(("fan", "1"),), (("fan", "2"),), (("fan", "3"),)}


def test_cometlake_legacy_card_level_files(shared_fixtures, tmp_path):
    s = _open(sysfs_root(shared_fixtures, tmp_path, "sysfs-lact-cometlake")).poll()
    assert s.devices[0].key == "0000:00:02.0"
    assert _raw(s) == {
        ("i915.card.gt_act_freq_mhz", ()): 300, ("i915.card.gt_cur_freq_mhz", ()): 300,
        ("i915.card.gt_min_freq_mhz", ()): 300, ("i915.card.gt_max_freq_mhz", ()): 1150,
        ("i915.card.gt_boost_freq_mhz", ()): 1150, ("i915.card.gt_RP0_freq_mhz", ()): 1150,
        ("i915.card.gt_RP1_freq_mhz", ()): 300, ("i915.card.gt_RPn_freq_mhz", ()): 300,
    }


def test_energy_falls_back_to_pkg_when_card_reads_zero_and_sticks(shared_fixtures, tmp_path):
    # the B580 on kernel 6.16 reads energy1_input (card) = 0 while energy2 (pkg) counts
    root = sysfs_root(shared_fixtures, tmp_path, "sysfs-lact-b580", copy=True)
    hwmon = root / "class/drm/card1/device/hwmon/hwmon2"
    write(hwmon / "energy1_input", "0")
    src = _open(root)
    assert _raw(src.poll())[("xe.hwmon.energy_uj", ())] == 19014248107
    # card starts counting later: keep the pkg counter, switching would look like a reset
    write(hwmon / "energy1_input", "5000000")
    write(hwmon / "energy2_input", "19015248107")
    assert _raw(src.poll())[("xe.hwmon.energy_uj", ())] == 19015248107
    # the chosen file disappears: choose again
    (hwmon / "energy2_input").unlink()
    assert _raw(src.poll())[("xe.hwmon.energy_uj", ())] == 5000000


def test_throttle_reasons_list_is_preferred_over_reason_files(shared_fixtures, tmp_path):
    root = sysfs_root(shared_fixtures, tmp_path, "sysfs-lact-b580", copy=True)
    throttle = root / "class/drm/card1/device/tile0/gt0/freq0/throttle"
    write(throttle / "reasons", "pl1 thermal")
    write(throttle / "reason_pl2", "1")  # racy per-reason file disagrees: ignored
    raw = _raw(_open(root).poll())
    got = {k[0]: v for k, v in raw.items() if k[0].startswith("xe.throttle") and k[1] == GT0}
    assert got == {**{f"xe.throttle.reason_{r}": 0 for r in REASONS},
                   "xe.throttle.reason_pl1": 1, "xe.throttle.reason_thermal": 1, "xe.throttle.status": 1}
    # without `reasons` the reason_* files are read
    (throttle / "reasons").unlink()
    raw = _raw(_open(root).poll())
    assert raw[("xe.throttle.reason_pl2", GT0)] == 1 and raw[("xe.throttle.reason_pl1", GT0)] == 0


def test_vram_size_summed_over_tiles_and_driver_symlink(tmp_path):
    root = tmp_path / "sys"
    dev = root / "devices/pci0000:00/0000:00:01.0/0000:8C:00.0"
    write(dev / "tile0/physical_vram_size_bytes", str(8 << 30))
    write(dev / "tile1/physical_vram_size_bytes", str(8 << 30))
    write(dev / "tile0/gt0/freq0/act_freq", "1100")
    (root / "bus/pci/drivers/xe").mkdir(parents=True)
    os.symlink(root / "bus/pci/drivers/xe", dev / "driver")
    (root / "class/drm/card12").mkdir(parents=True)
    os.symlink(dev, root / "class/drm/card12/device")
    (root / "class/drm/card12-DP-1").mkdir()  # connectors are not cards
    s = _open(root).poll()
    assert [(d.key, d.index, d.driver) for d in s.devices] == [("0000:8c:00.0", "12", "xe")]
    raw = _raw(s)
    assert raw[("xe.physical_vram_size_bytes", ())] == 16 << 30
    assert raw[("xe.freq0.act_freq", GT0)] == 1100


def test_non_intel_cards_are_ignored_and_no_card_is_unavailable(tmp_path):
    root = tmp_path / "sys"
    write(root / "class/drm/card0/device/uevent", "DRIVER=amdgpu\nPCI_SLOT_NAME=0000:03:00.0")
    with pytest.raises(SourceUnavailable):
        _open(root)


def test_bad_value_counted_and_lost_device(shared_fixtures, tmp_path):
    root = sysfs_root(shared_fixtures, tmp_path, "sysfs-lact-b580", copy=True)
    gt0 = root / "class/drm/card1/device/tile0/gt0"
    write(gt0 / "freq0/act_freq", "garbage")
    src = _open(root)
    s = src.poll()
    assert s.errors == {"malformed_value": 1}
    assert ("xe.freq0.act_freq", GT0) not in _raw(s)
    assert _raw(s)[("xe.freq0.act_freq", GT1)] == 0
    # the device goes away (unbind): reported down, no readings, no exception
    os.rename(root / "class/drm/card1/device", root / "class/drm/card1/gone")
    s = src.poll()
    assert s.device_up == {"0000:09:00.0": False} and s.readings == [] and s.errors["device_lost"] == 1


def test_pcie_link_files_of_the_pci_device_dir(shared_fixtures, tmp_path):
    """current/max link speed and width from the card's PCI device directory; 'Unknown' speed
    is counted as not supported, an integrated GPU's width 0 is no link and not exported."""
    root = sysfs_root(shared_fixtures, tmp_path, "sysfs-lact-a380-i915", copy=True)
    dev = next((root / "class" / "drm").glob("card*/device"))
    (dev / "current_link_speed").write_text("8.0 GT/s PCIe\n")
    (dev / "max_link_speed").write_text("16.0 GT/s PCIe\n")
    (dev / "current_link_width").write_text("8\n")
    (dev / "max_link_width").write_text("16\n")
    raw = _raw(_open(root).poll())
    assert raw[("pcie.current_link_speed", ())] == 8.0 and raw[("pcie.max_link_speed", ())] == 16.0
    assert raw[("pcie.current_link_width", ())] == 8 and raw[("pcie.max_link_width", ())] == 16
    (dev / "max_link_speed").write_text("Unknown\n")
    (dev / "current_link_width").write_text("0\n")
    s = _open(root).poll()
    raw = _raw(s)
    assert ("pcie.max_link_speed", ()) not in raw and ("pcie.current_link_width", ()) not in raw
    assert s.errors["not_supported"] == 1
