"""The pynvml fake is faithful to the installed nvidia-ml-py: names, constants, errors, fields."""

from __future__ import annotations

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


@pytest.mark.parametrize("name", [
    "c_nvmlUtilization_t", "c_nvmlMemory_t", "c_nvmlMemory_v2_t", "nvmlPciInfo_t", "c_nvmlValue_t",
    "c_nvmlFieldValue_t", "c_nvmlEventData_t", "c_nvmlProcessUtilizationSample_t", "c_nvmlProcessInfo_v2_t",
    "c_nvmlGpmSupport_t", "c_nvmlGpmMetric_t", "c_nvmlGpmMetricsGet_t",
])
def test_struct_fields_match(name):
    real_fields = tuple(f[0] for f in getattr(real, name)._fields_)
    assert getattr(pf, name)._fields_ == real_fields


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
