"""NvmlSource against the faithful pynvml fake: raw readings, errors, lost GPUs, MIG, processes."""

from __future__ import annotations

import sys

import pytest

from exporter.sources.base import SourceUnavailable
from exporter.sources.context import SourceContext
from exporter.sources.nvml import NvmlSource, mig_profile, normalize_bus_id
from exporter.testing import shipped_context, shipped_fast_fields
from tests.fakes import pynvml_fake as pf

MIB = 1 << 20
H100_KEY = "0000:19:00.0"
T4_KEY = "0000:3b:00.0"


class Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def readings(sample, key=None):
    return {(r.field, r.labels): r.value for r in sample.readings if key is None or r.device == key}


def make(gpus, context=SourceContext, **options):
    fake = pf.make_module(gpus)
    clock = Clock()
    options.setdefault("xid", False)
    src = NvmlSource(context(options=options), module=fake, clock=clock)
    src.open()
    return fake, clock, src


def poll(src, fake, clock, dt=1.0):
    s = src.poll()
    clock.t += dt
    fake.fake_advance(dt)
    return s


def test_h100_raw_readings_in_raw_units():
    fake, clock, src = make([pf.h100(0)])
    try:
        s0 = poll(src, fake, clock)
        r = readings(s0, H100_KEY)
        assert r[("power.usage", ())] == 631950            # mW
        assert r[("energy.total", ())] == 1_234_567_890    # mJ
        assert r[("memory.reserved", ())] == 479 * MIB
        assert r[("memory.used", ())] == 19817 * MIB
        # memory info v2 identity: total = used + free + reserved
        assert r[("memory.total", ())] == r[("memory.used", ())] + r[("memory.free", ())] + r[("memory.reserved", ())]
        assert r[("clock_max.memory", ())] == 2619
        assert r[("memory.bus_width", ())] == 5120
        assert r[("clocks_event_reasons.SwPowerCap", ())] == 1
        assert r[("clocks_event_reasons.GpuIdle", ())] == 0
        assert r[("field.PCIE_COUNT_TX_BYTES", ())] == 5_000_000_000
        assert r[("field.NVLINK_THROUGHPUT_DATA_TX", ())] == 1_000_000  # KiB, aggregate of all links
        assert not any(f.startswith("gpm.") for f, _ in r)  # first cycle only seeds GPM
        s1 = poll(src, fake, clock)
        r1 = readings(s1, H100_KEY)
        assert r1[("gpm.sm_occupancy", ())] == 38.25
        assert r1[("gpm.dram_bw_util", ())] == 88.5
        assert r1[("energy.total", ())] == 1_234_567_890 + 631950  # 631.95 W for 1 s = 631950 mJ
        assert r1[("field.PCIE_COUNT_TX_BYTES", ())] == 5_000_000_000 + 1_048_576
        assert s1.device_up == {H100_KEY: True}
        dev = s1.devices[0]
        assert (dev.key, dev.index, dev.vendor, dev.mapping) == (H100_KEY, "0", "nvidia", "nvml")
        assert dev.uuid == "GPU-h1000000-0000-0000-0000-000000000000" and dev.model == "NVIDIA H100 80GB HBM3"
        assert dev.driver == "590.48.01"
    finally:
        src.close()
    assert fake.fake_live_gpm_samples() == 0  # nvmlGpmSampleFree on close


def test_unsupported_counted_once_and_not_retried():
    fake, clock, src = make([pf.t4(0)])
    try:
        samples = [poll(src, fake, clock) for _ in range(4)]
    finally:
        src.close()
    # T4: no fan, no remapped rows, no GPM (query NotSupported), no memory temperature field
    first = samples[0].errors
    assert first["not_supported"] >= 4
    assert all(not s.errors for s in samples[1:]), [dict(s.errors) for s in samples]
    assert fake.fake_calls["nvmlDeviceGetRemappedRows"] == 1
    assert fake.fake_calls["nvmlDeviceGetFanSpeed"] == 1
    assert fake.fake_calls["nvmlGpmSampleGet"] == 0
    r = readings(samples[-1], T4_KEY)
    assert not any(f.startswith(("gpm.", "remapped_rows.", "fan.")) for f, _ in r)
    assert ("field.MEMORY_TEMP", ()) not in r and ("field.PCIE_COUNT_RX_BYTES", ()) in r
    # the unsupported field is dropped from the batch request (per-entry nvmlReturn)
    assert ("field.NVLINK_THROUGHPUT_DATA_TX", ()) not in r


def test_lost_gpu_is_isolated_and_rediscovered():
    fake, clock, src = make([pf.h100(0), pf.t4(1)])
    t4_key = "0000:3c:00.0"
    try:
        poll(src, fake, clock)
        poll(src, fake, clock)
        assert fake.fake_live_gpm_samples() == 2
        fake.fake_lose(0)
        lost = poll(src, fake, clock)
        assert lost.device_up == {H100_KEY: False, t4_key: True}
        assert readings(lost, H100_KEY) == {}
        assert readings(lost, t4_key)[("power.usage", ())] == 27500
        assert lost.errors["device_lost"] == 1
        assert fake.fake_live_gpm_samples() == 0  # the lost GPU's samples were freed
        still = poll(src, fake, clock)
        assert still.device_up[H100_KEY] is False and still.errors["device_lost"] == 0
        assert [d.key for d in still.devices] == [H100_KEY, t4_key]
        fake.fake_recover(0)
        back = poll(src, fake, clock)
        assert back.device_up == {H100_KEY: True, t4_key: True}
        rb = readings(back, H100_KEY)
        assert rb[("power.usage", ())] == 631950
        assert not any(f.startswith("gpm.") for f, _ in rb)  # GPM reseeds after the loss
        again = poll(src, fake, clock)
        assert readings(again, H100_KEY)[("gpm.sm_occupancy", ())] == 38.25
    finally:
        src.close()


def test_device_count_drop_marks_missing_gpu_down():
    fake, clock, src = make([pf.t4(0), pf.h100(1)])
    try:
        poll(src, fake, clock)
        fake.fake_state["count_override"] = 1
        s = poll(src, fake, clock)
        assert s.device_up == {T4_KEY: True, "0000:1a:00.0": False}
    finally:
        src.close()


def test_gpm_reseeds_after_gap_and_respects_min_window():
    fake, clock, src = make([pf.h100(0)])
    try:
        gpm = lambda s: {f: v for (f, _), v in readings(s).items() if f.startswith("gpm.")}  # noqa: E731
        assert gpm(poll(src, fake, clock, 1.0)) == {}          # t=0 seed
        assert gpm(poll(src, fake, clock, 99.0))["gpm.sm_util"] == 95.0  # t=1, window 1 s
        assert gpm(poll(src, fake, clock, 1.0)) == {}          # t=100: gap 99 s > 5 x 1 s: reseed
        assert gpm(poll(src, fake, clock, 0.05))["gpm.any_tensor_util"] == 61.0  # t=101
        assert gpm(poll(src, fake, clock, 1.0)) == {}          # t=101.05: window < 0.1 s: wait
        assert gpm(poll(src, fake, clock, 1.0))["gpm.dram_bw_util"] == 88.5  # t=102.05
    finally:
        src.close()


def test_gpm_per_metric_return_codes():
    spec = pf.h100(0)
    del spec["gpm"][5]          # any-tensor: INVALID_ARGUMENT (as a real H200 answers unknown ids)
    spec["gpm_unsupported_rc"] = pf.ERRORS["NVML_ERROR_INVALID_ARGUMENT"]
    fake, clock, src = make([spec], gpm_metrics=["SM_OCCUPANCY", "ANY_TENSOR_UTIL", "NO_SUCH_METRIC"])
    try:
        poll(src, fake, clock)
        s1 = poll(src, fake, clock)
        s2 = poll(src, fake, clock)
    finally:
        src.close()
    assert readings(s1) [("gpm.sm_occupancy", ())] == 38.25
    assert ("gpm.any_tensor_util", ()) not in readings(s1)
    assert s1.errors["not_supported"] == 1 and not s2.errors


def test_old_gpu_has_no_gpm_and_no_error_spam():
    fake, clock, src = make([pf.t4(0)])
    try:
        errs = [dict(poll(src, fake, clock).errors) for _ in range(3)]
    finally:
        src.close()
    assert errs[1:] == [{}, {}]
    assert fake.fake_calls["nvmlGpmSampleAlloc"] == 0


def test_a100_mig_instances_are_labelled():
    fake, clock, src = make([pf.a100_mig(0)])
    key = "0000:07:00.0"
    try:
        s = poll(src, fake, clock)
        s2 = poll(src, fake, clock)
    finally:
        src.close()
    r = readings(s, key)
    lab = (("gpu_instance", "13"), ("compute_instance", "0"), ("mig_profile", "1g.5gb"))
    assert r[("memory.used", lab)] == 13 * MIB
    assert r[("memory.total", (("gpu_instance", "5"), ("compute_instance", "0"), ("mig_profile", "2g.10gb")))] == 9856 * MIB
    assert len([k for k in r if k[0] == "memory.used"]) == 4  # parent + 3 instances
    assert ("utilization.gpu", ()) not in r                      # NotSupported in MIG mode
    assert not any(f.startswith("gpm.") for f, _ in readings(s2))  # A100: no GPM
    assert not s2.errors


def test_h100_mig_gpm_per_gpu_instance():
    fake, clock, src = make([pf.h100_mig(0)])
    try:
        poll(src, fake, clock)
        s = poll(src, fake, clock)
    finally:
        src.close()
    r = readings(s, H100_KEY)
    assert r[("gpm.sm_occupancy", (("gpu_instance", "1"), ("mig_profile", "3g.40gb")))] == 40.0
    assert r[("gpm.dram_bw_util", (("gpu_instance", "2"), ("mig_profile", "3g.40gb")))] == 10.0
    assert ("gpm.sm_occupancy", ()) not in r  # no device-level GPM in MIG mode
    assert fake.fake_calls["nvmlGpmMigSampleGet"] == 4 and fake.fake_calls["nvmlGpmSampleGet"] == 0


def test_processes_top_n_and_other(tmp_path):
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "comm").write_text("trainer\n")
    fake = pf.make_module([pf.h100(0)])
    clock = Clock()
    src = NvmlSource(SourceContext(procfs=tmp_path, options={"xid": False, "processes": True, "processes_top_n": 2}), module=fake, clock=clock)
    src.open()
    try:
        s = poll(src, fake, clock)
    finally:
        src.close()
    r = readings(s)
    assert r[("process.sm_util", (("pid", "4242"), ("process", "trainer")))] == 93      # name from procfs
    assert r[("process.memory_used", (("pid", "4343"), ("process", "dcgmproftester")))] == 1024 * MIB
    assert r[("process.sm_util", (("pid", "other"), ("process", "other")))] == 1
    assert r[("process.memory_used", (("pid", "other"), ("process", "other")))] == 512 * MIB
    assert len([k for k in r if k[0] == "process.sm_util"]) == 3


def test_processes_are_opt_in():
    fake, clock, src = make([pf.h100(0)])
    try:
        s = poll(src, fake, clock)
    finally:
        src.close()
    assert not any(f.startswith("process.") for f, _ in readings(s))
    assert fake.fake_calls["nvmlDeviceGetComputeRunningProcesses"] == 0


def test_memory_v1_fallback_when_v2_is_missing():
    spec = pf.t4(0)
    spec["missing"].add("nvmlDeviceGetMemoryInfo_v2")
    fake, clock, src = make([spec])
    try:
        s = poll(src, fake, clock)
    finally:
        src.close()
    r = readings(s)
    assert r[("memory_v1.used", ())] == (1000 + 258) * MIB  # v1 used includes reserved
    assert ("memory.used", ()) not in r and r[("memory.total", ())] == 15360 * MIB


def test_open_without_binding(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    with pytest.raises(SourceUnavailable, match="nvidia-ml-py not installed"):
        NvmlSource().open()


def test_open_library_not_found_and_no_gpus():
    fake = pf.make_module([pf.h100(0)], init_error=pf.ERRORS["NVML_ERROR_LIBRARY_NOT_FOUND"])
    with pytest.raises(SourceUnavailable, match="LibraryNotFound"):
        NvmlSource(module=fake).open()
    fake = pf.make_module([pf.h100(0)], init_error=pf.ERRORS["NVML_ERROR_DRIVER_NOT_LOADED"])
    with pytest.raises(SourceUnavailable, match="DriverNotLoaded"):
        NvmlSource(module=fake).open()
    empty = pf.make_module([])
    with pytest.raises(SourceUnavailable, match="no NVIDIA GPU"):
        NvmlSource(module=empty).open()
    assert empty.fake_state["init"] == 0  # shut down again


def test_helpers():
    assert normalize_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert normalize_bus_id("0001:3b:00.0") == "0001:3b:00.0"
    assert mig_profile("NVIDIA A100-SXM4-40GB MIG 1g.5gb") == "1g.5gb"
    assert mig_profile("NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb") == "1c.3g.40gb"
    assert mig_profile("Tesla T4") == ""


def test_poll_fast_reads_only_utilization_and_gpm_between_full_polls():
    # as the daemon creates it: the fast reads come from `fast: true` in canonical.yaml
    fake, clock, src = make([pf.h100(0), pf.t4(1)], context=shipped_context)
    try:
        poll(src, fake, clock, 0.25)                   # full poll: GPM seeded at t=0
        fast = src.poll_fast()                         # t=0.25: a 0.25 s GPM window
    finally:
        src.close()
    t4_key = next(d.key for d in fast.devices if d.key != H100_KEY)
    h100 = {f for f, _ in readings(fast, H100_KEY)}
    t4 = {f for f, _ in readings(fast, t4_key)}
    assert {"utilization.gpu", "utilization.memory", "gpm.sm_occupancy", "gpm.dram_bw_util"} <= h100
    assert readings(fast, H100_KEY)[("gpm.dram_bw_util", ())] == 88.5
    assert h100 <= shipped_fast_fields("nvml")  # nothing else: only what feeds a fast metric
    assert t4 == {"utilization.gpu", "utilization.memory"}  # no GPM before Hopper
