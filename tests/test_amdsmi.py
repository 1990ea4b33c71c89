"""amdsmi source through a faithful small fake of the binding, and the guarded import."""

from __future__ import annotations

import enum
import sys
import types

import pytest

from exporter.indicators import IndicatorConfig
from exporter.sources.amdsmi import AmdsmiSource, import_amdsmi
from exporter.sources.base import SourceUnavailable
from exporter.sources.context import SourceContext
from exporter.testing import map_source_once, values_of
from tests.amd_fixture_tree import arrange_mi300x_node, mi300x_pci
from tests.engine_frames import TextEngine, engine_inputs


class AmdSmiException(Exception):
    pass


class AmdSmiLibraryException(AmdSmiException):
    """As in amdsmi_exception.py: carries the amdsmi_status_t code."""

    def __init__(self, err_code: int):
        super().__init__(f"Error code:\n\t{err_code}")
        self.err_code = err_code

    def get_error_code(self) -> int:
        return self.err_code


class AmdSmiInitFlags(enum.IntEnum):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1 << 0
    INIT_AMD_GPUS = 1 << 1


class AmdSmiGpuBlock(enum.IntEnum):
    INVALID = 0
    UMC = 1
    SDMA = 2
    GFX = 4
    MMHUB = 8
    ATHUB = 16
    PCIE_BIF = 32
    HDP = 64
    XGMI_WAFL = 128


def fake_amdsmi(bdfs, unsupported=(), process_list=None) -> types.SimpleNamespace:
    """A fake ``amdsmi`` module: same function names, return shapes and exceptions as 7.0.2."""
    handles = [object() for _ in bdfs]
    calls: list[str] = []
    state = {"init": None}

    def check(name):
        calls.append(name)
        if name in unsupported:
            raise AmdSmiLibraryException(2)  # AMDSMI_STATUS_NOT_SUPPORTED

    def amdsmi_init(flag=AmdSmiInitFlags.INIT_AMD_GPUS):
        state["init"] = flag

    def amdsmi_get_processor_handles():
        return list(handles)

    def amdsmi_get_gpu_device_bdf(h):
        return bdfs[handles.index(h)]

    def amdsmi_get_gpu_total_ecc_count(h):
        check("amdsmi_get_gpu_total_ecc_count")
        i = handles.index(h)
        return {"correctable_count": 10 + i, "uncorrectable_count": i, "deferred_count": "N/A"}

    def amdsmi_get_gpu_ecc_count(h, block):
        check("amdsmi_get_gpu_ecc_count")
        if block == AmdSmiGpuBlock.UMC:
            return {"correctable_count": 7, "uncorrectable_count": 0, "deferred_count": 0}
        raise AmdSmiLibraryException(2)

    def amdsmi_get_gpu_xgmi_link_status(h):
        check("amdsmi_get_gpu_xgmi_link_status")
        return {"status": ["U", "D", "X", "N/A"], "total_links": 4}

    def amdsmi_get_link_metrics(h):
        check("amdsmi_get_link_metrics")
        return {"num_links": 1, "links": [{"bdf": "0000:15:00.0", "bit_rate": 32, "max_bandwidth": 64,
                                            "link_type": 2, "read": 1000, "write": "N/A"}]}

    def amdsmi_get_gpu_process_list(h):
        check("amdsmi_get_gpu_process_list")
        return process_list() if callable(process_list) else (process_list or [])

    def amdsmi_get_gpu_asic_info(h):
        return {"market_name": "AMD Instinct MI300X", "asic_serial": "0x1234"}

    def amdsmi_shut_down():
        state["init"] = None

    return types.SimpleNamespace(
        AmdSmiInitFlags=AmdSmiInitFlags, AmdSmiGpuBlock=AmdSmiGpuBlock,
        AmdSmiLibraryException=AmdSmiLibraryException, AmdSmiException=AmdSmiException,
        amdsmi_init=amdsmi_init, amdsmi_shut_down=amdsmi_shut_down,
        amdsmi_get_processor_handles=amdsmi_get_processor_handles,
        amdsmi_get_gpu_device_bdf=amdsmi_get_gpu_device_bdf,
        amdsmi_get_gpu_total_ecc_count=amdsmi_get_gpu_total_ecc_count,
        amdsmi_get_gpu_ecc_count=amdsmi_get_gpu_ecc_count,
        amdsmi_get_gpu_xgmi_link_status=amdsmi_get_gpu_xgmi_link_status,
        amdsmi_get_link_metrics=amdsmi_get_link_metrics,
        amdsmi_get_gpu_process_list=amdsmi_get_gpu_process_list,
        amdsmi_get_gpu_asic_info=amdsmi_get_gpu_asic_info, calls=calls, state=state)


def test_identity_matches_the_sysfs_source_and_readings(tmp_path):
    arrange_mi300x_node(tmp_path, cards=(0, 10))
    smi = fake_amdsmi([mi300x_pci(0), mi300x_pci(1)])
    src = AmdsmiSource(SourceContext(sysfs=tmp_path, options={}), module=smi)
    src.open()
    assert smi.state["init"] == AmdSmiInitFlags.INIT_AMD_GPUS
    sample = src.poll()
    src.close()
    assert smi.state["init"] is None
    devs = {d.key: d for d in sample.devices}
    assert devs[mi300x_pci(1)].index == "10"                      # DRM card number from sysfs
    assert devs[mi300x_pci(1)].uuid == f"{0x1122334455660001:016x}"  # sysfs unique_id
    assert devs[mi300x_pci(1)].mapping == "amdsmi"
    r = {(x.device, x.field, x.labels): x.value for x in sample.readings}
    assert r[(mi300x_pci(1), "ecc.correctable_count", ())] == 11
    assert r[(mi300x_pci(1), "ecc.uncorrectable_count", ())] == 1
    assert (mi300x_pci(1), "ecc.deferred_count", ()) not in r       # "N/A" omitted, not 0
    assert r[(mi300x_pci(0), "ecc_block.correctable_count", (("block", "umc"),))] == 7
    assert r[(mi300x_pci(0), "xgmi.link_up", (("link", "0"),))] == 1
    assert r[(mi300x_pci(0), "xgmi.link_up", (("link", "1"),))] == 0
    assert (mi300x_pci(0), "xgmi.link_up", (("link", "2"),)) not in r
    assert r[(mi300x_pci(0), "xgmi.read_kb", (("link", "0"),))] == 1000
    assert (mi300x_pci(0), "xgmi.write_kb", (("link", "0"),)) not in r
    # 6 blocks answer NOT_SUPPORTED per GPU: counted once, then never asked again
    assert sample.errors == {"not_supported": 12}
    src.open()                                                    # a re-open probes again
    assert src.poll().errors == {"not_supported": 12}
    before = smi.calls.count("amdsmi_get_gpu_ecc_count")
    second = src.poll()
    src.close()
    assert second.errors == {}
    assert smi.calls.count("amdsmi_get_gpu_ecc_count") - before == 2     # UMC only, per GPU


def test_canonical_ecc_series(tmp_path):
    arrange_mi300x_node(tmp_path, cards=(0,))
    smi = fake_amdsmi([mi300x_pci(0)], unsupported={"amdsmi_get_link_metrics"})
    series = map_source_once(AmdsmiSource(SourceContext(sysfs=tmp_path), module=smi))
    uuid = f"{0x1122334455660000:016x}"
    assert values_of(series, "gpu_ecc_errors_total", gpu="0", uuid=uuid, severity="corrected") == [10, 7]
    assert values_of(series, "gpu_ecc_errors_total", gpu="0", severity="corrected", block="umc") == [7]
    assert values_of(series, "gpu_ecc_errors_total", gpu="0", severity="deferred") == [0]  # umc block only
    assert values_of(series, "gpu_interconnect_bytes_total", gpu="0") == []  # sysfs gpu_metrics owns XGMI


def test_per_process_series_are_opt_in_bounded_and_rate_mapped(tmp_path):
    arrange_mi300x_node(tmp_path, cards=(0,))
    procs = [
        {"name": "python3", "pid": 4242, "mem": 3 << 30,
         "engine_usage": {"gfx": 0, "enc": 0},
         "memory_usage": {"gtt_mem": 1 << 20, "cpu_mem": 0, "vram_mem": 2 << 30}, "cu_occupancy": 10},
        {"name": "N/A", "pid": 17, "mem": 1 << 30, "engine_usage": {"gfx": 0, "enc": 0},
         "memory_usage": {"gtt_mem": 0, "cpu_mem": 0, "vram_mem": 1 << 30}, "cu_occupancy": "N/A"},
        {"name": "small", "pid": 99, "mem": 1 << 20, "engine_usage": {"gfx": 0, "enc": 0},
         "memory_usage": {"gtt_mem": 0, "cpu_mem": 0, "vram_mem": 1 << 20}, "cu_occupancy": 0},
    ]
    def process_list():  # the gfx engine counter advances 0.25 s per call (polls are 1 s apart)
        procs[0]["engine_usage"]["gfx"] += 250_000_000
        return procs

    smi = fake_amdsmi([mi300x_pci(0)], process_list=process_list)
    default = AmdsmiSource(SourceContext(sysfs=tmp_path), module=smi)  # count-only
    default.open()
    assert not any(r.field.startswith("process.") for r in default.poll().readings)
    default.close()
    src = AmdsmiSource(SourceContext(sysfs=tmp_path, options={"processes": True, "process_top_n": 2}), module=smi)
    src.open()
    sample = src.poll()
    series = map_source_once(src, opened=True)
    src.close()
    r = {(x.field, x.labels): x.value for x in sample.readings}
    assert r[("process.vram_mem", (("pid", "4242"), ("process", "python3")))] == 2 << 30
    assert r[("process.vram_mem", (("pid", "17"), ("process", "unknown")))] == 1 << 30
    assert r[("process.vram_mem", (("pid", "other"), ("process", "other")))] == 1 << 20
    assert values_of(series, "gpu_process_memory_bytes", pid="4242", region="vram") == [2 << 30]
    # 250e6 ns busy per 1 s between map_source_once's two polls = 25 %
    assert values_of(series, "gpu_process_utilization_percent", pid="4242", engine="gfx") == [pytest.approx(25.0)]
    assert values_of(series, "gpu_process_utilization_percent", pid="17") == [0.0]


# ---------------------------------------------------- the busy-client count (the default)


def _proc(root, host: bool = True, pids=(4242, 17, 99), unreadable=()):
    """A /proc as amdsmi's process list walks it: a pid directory per process, with its fdinfo
    directory unless ``unreadable`` (a process whose fdinfo the exporter may not read); pid 2 is
    kthreadd only in the host PID namespace."""
    for pid in pids:
        (root / str(pid)).mkdir(parents=True)
        if pid not in unreadable:
            (root / str(pid) / "fdinfo").mkdir()
    if host:
        (root / "2" / "fdinfo").mkdir(parents=True)
        (root / "2" / "comm").write_text("kthreadd\n")
    return root


def _counted(tmp_path, busy_ns=(600_000_000, 400_000_000, 0), **proc):
    """Count mode through the mapping and the engine: three processes, their gfx engine counter
    advancing ``busy_ns`` per second; the GPU at 95 % bandwidth."""
    arrange_mi300x_node(tmp_path / "sys", cards=(0,))
    procs = [{"name": n, "pid": pid, "mem": 1 << 30, "engine_usage": {"gfx": 0, "enc": 0},
              "memory_usage": {"gtt_mem": 0, "cpu_mem": 0, "vram_mem": 1 << 30}}
             for n, pid in (("train", 4242), ("etl", 17), ("notebook", 99))]

    def process_list():
        for p, ns in zip(procs, busy_ns, strict=True):
            p["engine_usage"]["gfx"] += ns
        return procs

    smi = fake_amdsmi([mi300x_pci(0)], process_list=process_list)
    src = AmdsmiSource(SourceContext(sysfs=tmp_path / "sys"), module=smi, procfs=_proc(tmp_path / "proc", **proc))
    series = map_source_once(src)
    engine = TextEngine(IndicatorConfig(), None, 0.5)
    inputs = {**engine_inputs(series), "gpu_compute_utilization_percent": 99.0,
              "gpu_memory_bandwidth_utilization_percent": 95.0}
    out = engine.update(1.0, {("amd", "0", ""): inputs})
    return series, out


def _out(out, name, **labels):
    return [v for n, lab, v in out if n == name and lab.items() >= labels.items()]


def test_count_mode_gives_the_busy_clients_and_no_per_process_series(tmp_path):
    """The default options, host PID namespace, every fdinfo readable: the count is complete,
    two busy clients (60 %, 40 %; the notebook at 0 % is no client), contended, and nothing
    names a pid or a process."""
    series, out = _counted(tmp_path)
    assert values_of(series, "gpu_client_utilization_percent", client="4242") == [pytest.approx(60.0)]
    assert values_of(series, "gpu_client_evidence", evidence="amdsmi", reason="") == [1.0]
    assert not [name for name, _ in series if name.startswith("gpu_process_")]
    assert not [labels for _, labels in series if any(k in ("pid", "process") for k, _ in labels)]
    assert _out(out, "gpu_active_clients") == [2.0]
    assert _out(out, "gpu_memory_state", state="contended") == [1.0]
    assert _out(out, "gpu_contention_evidence_info", evidence="clients", source="amdsmi") == [1.0]


def test_count_mode_in_a_private_pid_namespace_is_partial(tmp_path):
    """amdsmi walks the exporter's own /proc: without the host PID namespace it lists only the
    processes it can see, so one busy client proves nothing (unknown, not memory_bound) and two
    still prove co-tenancy."""
    _, out = _counted(tmp_path / "one", busy_ns=(600_000_000, 0, 0), host=False)
    assert _out(out, "gpu_active_clients") == []
    assert _out(out, "gpu_memory_state", state="unknown") == [1.0]
    assert _out(out, "gpu_contention_evidence_info", evidence="none", reason="pid_namespace_private") == [1.0]
    _, out = _counted(tmp_path / "two", host=False)
    assert _out(out, "gpu_memory_state", state="contended") == [1.0]


def test_count_mode_with_an_unreadable_fdinfo_is_partial(tmp_path):
    """A process whose /proc/<pid>/fdinfo the exporter may not read (another user's, without
    CAP_SYS_PTRACE) is skipped by amdsmi without a word: the count says procfs_unreadable."""
    series, out = _counted(tmp_path, busy_ns=(600_000_000, 0, 0), unreadable=(17,))
    assert values_of(series, "gpu_client_evidence", evidence="amdsmi", reason="procfs_unreadable") == [0.0]
    assert _out(out, "gpu_active_clients") == []
    assert _out(out, "gpu_memory_state", state="unknown") == [1.0]


def test_unavailable_when_init_fails_or_no_gpus(tmp_path):
    smi = fake_amdsmi([])
    with pytest.raises(SourceUnavailable, match="no AMD GPUs"):
        AmdsmiSource(SourceContext(sysfs=tmp_path), module=smi).open()

    def boom(*_):
        raise OSError("libamd_smi.so: cannot open shared object file")

    smi2 = fake_amdsmi(["0000:01:00.0"])
    smi2.amdsmi_init = boom
    with pytest.raises(SourceUnavailable, match="amdsmi init failed: OSError"):
        AmdsmiSource(SourceContext(sysfs=tmp_path), module=smi2).open()


def test_import_guard_swallows_keyerror_and_stdout_noise(tmp_path, capfd, monkeypatch):
    pkg = tmp_path / "fake_amdsmi_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "import os\n"
        "print('/opt/rocm/lib/libamd_smi.so: cannot open shared object file: No such file or directory')\n"
        "print('Unable to find libamd_smi.so library try installing amd-smi-lib from your package manager')\n"
        "os.write(1, b'c-level noise\\n')\n"
        "os.write(2, b'c-level err\\n')\n"
        "_libraries = {}\n"
        "x = _libraries['libamd_smi.so']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module, reason = import_amdsmi("fake_amdsmi_pkg")
    out, err = capfd.readouterr()
    assert module is None
    assert reason == "cannot import fake_amdsmi_pkg: KeyError: 'libamd_smi.so'"
    assert out == "" and err == ""
    print("after")                                   # stdout works again afterwards
    assert capfd.readouterr().out == "after\n"
    assert "fake_amdsmi_pkg" not in sys.modules


def test_open_without_the_binding_is_unavailable(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # import raises ModuleNotFoundError
    with pytest.raises(SourceUnavailable, match="cannot import amdsmi: ModuleNotFoundError"):
        AmdsmiSource(SourceContext(sysfs=tmp_path)).open()
