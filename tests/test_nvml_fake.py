"""The pynvml fake is faithful to the installed nvidia-ml-py: names, constants, errors, function
signatures (keywords), ctypes struct field names and types."""

from __future__ import annotations

import ctypes
import inspect

import pytest

from tests.fakes import pynvml_fake as pf

real = pytest.importorskip("pynvml", reason="nvidia-ml-py not installed")


def test_constants_match_the_real_binding():
    fake = pf.make_module([pf.h100()])
    for name, value in {**pf.ERRORS, **pf.CONSTANTS}.items():
        assert getattr(real, name) == value, name
        assert getattr(fake, name) == value


def test_functions_exist_in_the_real_binding():
    fake = pf.make_module([pf.h100()])
    fns = [n for n in dir(fake) if n.startswith("nvml") and callable(getattr(fake, n))]
    assert len(fns) > 40
    for n in fns:
        assert callable(getattr(real, n, None)), n


def test_error_classes_like_the_real_binding():
    fake = pf.make_module([pf.h100()])
    real_classes = {n for n in dir(real) if n.startswith("NVMLError_")}
    fake_classes = {n for n in dir(fake) if n.startswith("NVMLError_")}
    assert fake_classes == real_classes
    err = fake.NVMLError(fake.NVML_ERROR_GPU_IS_LOST)
    assert type(err) is fake.NVMLError_GpuIsLost and err.value == 15
    assert isinstance(fake.NVMLError_NotSupported(), fake.NVMLError)
    assert fake.nvmlExceptionClass(3) is fake.NVMLError_NotSupported


STRUCTS = [
    "c_nvmlUtilization_t", "c_nvmlMemory_t", "c_nvmlMemory_v2_t", "nvmlPciInfo_t", "c_nvmlValue_t",
    "c_nvmlFieldValue_t", "c_nvmlEventData_t", "c_nvmlProcessUtilizationSample_t", "c_nvmlProcessInfo_v2_t",
    "c_nvmlGpmSupport_t", "c_metricInfo_t", "c_nvmlGpmMetric_t", "c_nvmlGpmMetricsGet_t",
]


def _ctype(struct: str, field: str, t: type, fake: bool) -> tuple:
    """A comparable description of a ctypes field type (same on both sides when faithful)."""
    if fake and (struct, field) in pf.OPAQUE_POINTERS:
        assert t is ctypes.py_object
        return ("pointer", pf.OPAQUE_POINTERS[(struct, field)])
    if issubclass(t, ctypes._Pointer):
        return ("pointer", t._type_.__name__)
    if issubclass(t, ctypes.Array):
        return ("array", _ctype(struct, field, t._type_, fake), t._length_)
    if issubclass(t, (ctypes.Structure, ctypes.Union)):
        kind = "union" if issubclass(t, ctypes.Union) else "struct"
        return (kind, t.__name__, tuple((n, _ctype(t.__name__, n, ft, fake)) for n, ft, *_ in t._fields_))
    return ("scalar", t._type_, ctypes.sizeof(t))


@pytest.mark.parametrize("name", STRUCTS)
def test_struct_field_names_and_ctypes_types_match(name):
    r, f = getattr(real, name), getattr(pf, name)
    assert issubclass(f, ctypes.Union) == issubclass(r, ctypes.Union)
    assert [n for n, *_ in f._fields_] == [n for n, *_ in r._fields_]
    assert _ctype(name, "", f, True) == _ctype(name, "", r, False)
    assert ctypes.sizeof(f) == ctypes.sizeof(r) or any(k[0] == name for k in pf.OPAQUE_POINTERS)


def test_opaque_pointer_fields_are_pointers_in_the_real_binding():
    for (struct, field), target in pf.OPAQUE_POINTERS.items():
        t = dict((n, ft) for n, ft, *_ in getattr(real, struct)._fields_)[field]
        assert issubclass(t, ctypes._Pointer) and t._type_.__name__ == target, (struct, field)


def test_structs_reject_what_the_real_ones_reject():
    for cls in (real.c_nvmlUtilization_t, pf.c_nvmlUtilization_t):
        with pytest.raises(TypeError):
            cls(gpu=1.5)  # a float in an unsigned int field
        assert cls(gpu=-1).gpu == 2**32 - 1  # wraps like C
    for cls in (real.nvmlPciInfo_t, pf.nvmlPciInfo_t):
        info = cls(busId="00000000:17:00.0")
        assert info.busId == "00000000:17:00.0"  # str in, str out (bytes underneath)
        with pytest.raises(TypeError):
            cls(busId=17)
    for cls in (real.c_nvmlValue_t, pf.c_nvmlValue_t):
        v = cls()
        v.ullVal = 2**32 + 7
        assert v.uiVal == 7  # a union: the members share their bytes


def _functions(mod) -> list[str]:
    return sorted(n for n in dir(mod) if n.startswith("nvml") and callable(getattr(mod, n))
                  and not isinstance(getattr(mod, n), type))


def test_every_function_has_the_real_signature():
    """Parameter names, order, kinds and defaults: a keyword call that works on the real binding
    works on the fake, and one that fails there fails here."""
    fake = pf.make_module([pf.h100()])
    fns = _functions(fake)
    assert len(fns) > 40
    def shape(fn) -> list[tuple]:  # annotations aside
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    for n in fns:
        assert shape(getattr(fake, n)) == shape(getattr(real, n)), n


def test_keyword_calls_work_and_wrong_keywords_fail_like_the_real_binding():
    fake = pf.make_module([pf.h100()])
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(index=0)
    assert fake.nvmlDeviceGetClockInfo(handle=h, type=fake.NVML_CLOCK_SM) == 1980
    assert fake.nvmlDeviceGetMemoryInfo(h, version=fake.nvmlMemory_v2).total > 0
    assert fake.nvmlDeviceGetTemperature(h, sensor=fake.NVML_TEMPERATURE_GPU) > 0
    with pytest.raises(TypeError):
        fake.nvmlDeviceGetClockInfo(h, clock_type=fake.NVML_CLOCK_SM)  # not the real name
    with pytest.raises(TypeError):
        fake.nvmlDeviceGetClockInfo(h)  # missing argument
    with pytest.raises(TypeError):
        real.nvmlDeviceGetClockInfo(h, clock_type=0)  # the same mistake fails on the real one too


def test_field_values_carry_per_entry_return_codes():
    fake = pf.make_module([pf.t4()])
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    tx, temp = fake.nvmlDeviceGetFieldValues(h, [(197, 0), 82])
    assert tx.nvmlReturn == 0 and tx.valueType == 3 and tx.value.ullVal == 10
    assert temp.nvmlReturn == fake.NVML_ERROR_NOT_SUPPORTED


def test_gpm_metrics_need_two_ordered_samples():
    fake = pf.make_module([pf.h100()])
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    s1, s2 = fake.nvmlGpmSampleAlloc(), fake.nvmlGpmSampleAlloc()
    mg = fake.c_nvmlGpmMetricsGet_t()
    mg.version, mg.numMetrics, mg.sample1, mg.sample2 = 1, 1, s1, s2
    mg.metrics[0].metricId = 3
    with pytest.raises(fake.NVMLError_InvalidArgument):
        fake.nvmlGpmMetricsGet(mg)  # samples not taken yet
    fake.nvmlGpmSampleGet(h, s1)
    fake.nvmlGpmSampleGet(h, s2)
    fake.nvmlGpmMetricsGet(mg)
    assert (mg.metrics[0].nvmlReturn, mg.metrics[0].value) == (0, 38.25)
    fake.nvmlGpmSampleFree(s1)
    with pytest.raises(fake.NVMLError_InvalidArgument):
        fake.nvmlGpmSampleFree(s1)  # double free is an error


def test_mig_process_lists_answer_per_mig_device_and_the_parent_only_when_privileged():
    """NVML (nvmlDeviceGetComputeRunningProcesses): "In MIG mode, if device handle is provided,
    the API returns aggregate information, only if the caller has appropriate privileges.
    Per-instance information can be queried by using specific MIG device handles." """
    gpu = pf.h100_mig_shared()
    fake = pf.make_module([gpu])
    fake.nvmlInit()
    parent = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(fake.NVMLError_NoPermission):
        fake.nvmlDeviceGetComputeRunningProcesses(handle=parent)
    n = fake.nvmlDeviceGetMaxMigDeviceCount(device=parent)
    got = {}
    for i in range(n):
        try:
            mh = fake.nvmlDeviceGetMigDeviceHandleByIndex(device=parent, index=i)
        except fake.NVMLError_NotFound:
            continue
        got[fake.nvmlDeviceGetGpuInstanceId(mh)] = sorted(p.pid for p in fake.nvmlDeviceGetComputeRunningProcesses(mh))
    assert got == {1: [5101, 5102], 2: [5201]}
    gpu["mig_privileged"] = True
    fake = pf.make_module([gpu])
    fake.nvmlInit()
    everyone = fake.nvmlDeviceGetComputeRunningProcesses(fake.nvmlDeviceGetHandleByIndex(0))
    assert sorted((p.pid, p.gpuInstanceId) for p in everyone) == [(5101, 1), (5102, 1), (5201, 2)]


def test_a_mig_device_handle_names_its_instance_and_goes_stale_when_it_is_destroyed():
    """The handle of a destroyed MIG device answers NOT_FOUND; it never re-points to the
    instance that takes its enumeration slot (the index-based handle of the old fake did)."""
    fake = pf.make_module([pf.h100_mig_shared()])
    fake.nvmlInit()
    parent = fake.nvmlDeviceGetHandleByIndex(0)
    first = fake.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    assert fake.nvmlDeviceGetGpuInstanceId(first) == 1
    fake.fake_destroy_gpu_instance(0, 1)
    for call in (fake.nvmlDeviceGetGpuInstanceId, fake.nvmlDeviceGetComputeRunningProcesses,
                 fake.nvmlDeviceGetMemoryInfo):
        with pytest.raises(fake.NVMLError_NotFound):
            call(first)
    now_first = fake.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    assert fake.nvmlDeviceGetGpuInstanceId(now_first) == 2
