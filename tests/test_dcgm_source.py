"""DcgmSource against a small fake of the DCGM bindings' surface (DcgmReader, dcgm_structs)."""

from __future__ import annotations

import sys
import types

import pytest

from exporter.sources import dcgm as dcgm_mod
from exporter.sources.base import SourceUnavailable
from exporter.sources.context import SourceContext
from exporter.sources.dcgm import DcgmSource
from exporter.testing import map_source_once, values_of

A100_UUID = "GPU-34319582-d595-d1c7-d1d2-179bcfa61660"


class DCGMError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"DCGM error {value}")
        self.value = value


def fake_bindings(values: dict, fail_init: bool = False):
    """DcgmReader.DcgmReader with the attributes/methods the real class has (testing/python3)."""
    created = []

    class DcgmReader:
        def __init__(self, hostname="localhost", fieldIds=None, updateFrequency=10000000,  # noqa: N803
                     maxKeepAge=3600.0, ignoreList=None, fieldGroupName="dcgm_fieldgroupData",  # noqa: N803
                     gpuIds=None, entities=None, fieldIntervalMap=None, ignoreBlank=True):  # noqa: N803
            self.args = dict(hostname=hostname, fieldIds=fieldIds, updateFrequency=updateFrequency,
                             maxKeepAge=maxKeepAge, ignoreBlank=ignoreBlank)
            self.m_gpuIdToUUId = {}
            self.m_gpuIdToBusId = {}
            self.shutdown = False
            created.append(self)

        def InitWrapped(self, path=None):  # noqa: N802
            if fail_init:
                raise DCGMError(-6)  # DCGM_ST_CONNECTION_NOT_VALID
            self.m_gpuIdToUUId = {0: A100_UUID}
            self.m_gpuIdToBusId = {0: "00000000:07:00.0"}

        def GetLatestGpuValuesAsFieldIdDict(self):  # noqa: N802
            return {g: {f: v for f, v in fv.items() if f in self.args["fieldIds"]} for g, fv in values.items()}

        def Shutdown(self):  # noqa: N802
            self.shutdown = True

    mods = types.SimpleNamespace(DcgmReader=types.SimpleNamespace(DcgmReader=DcgmReader),
                                 dcgm_structs=types.SimpleNamespace(DCGMError=DCGMError))
    return mods, created


# values as in the real A100 docs sample (DCGM_FI_PROF_DRAM_ACTIVE 0.690789 ...)
A100_VALUES = {0: {1001: 0.995630, 1002: 0.90, 1003: 0.4125, 1004: 0.929260, 1005: 0.690789,
                   1009: 33011804, 1010: 97863601, 1011: 0x7FFFFFFFFFFFFFF2}}


def test_raw_fields_by_id_and_blank_sentinels():
    mods, created = fake_bindings(A100_VALUES)
    src = DcgmSource(SourceContext(options={"update_interval_s": 0.5}), module=mods)
    src.open()
    try:
        s1, s2 = src.poll(), src.poll()
    finally:
        src.close()
    r = {x.field: x.value for x in s1.readings}
    assert r["dcgm.1005"] == 0.690789 and r["dcgm.1009"] == 33011804
    assert "dcgm.1011" not in r                      # INT64 blank (not supported): skipped
    assert s1.errors["not_supported"] == 1 and not s2.errors   # counted once
    assert s1.device_up == {"0000:07:00.0": True}
    assert s1.devices[0].uuid == A100_UUID and s1.devices[0].mapping == "dcgm"
    assert created[0].args["updateFrequency"] == 500_000 and created[0].args["fieldIds"][:2] == [203, 1001]
    assert created[0].shutdown


def test_mapping_ratio_to_percent():
    mods, _ = fake_bindings(A100_VALUES)
    s = map_source_once(DcgmSource(module=mods), cycles=1)
    assert values_of(s, "gpu_memory_bandwidth_utilization_percent", gpu="0") == [pytest.approx(69.0789)]
    assert values_of(s, "gpu_compute_occupancy_percent", uuid=A100_UUID) == [pytest.approx(41.25)]
    assert values_of(s, "gpu_sm_active_percent") == [pytest.approx(90.0)]
    assert values_of(s, "gpu_tensor_utilization_percent") == [pytest.approx(92.926)]


def test_host_engine_gone_marks_devices_down():
    values = dict(A100_VALUES)
    mods, _ = fake_bindings(values)
    src = DcgmSource(module=mods)
    src.open()
    try:
        values.clear()
        s = src.poll()
    finally:
        src.close()
    assert s.device_up == {"0000:07:00.0": False} and s.readings == [] and s.errors["read_error"] >= 1


def test_unavailable_without_host_engine():
    mods, _ = fake_bindings(A100_VALUES, fail_init=True)
    with pytest.raises(SourceUnavailable, match="nv-hostengine"):
        DcgmSource(module=mods).open()


def test_unavailable_without_bindings(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "DcgmReader", None)
    monkeypatch.setattr(dcgm_mod, "BINDING_PATHS", (str(tmp_path / "nope"),))
    with pytest.raises(SourceUnavailable, match="bindings not found"):
        DcgmSource().open()


def test_bindings_found_in_install_dir(monkeypatch, tmp_path):
    (tmp_path / "DcgmReader.py").write_text("MARK = 'reader'\n")
    (tmp_path / "dcgm_structs.py").write_text("MARK = 'structs'\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("DcgmReader", "dcgm_structs"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    mods = dcgm_mod.import_bindings((str(tmp_path),))
    assert (mods.DcgmReader.MARK, mods.dcgm_structs.MARK) == ("reader", "structs")
    for name in ("DcgmReader", "dcgm_structs"):
        sys.modules.pop(name, None)
