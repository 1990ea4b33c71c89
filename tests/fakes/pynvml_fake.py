"""A faithful fake of the ``pynvml`` module (nvidia-ml-py 13.615.71) driven by scenario data.

Same function names, argument order, return shapes, struct field names, constants, error
classes (``NVMLError_<CapWords>`` generated from the ``NVML_ERROR_*`` codes exactly like the real
binding) and per-entry return codes (``nvmlDeviceGetFieldValues`` entries and GPM metrics carry
their own ``nvmlReturn``).  ``tests/test_nvml_fake.py`` checks names and constant values against
the installed real binding.

``make_module(gpus)`` builds a fresh module object per test; scenario helpers (``h100()``,
``a100_mig()``, ``a100_mig_busy()``, ``t4()``, ``h100_mig()``, ``h100_mig_shared()``,
``h100_mps()``, ``h100_mps_one()``, ``h100_mps_uncountable()``) return plain dicts that a test may
edit.  CUDA MPS, as an H200 showed it (deploy/device-check/nvml_mps_check.py, driver 580.159.04):
a process entry with ``mps: True`` is an MPS client, listed by the compute process list and by
nvmlDeviceGetMPSComputeRunningProcesses (an idle client too); the server is an ordinary entry
(compute list, utilization samples), and clients get no utilization samples (``mps_error``
fails the MPS list).  In MIG mode the parent handle's compute process list answers
NO_PERMISSION unless the GPU's ``mig_privileged`` is set (NVML returns that aggregate only to a
privileged caller); MIG device handles answer for their own instance (``processes_error`` on a
MIG entry makes one fail).  Test controls
are module attributes starting with ``fake_`` (they do not exist in the real binding):
``fake_advance(s)`` moves the fake clock and the counters, ``fake_lose(i)``/``fake_recover(i)``
make GPU i answer GpuIsLost, ``fake_inject_xid(i, code)`` queues an XID event, ``fake_calls``
counts calls per function, ``fake_live_gpm_samples()`` counts samples not freed,
``fake_destroy_gpu_instance(i, gi)`` / ``fake_create_gpu_instance(i, entry)`` reconfigure MIG
(a MIG device handle names its instance: once destroyed it answers NOT_FOUND; a GPU with
``mig_handles: "slot"`` models a handle that is an enumeration index instead).
"""

from __future__ import annotations

import copy
import ctypes
import inspect
import queue
import string
import threading
import types
from collections import Counter
from typing import Any

# ---------------------------------------------------------------------------------------------
# constants (values as in pynvml.py 13.615.71)
ERRORS = {
    "NVML_SUCCESS": 0, "NVML_ERROR_UNINITIALIZED": 1, "NVML_ERROR_INVALID_ARGUMENT": 2,
    "NVML_ERROR_NOT_SUPPORTED": 3, "NVML_ERROR_NO_PERMISSION": 4, "NVML_ERROR_ALREADY_INITIALIZED": 5,
    "NVML_ERROR_NOT_FOUND": 6, "NVML_ERROR_INSUFFICIENT_SIZE": 7, "NVML_ERROR_INSUFFICIENT_POWER": 8,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9, "NVML_ERROR_TIMEOUT": 10, "NVML_ERROR_IRQ_ISSUE": 11,
    "NVML_ERROR_LIBRARY_NOT_FOUND": 12, "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
    "NVML_ERROR_CORRUPTED_INFOROM": 14, "NVML_ERROR_GPU_IS_LOST": 15, "NVML_ERROR_RESET_REQUIRED": 16,
    "NVML_ERROR_OPERATING_SYSTEM": 17, "NVML_ERROR_LIB_RM_VERSION_MISMATCH": 18, "NVML_ERROR_IN_USE": 19,
    "NVML_ERROR_MEMORY": 20, "NVML_ERROR_NO_DATA": 21, "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED": 22,
    "NVML_ERROR_INSUFFICIENT_RESOURCES": 23, "NVML_ERROR_FREQ_NOT_SUPPORTED": 24,
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH": 25, "NVML_ERROR_DEPRECATED": 26, "NVML_ERROR_NOT_READY": 27,
    "NVML_ERROR_GPU_NOT_FOUND": 28, "NVML_ERROR_INVALID_STATE": 29,
    "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED": 30, "NVML_ERROR_UNKNOWN": 999,
}
CONSTANTS: dict[str, int] = {
    "NVML_VALUE_TYPE_DOUBLE": 0, "NVML_VALUE_TYPE_UNSIGNED_INT": 1, "NVML_VALUE_TYPE_UNSIGNED_LONG": 2,
    "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": 3, "NVML_VALUE_TYPE_SIGNED_LONG_LONG": 4,
    "NVML_VALUE_TYPE_SIGNED_INT": 5, "NVML_VALUE_TYPE_UNSIGNED_SHORT": 6,
    "NVML_CLOCK_GRAPHICS": 0, "NVML_CLOCK_SM": 1, "NVML_CLOCK_MEM": 2, "NVML_CLOCK_VIDEO": 3,
    "NVML_TEMPERATURE_GPU": 0,
    "NVML_MEMORY_ERROR_TYPE_CORRECTED": 0, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1,
    "NVML_VOLATILE_ECC": 0, "NVML_AGGREGATE_ECC": 1,
    "nvmlMemory_v2": 0x02000028, "NVML_NVLINK_MAX_LINKS": 36,
    "nvmlEventTypeXidCriticalError": 0x8, "nvmlEventTypeDoubleBitEccError": 0x2,
    "NVML_DEVICE_MIG_DISABLE": 0, "NVML_DEVICE_MIG_ENABLE": 1,
    "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 38, "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": 45,
    "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": 52, "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": 59,
    "NVML_FI_DEV_MEMORY_TEMP": 82, "NVML_FI_DEV_NVLINK_LINK_COUNT": 91, "NVML_FI_DEV_PCIE_REPLAY_COUNTER": 94,
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX": 138, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX": 139,
    "NVML_FI_DEV_POWER_AVERAGE": 185, "NVML_FI_DEV_POWER_INSTANT": 186,
    "NVML_FI_DEV_PCIE_COUNT_TX_BYTES": 197, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES": 198,
    "NVML_GPM_METRIC_GRAPHICS_UTIL": 1, "NVML_GPM_METRIC_SM_UTIL": 2, "NVML_GPM_METRIC_SM_OCCUPANCY": 3,
    "NVML_GPM_METRIC_INTEGER_UTIL": 4, "NVML_GPM_METRIC_ANY_TENSOR_UTIL": 5, "NVML_GPM_METRIC_DRAM_BW_UTIL": 10,
    "NVML_GPM_METRIC_FP64_UTIL": 11, "NVML_GPM_METRIC_FP32_UTIL": 12, "NVML_GPM_METRIC_FP16_UTIL": 13,
    "NVML_GPM_METRIC_PCIE_TX_PER_SEC": 20, "NVML_GPM_METRIC_PCIE_RX_PER_SEC": 21,
    "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC": 60, "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC": 61,
    "NVML_GPM_METRIC_HOSTMEM_CACHE_HIT": 160, "NVML_GPM_METRIC_HOSTMEM_CACHE_MISS": 161,
    "NVML_GPM_METRIC_PEERMEM_CACHE_HIT": 162, "NVML_GPM_METRIC_PEERMEM_CACHE_MISS": 163,
    "NVML_GPM_METRIC_DRAM_CACHE_HIT": 164, "NVML_GPM_METRIC_DRAM_CACHE_MISS": 165,
    "NVML_GPM_METRIC_MAX": 477, "NVML_GPM_METRICS_GET_VERSION": 1, "NVML_GPM_SUPPORT_VERSION": 1,
    "nvmlClocksEventReasonGpuIdle": 0x1, "nvmlClocksEventReasonApplicationsClocksSetting": 0x2,
    "nvmlClocksEventReasonUserDefinedClocks": 0x2, "nvmlClocksEventReasonSwPowerCap": 0x4,
    "nvmlClocksEventReasonHwSlowdown": 0x8, "nvmlClocksEventReasonSyncBoost": 0x10,
    "nvmlClocksEventReasonSwThermalSlowdown": 0x20, "nvmlClocksEventReasonHwThermalSlowdown": 0x40,
    "nvmlClocksEventReasonHwPowerBrakeSlowdown": 0x80, "nvmlClocksEventReasonDisplayClockSetting": 0x100,
    "nvmlClocksEventReasonNone": 0x0, "nvmlClocksEventReasonAll": 0x1FF,
}
# parameter names of the real binding's functions (nvidia-ml-py 13.615.71): the fake accepts
# them as keywords exactly where the real one does (tests/test_nvml_fake.py compares signatures)
PARAMETERS: dict[str, tuple[str, ...]] = {
    'nvmlDeviceGetCurrPcieLinkGeneration': ('handle',),
    'nvmlDeviceGetMaxPcieLinkGeneration': ('handle',),
    'nvmlDeviceGetMaxPcieLinkWidth': ('handle',),
    'nvmlDeviceGetClockInfo': ('handle', 'type'),
    'nvmlDeviceGetComputeInstanceId': ('device',),
    'nvmlDeviceGetComputeRunningProcesses': ('handle',),
    'nvmlDeviceGetComputeRunningProcesses_v3': ('handle',),
    'nvmlDeviceGetMPSComputeRunningProcesses': ('handle',),
    'nvmlDeviceGetMPSComputeRunningProcesses_v3': ('handle',),
    'nvmlDeviceGetCurrPcieLinkWidth': ('handle',),
    'nvmlDeviceGetCurrentClocksEventReasons': ('handle',),
    'nvmlDeviceGetCurrentClocksThrottleReasons': ('handle',),
    'nvmlDeviceGetDecoderUtilization': ('handle',),
    'nvmlDeviceGetEncoderUtilization': ('handle',),
    'nvmlDeviceGetEnforcedPowerLimit': ('handle',),
    'nvmlDeviceGetFanSpeed': ('handle',),
    'nvmlDeviceGetFieldValues': ('handle', 'fieldIds'),
    'nvmlDeviceGetGpuInstanceId': ('device',),
    'nvmlDeviceGetHandleByIndex': ('index',),
    'nvmlDeviceGetMaxClockInfo': ('handle', 'type'),
    'nvmlDeviceGetMaxMigDeviceCount': ('device',),
    'nvmlDeviceGetMemoryBusWidth': ('device',),
    'nvmlDeviceGetMemoryInfo': ('handle', 'version'),
    'nvmlDeviceGetMigDeviceHandleByIndex': ('device', 'index'),
    'nvmlDeviceGetMigMode': ('device',),
    'nvmlDeviceGetName': ('handle',),
    'nvmlDeviceGetNvLinkState': ('device', 'link'),
    'nvmlDeviceGetPciInfo': ('handle',),
    'nvmlDeviceGetPciInfo_v3': ('handle',),
    'nvmlDeviceGetPowerManagementLimitConstraints': ('handle',),
    'nvmlDeviceGetPowerUsage': ('handle',),
    'nvmlDeviceGetProcessUtilization': ('handle', 'timeStamp'),
    'nvmlDeviceGetRemappedRows': ('device',),
    'nvmlDeviceGetSerial': ('handle',),
    'nvmlDeviceGetSupportedClocksEventReasons': ('handle',),
    'nvmlDeviceGetTemperature': ('handle', 'sensor'),
    'nvmlDeviceGetTemperatureV': ('handle', 'sensor', 'version'),
    'nvmlDeviceGetTotalEccErrors': ('handle', 'errorType', 'counterType'),
    'nvmlDeviceGetTotalEnergyConsumption': ('handle',),
    'nvmlDeviceGetUUID': ('handle',),
    'nvmlDeviceGetUtilizationRates': ('handle',),
    'nvmlDeviceRegisterEvents': ('handle', 'eventTypes', 'eventSet'),
    'nvmlEventSetFree': ('eventSet',),
    'nvmlEventSetWait': ('eventSet', 'timeoutms'),
    'nvmlEventSetWait_v2': ('eventSet', 'timeoutms'),
    'nvmlGpmMetricsGet': ('metricsGet',),
    'nvmlGpmMigSampleGet': ('device', 'gpuInstanceId', 'gpmSample'),
    'nvmlGpmQueryDeviceSupport': ('device',),
    'nvmlGpmSampleFree': ('gpmSample',),
    'nvmlGpmSampleGet': ('device', 'gpmSample'),
    'nvmlInitWithFlags': ('flags',),
    'nvmlSystemGetProcessName': ('pid',),
}
ALL_LINKS = 0xFFFFFFFF
INVALID_ID = 0xFFFFFFFF


# ---------------------------------------------------------------------------------------------
# structs: real ctypes structures with the real binding's field names and C types, so a value of
# the wrong type (a float in an integer field, a number in a string field) fails here as it does
# there.  The one difference: fields that hold a pointer to an opaque NVML object (a device
# handle, a GPM sample) are ``py_object`` here, because the fake's handles are Python objects
# (``OPAQUE_POINTERS`` names them; tests/test_nvml_fake.py checks everything else type by type).
class _PrintableStructure(ctypes.Structure):
    """Like the real binding's base class: char arrays read back as str, and str is accepted."""

    def __getattribute__(self, name: str) -> Any:
        value = super().__getattribute__(name)
        return value.decode() if isinstance(value, bytes) else value

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value.encode() if isinstance(value, str) else value)


# field -> name of the opaque struct the real field points to
OPAQUE_POINTERS = {
    ("c_nvmlEventData_t", "device"): "struct_c_nvmlDevice_t",
    ("c_nvmlGpmMetricsGet_t", "sample1"): "struct_c_nvmlGpmSample_t",
    ("c_nvmlGpmMetricsGet_t", "sample2"): "struct_c_nvmlGpmSample_t",
}
_u, _ull, _ll = ctypes.c_uint, ctypes.c_ulonglong, ctypes.c_longlong


class c_nvmlUtilization_t(_PrintableStructure):
    _fields_ = [("gpu", _u), ("memory", _u)]


class c_nvmlMemory_t(_PrintableStructure):
    _fields_ = [("total", _ull), ("free", _ull), ("used", _ull)]


class c_nvmlMemory_v2_t(_PrintableStructure):
    _fields_ = [("version", _u), ("total", _ull), ("reserved", _ull), ("free", _ull), ("used", _ull)]


class nvmlPciInfo_t(_PrintableStructure):
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", _u), ("bus", _u), ("device", _u),
                ("pciDeviceId", _u), ("pciSubSystemId", _u), ("busId", ctypes.c_char * 32)]


class c_nvmlValue_t(ctypes.Union):
    _fields_ = [("dVal", ctypes.c_double), ("uiVal", _u), ("ulVal", ctypes.c_ulong), ("ullVal", _ull),
                ("sllVal", _ll), ("siVal", ctypes.c_int), ("usVal", ctypes.c_ushort)]


class c_nvmlFieldValue_t(_PrintableStructure):
    _fields_ = [("fieldId", _u), ("scopeId", _u), ("timestamp", ctypes.c_int64),
                ("latencyUsec", ctypes.c_int64), ("valueType", _u), ("nvmlReturn", _u),
                ("value", c_nvmlValue_t)]


class c_nvmlEventData_t(_PrintableStructure):
    _fields_ = [("device", ctypes.py_object), ("eventType", _ull), ("eventData", _ull),
                ("gpuInstanceId", _u), ("computeInstanceId", _u)]


class c_nvmlProcessUtilizationSample_t(_PrintableStructure):
    _fields_ = [("pid", _u), ("timeStamp", _ull), ("smUtil", _u), ("memUtil", _u), ("encUtil", _u),
                ("decUtil", _u)]


class c_nvmlProcessInfo_v2_t(_PrintableStructure):
    _fields_ = [("pid", _u), ("usedGpuMemory", _ull), ("gpuInstanceId", _u), ("computeInstanceId", _u)]


class c_nvmlGpmSupport_t(_PrintableStructure):
    _fields_ = [("version", _u), ("isSupportedDevice", _u)]


class c_metricInfo_t(ctypes.Structure):
    _fields_ = [("shortName", ctypes.c_char_p), ("longName", ctypes.c_char_p), ("unit", ctypes.c_char_p)]


class c_nvmlGpmMetric_t(_PrintableStructure):
    _fields_ = [("metricId", _u), ("nvmlReturn", _u), ("value", ctypes.c_double),
                ("metricInfo", c_metricInfo_t)]


class c_nvmlGpmMetricsGet_t(_PrintableStructure):
    _fields_ = [("version", _u), ("numMetrics", _u), ("sample1", ctypes.py_object),
                ("sample2", ctypes.py_object),
                ("metrics", c_nvmlGpmMetric_t * CONSTANTS["NVML_GPM_METRIC_MAX"])]

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        for name in ("sample1", "sample2"):  # a NULL pointer until the caller sets it
            if name not in kw:
                setattr(self, name, None)


class struct_c_nvmlGpmSample_t:
    """Opaque sample handle (the fake records what was sampled, and when)."""

    def __init__(self, serial: int) -> None:
        self.serial = serial
        self.freed = False
        self.taken: tuple[int, int | None, int, float] | None = None  # (gpu, gi, seq, time)


class c_nvmlDevice_t:
    """Opaque device handle; a MIG device handle carries its parent and its (GPU instance,
    compute instance) ids, so once that instance is destroyed the handle answers NOT_FOUND
    instead of re-pointing to whichever instance now sits at its enumeration index."""

    def __init__(self, gpu: int, mig: tuple[int, int] | None = None, slot: int = 0) -> None:
        self.gpu = gpu
        self.mig = mig
        self.slot = slot  # its enumeration index (used only by a GPU with mig_handles="slot")

    def __repr__(self) -> str:
        return f"c_nvmlDevice_t(gpu={self.gpu}, mig={self.mig})"


class c_nvmlEventSet_t:
    def __init__(self) -> None:
        self.queue: queue.Queue[c_nvmlEventData_t] = queue.Queue()
        self.devices: dict[int, int] = {}  # gpu index -> registered mask
        self.freed = False


class NVMLLibraryMismatchError(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# scenarios
def _gpu(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "NVIDIA GPU", "uuid": "GPU-00000000-0000-0000-0000-000000000000",
        "bus_id": "00000000:00:00.0", "serial": "0", "util": (0, 0), "enc": (0, 167000), "dec": (0, 167000),
        "memory": {"total": 0, "reserved": 0, "used": 0, "free": 0}, "temperature": 40,
        "fan": None, "power_mw": 0, "power_limit_mw": 0, "power_limits_mw": (0, 0), "energy_mj": 0,
        "clocks": {0: 0, 1: 0, 2: 0, 3: 0}, "max_clocks": {0: 0, 1: 0, 2: 0, 3: 0}, "bus_width": 0,
        "reasons_supported": 0x1FF, "reasons": 0, "pcie_width": 16,
        # link generation and width are plain ints (a real H200, driver 580: Curr/MaxPcieLinkGeneration
        # 5, Curr/MaxPcieLinkWidth 16, nvidia-smi pcie.link.gen.current/max 5/5)
        "pcie_gen": 4, "pcie_max_gen": 4, "pcie_max_width": 16,
        "fields": {}, "rates": {}, "nvlink_links": 0, "ecc": None, "remapped": None,
        "gpm_supported": False, "gpm": {}, "mig": None, "processes": [], "xid_supported": True,
        "unsupported": set(), "missing": set(), "mig_capable": True,
        # MIG mode: the parent handle's process list answers only a privileged caller (NVML:
        # "aggregate information, only if the caller has appropriate privileges")
        "mig_privileged": False,
        "gpm_unsupported_rc": ERRORS["NVML_ERROR_INVALID_ARGUMENT"],
    }
    base.update(kw)
    return base


def h100(i: int = 0) -> dict[str, Any]:
    """H100 SXM 80GB under load (values from the nvidia-smi capture of a real H100, driver 590.48.01)."""
    mib = 1 << 20
    return _gpu(
        name="NVIDIA H100 80GB HBM3", uuid=f"GPU-h100000{i}-0000-0000-0000-000000000000",
        bus_id=f"00000000:{0x19 + i:02X}:00.0", serial=f"165012345678{i}",
        util=(100, 11), memory={"total": 81559 * mib, "reserved": 479 * mib, "used": 19817 * mib,
                                "free": 61263 * mib},
        temperature=59, power_mw=631950, power_limit_mw=700000, power_limits_mw=(200000, 700000),
        energy_mj=1_234_567_890, clocks={0: 1980, 1: 1980, 2: 2619, 3: 1545},
        max_clocks={0: 1980, 1: 1980, 2: 2619, 3: 1980}, bus_width=5120,
        reasons_supported=0x1FF, reasons=0x4,  # SwPowerCap active
        fields={197: 5_000_000_000, 198: 7_000_000_000, 94: 3, 82: 54, 138: 1_000_000, 139: 2_000_000,
                45: 0, 38: 1, 52: 2, 59: 0},
        rates={197: 1_048_576, 198: 2_097_152},
        nvlink_links=18, ecc=(0, 0), remapped=(0, 0, 0, 0), pcie_gen=5, pcie_max_gen=5,
        gpm_supported=True,
        gpm={1: 97.5, 2: 95.0, 3: 38.25, 5: 61.0, 10: 88.5, 11: 0.0, 12: 12.5, 13: 3.0,
             20: 512.0, 21: 1024.0, 60: 2048.0, 61: 4096.0, 164: 71.0, 165: 29.0},
        processes=[{"pid": 4242, "name": "python3", "mem": 18 * 1024 * mib, "sm": 93},
                   {"pid": 4343, "name": "dcgmproftester", "mem": 1 * 1024 * mib, "sm": 5},
                   {"pid": 4444, "name": "nccl-tests", "mem": 512 * mib, "sm": 1}],
    )


def h100_gpm_held(i: int = 0) -> dict[str, Any]:
    """The H100 at 99 % utilization while another profiler (Nsight Compute, a DCGM profiling
    session) holds the performance counters: every GPM metric reads 0 (dcgm-exporter #662)."""
    g = h100(i)
    g["util"] = (99, 11)
    g["gpm"] = {k: 0.0 for k in g["gpm"]}
    return g


def h100_gpm_held_alone(i: int = 0) -> dict[str, Any]:
    """h100_gpm_held with one busy process: nothing but the held counters could decide."""
    g = h100_gpm_held(i)
    g["processes"] = g["processes"][:1]
    return g


def h100_mig(i: int = 0) -> dict[str, Any]:
    """H100 with MIG: GPM per GPU instance through nvmlGpmMigSampleGet."""
    g = h100(i)
    gib = 1 << 30
    g["mig"] = [
        {"gi": 1, "ci": 0, "profile": "3g.40gb", "memory": {"total": 40 * gib, "reserved": 0, "used": 10 * gib,
                                                            "free": 30 * gib}, "gpm": {3: 40.0, 10: 90.0}},
        {"gi": 2, "ci": 0, "profile": "3g.40gb", "memory": {"total": 40 * gib, "reserved": 0, "used": 2 * gib,
                                                            "free": 38 * gib}, "gpm": {3: 20.0, 10: 10.0}},
    ]
    return g


def h100_mig_shared(i: int = 0) -> dict[str, Any]:
    """h100_mig with compute processes per GPU instance: two in instance 1 (memory-bound: 90 % DRAM
    bandwidth at 40 % occupancy), one in instance 2.  NVML gives no per-process utilization in MIG
    mode; the process list carries each process's gpuInstanceId."""
    g = h100_mig(i)
    gib = 1 << 30
    g["processes"] = [{"pid": 5101, "name": "etl", "mem": 4 * gib, "gi": 1, "ci": 0},
                      {"pid": 5102, "name": "train", "mem": 5 * gib, "gi": 1, "ci": 0},
                      {"pid": 5201, "name": "infer", "mem": 1 * gib, "gi": 2, "ci": 0}]
    return g


MPS_SERVER_PID = 4194301  # beyond any pid a test machine is likely to run (its name is read)


def h100_mps(i: int = 0) -> dict[str, Any]:
    """The H100 (memory-bound signature: 88.5 % DRAM bandwidth, 38.25 % occupancy) shared through
    CUDA MPS by two clients: the utilization samples name the MPS server (nvidia-cuda-mps-server),
    the compute process list the server and the clients, nvmlDeviceGetMPSComputeRunningProcesses
    the clients."""
    g = h100(i)
    mib = 1 << 20
    g["processes"] = [{"pid": MPS_SERVER_PID, "name": "nvidia-cuda-mps-server", "mem": 64 * mib, "sm": 97},
                      {"pid": 7101, "name": "stream_a", "mem": 9 * 1024 * mib, "mps": True},
                      {"pid": 7102, "name": "stream_b", "mem": 9 * 1024 * mib, "mps": True}]
    return g


def h100_mps_one(i: int = 0) -> dict[str, Any]:
    """h100_mps with a single MPS client."""
    g = h100_mps(i)
    g["processes"] = g["processes"][:2]
    return g


def h100_mps_uncountable(i: int = 0) -> dict[str, Any]:
    """h100_mps where the MPS process list answers NO_PERMISSION: the server is the only busy pid."""
    g = h100_mps(i)
    g["mps_error"] = ERRORS["NVML_ERROR_NO_PERMISSION"]
    return g


def a100_mig(i: int = 0) -> dict[str, Any]:
    """A100 40GB with MIG enabled: three instances (two 1g.5gb, one 2g.10gb); no GPM (pre-Hopper)."""
    mib = 1 << 20
    return _gpu(
        name="NVIDIA A100-SXM4-40GB", uuid=f"GPU-a1000000-0000-0000-0000-00000000000{i}",
        bus_id=f"00000000:{0x07 + i:02X}:00.0", serial=f"132032100000{i}", util=(0, 0),
        memory={"total": 40960 * mib, "reserved": 571 * mib, "used": 4845 * mib, "free": 35544 * mib},
        temperature=61, power_mw=409692, power_limit_mw=400000, power_limits_mw=(100000, 400000),
        energy_mj=319_159_391, clocks={0: 1215, 1: 1215, 2: 1215, 3: 1110},
        max_clocks={0: 1410, 1: 1410, 2: 1215, 3: 1290}, bus_width=5120,
        fields={197: 100, 198: 200, 94: 0, 82: 69, 138: 0, 139: 0, 45: 0, 38: 0, 52: 0, 59: 0},
        nvlink_links=12, ecc=(2, 0), remapped=(1, 0, 0, 0),
        unsupported={"nvmlDeviceGetUtilizationRates"},  # not supported while MIG is on
        mig=[
            {"gi": 13, "ci": 0, "profile": "1g.5gb", "memory": {"total": 4864 * mib, "reserved": 0,
                                                               "used": 13 * mib, "free": 4851 * mib}},
            {"gi": 11, "ci": 0, "profile": "1g.5gb", "memory": {"total": 4864 * mib, "reserved": 0,
                                                               "used": 2000 * mib, "free": 2864 * mib}},
            {"gi": 5, "ci": 0, "profile": "2g.10gb", "memory": {"total": 9856 * mib, "reserved": 0,
                                                               "used": 3 * mib, "free": 9853 * mib}},
        ],
    )


def a100_mig_busy(i: int = 0) -> dict[str, Any]:
    """a100_mig with compute processes: two on instance 13, one on instance 11, none on 5.  No
    GPM before Hopper, so the instances report no load signal of their own."""
    g = a100_mig(i)
    mib = 1 << 20
    g["processes"] = [{"pid": 6101, "name": "etl", "mem": 900 * mib, "gi": 13, "ci": 0},
                      {"pid": 6102, "name": "train", "mem": 800 * mib, "gi": 13, "ci": 0},
                      {"pid": 6201, "name": "infer", "mem": 1500 * mib, "gi": 11, "ci": 0}]
    return g


def t4(i: int = 0) -> dict[str, Any]:
    """Tesla T4 (Turing): no GPM, no NVLink, no remapped rows, no v2 memory temperature field."""
    mib = 1 << 20
    return _gpu(
        name="Tesla T4", uuid=f"GPU-7400000{i}-0000-0000-0000-000000000000",
        bus_id=f"00000000:{0x3B + i:02X}:00.0", serial=f"032231800000{i}", util=(35, 20),
        memory={"total": 15360 * mib, "reserved": 258 * mib, "used": 1000 * mib, "free": 14102 * mib},
        temperature=48, power_mw=27500, power_limit_mw=70000, power_limits_mw=(60000, 70000),
        energy_mj=98_765_432, clocks={0: 1590, 1: 1590, 2: 5000, 3: 1470},
        max_clocks={0: 1590, 1: 1590, 2: 5001, 3: 1470}, bus_width=256,
        reasons_supported=0x1EF, reasons=0x1,
        fields={197: 10, 198: 20, 94: 0},  # no NVLink, no memory temperature
        ecc=(0, 0), fan=None, mig_capable=False, pcie_gen=3, pcie_max_gen=3,
        unsupported={"nvmlDeviceGetRemappedRows", "nvmlGpmQueryDeviceSupport", "nvmlGpmSampleGet",
                     "nvmlDeviceGetNvLinkState"},
    )


def _mig_entry(spec: dict[str, Any], h: c_nvmlDevice_t) -> dict[str, Any] | None:
    """The MIG device a MIG device handle stands for, if it still exists: the one with the
    handle's (GPU instance, compute instance) ids, or with ``mig_handles: "slot"`` whichever
    now sits at the handle's enumeration index (NVML does not document what a handle does
    after its instance is destroyed; that mode lets a test check the exporter trusts neither)."""
    migs = spec["mig"] or []
    if spec.get("mig_handles") == "slot":
        return migs[h.slot] if h.slot < len(migs) else None
    return next((m for m in migs if (m["gi"], m["ci"]) == h.mig), None)


# ---------------------------------------------------------------------------------------------
def make_module(gpus: list[dict[str, Any]], driver: str = "590.48.01",
                init_error: int | None = None) -> types.ModuleType:
    """A fresh fake ``pynvml`` module over ``gpus`` (deep-copied; edit via ``fake_state``)."""
    mod = types.ModuleType("pynvml")
    gpus = copy.deepcopy(gpus)
    state: dict[str, Any] = {"init": 0, "time": 1000.0, "seq": 0, "lost": set(), "samples": [],
                             "event_sets": [], "gpus": gpus, "count_override": None}
    calls: Counter[str] = Counter()
    lock = threading.Lock()

    for name, value in {**ERRORS, **CONSTANTS}.items():
        setattr(mod, name, value)
    for cls in (c_nvmlUtilization_t, c_nvmlMemory_t, c_nvmlMemory_v2_t, nvmlPciInfo_t, c_nvmlValue_t,
                c_nvmlFieldValue_t, c_nvmlEventData_t, c_nvmlProcessUtilizationSample_t,
                c_nvmlProcessInfo_v2_t, c_nvmlGpmSupport_t, c_metricInfo_t, c_nvmlGpmMetric_t,
                c_nvmlGpmMetricsGet_t, struct_c_nvmlGpmSample_t, c_nvmlDevice_t, c_nvmlEventSet_t):
        setattr(mod, cls.__name__, cls)
    mod.c_nvmlProcessInfo_v3_t = c_nvmlProcessInfo_v2_t
    mod.NVMLLibraryMismatchError = NVMLLibraryMismatchError

    # -- errors, generated like pynvml._extractNVMLErrorsAsClasses ---------------------------
    class NVMLError(Exception):
        _valClassMapping: dict[int, type] = {}

        def __new__(typ, value):  # noqa: N804 - mirrors the binding
            if typ == NVMLError:
                typ = NVMLError._valClassMapping.get(value, typ)
            obj = Exception.__new__(typ)
            obj.value = value
            return obj

        def __str__(self) -> str:
            return f"NVML error {self.value}"

        def __eq__(self, other: object) -> bool:
            return self.value == getattr(other, "value", None)

        __hash__ = Exception.__hash__

    mod.NVMLError = NVMLError
    for err_name, err_val in ERRORS.items():
        if not err_name.startswith("NVML_ERROR_"):
            continue
        cname = "NVMLError_" + string.capwords(err_name.replace("NVML_ERROR_", ""), "_").replace("_", "")

        def gen_new(val: int):
            def new(typ, *args):
                return NVMLError.__new__(typ, val)
            return new

        cls = type(cname, (NVMLError,), {"__new__": gen_new(err_val)})
        cls.__module__ = "pynvml"
        setattr(mod, cname, cls)
        NVMLError._valClassMapping[err_val] = cls

    def nvmlExceptionClass(nvmlErrorCode: int) -> type:
        if nvmlErrorCode not in NVMLError._valClassMapping:
            raise ValueError(f"nvmlErrorCode {nvmlErrorCode} is not valid")
        return NVMLError._valClassMapping[nvmlErrorCode]

    mod.nvmlExceptionClass = nvmlExceptionClass

    def fail(code: int) -> None:
        raise NVMLError(code)

    # -- plumbing -----------------------------------------------------------------------------
    def api(fn):
        """Register ``fn`` under its name: counts calls, checks init, applies lost/unsupported."""
        name = fn.__name__
        own = inspect.signature(fn)
        published = own.replace(parameters=[
            inspect.Parameter(real_name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=p.default)
            for real_name, p in zip(PARAMETERS.get(name, ()), own.parameters.values(), strict=True)],
            return_annotation=inspect.Signature.empty)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            bound = published.bind(*args, **kwargs)  # TypeError like the real function's
            bound.apply_defaults()
            args = bound.args
            with lock:
                calls[name] += 1
            if name not in ("nvmlInit", "nvmlInitWithFlags") and state["init"] <= 0:
                fail(ERRORS["NVML_ERROR_UNINITIALIZED"])
            dev = next((a for a in args if isinstance(a, c_nvmlDevice_t)), None)
            if dev is not None:
                if dev.gpu in state["lost"]:
                    fail(ERRORS["NVML_ERROR_GPU_IS_LOST"])
                spec = gpus[dev.gpu]
                if dev.mig is not None and _mig_entry(spec, dev) is None:
                    # the MIG device was destroyed (reconfiguration): its handle is stale.  NVML
                    # documents instance ids as valid "until the GPU instance is destroyed" but
                    # not the code a stale handle gets; NOT_FOUND, as for an empty MIG slot
                    fail(ERRORS["NVML_ERROR_NOT_FOUND"])
                if name in spec["missing"]:
                    fail(ERRORS["NVML_ERROR_FUNCTION_NOT_FOUND"])
                if name in spec["unsupported"] and not (dev.mig is not None and name.startswith("nvmlGpm")):
                    fail(ERRORS["NVML_ERROR_NOT_SUPPORTED"])
            return fn(*args)

        wrapper.__name__ = name
        wrapper.__signature__ = published  # type: ignore[attr-defined]
        setattr(mod, name, wrapper)
        return wrapper

    def spec_of(h: c_nvmlDevice_t) -> dict[str, Any]:
        return gpus[h.gpu]

    def mig_of(h: c_nvmlDevice_t) -> dict[str, Any] | None:
        return None if h.mig is None else _mig_entry(gpus[h.gpu], h)

    # -- init / system ----------------------------------------------------------------------------
    @api
    def nvmlInitWithFlags(flags: int) -> None:
        if init_error is not None:
            fail(init_error)
        state["init"] += 1

    @api
    def nvmlInit() -> None:
        nvmlInitWithFlags(0)

    @api
    def nvmlShutdown() -> None:
        state["init"] -= 1

    @api
    def nvmlSystemGetDriverVersion() -> str:
        return driver

    @api
    def nvmlSystemGetProcessName(pid: int) -> str:
        for g in gpus:
            for p in g["processes"]:
                if p["pid"] == pid:
                    return "/usr/bin/" + p["name"]
        fail(ERRORS["NVML_ERROR_NOT_FOUND"])

    @api
    def nvmlDeviceGetCount() -> int:
        return len(gpus) if state["count_override"] is None else state["count_override"]

    @api
    def nvmlDeviceGetHandleByIndex(index: int) -> c_nvmlDevice_t:
        if not 0 <= index < nvmlDeviceGetCount():
            fail(ERRORS["NVML_ERROR_INVALID_ARGUMENT"])
        return c_nvmlDevice_t(index)

    # -- identity -------------------------------------------------------------------------------------
    @api
    def nvmlDeviceGetUUID(h: c_nvmlDevice_t) -> str:
        m = mig_of(h)
        return f"MIG-{spec_of(h)['uuid'][4:]}-{m['gi']}.{m['ci']}" if m else spec_of(h)["uuid"]

    @api
    def nvmlDeviceGetName(h: c_nvmlDevice_t) -> str:
        m = mig_of(h)
        base = spec_of(h)["name"]
        return f"{base} MIG {m['profile']}" if m else base

    @api
    def nvmlDeviceGetSerial(h: c_nvmlDevice_t) -> str:
        return spec_of(h)["serial"]

    @api
    def nvmlDeviceGetPciInfo(h: c_nvmlDevice_t) -> nvmlPciInfo_t:
        bus = spec_of(h)["bus_id"].encode()
        return nvmlPciInfo_t(busId=bus, busIdLegacy=bus[4:])

    mod.nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo

    # -- telemetry ------------------------------------------------------------------------------------
    @api
    def nvmlDeviceGetUtilizationRates(h: c_nvmlDevice_t) -> c_nvmlUtilization_t:
        if h.mig is not None:
            fail(ERRORS["NVML_ERROR_NOT_SUPPORTED"])
        g, m = spec_of(h)["util"]
        return c_nvmlUtilization_t(gpu=g, memory=m)

    @api
    def nvmlDeviceGetEncoderUtilization(h: c_nvmlDevice_t) -> list[int]:
        return list(spec_of(h)["enc"])

    @api
    def nvmlDeviceGetDecoderUtilization(h: c_nvmlDevice_t) -> list[int]:
        return list(spec_of(h)["dec"])

    @api
    def nvmlDeviceGetMemoryInfo(h: c_nvmlDevice_t, version: int | None = None) -> Any:
        m = mig_of(h)
        mem = m["memory"] if m else spec_of(h)["memory"]
        if not version:  # v1: used includes the reserved part
            return c_nvmlMemory_t(total=mem["total"], free=mem["free"], used=mem["used"] + mem["reserved"])
        if version != CONSTANTS["nvmlMemory_v2"]:
            fail(ERRORS["NVML_ERROR_ARGUMENT_VERSION_MISMATCH"])
        if "nvmlDeviceGetMemoryInfo_v2" in spec_of(h)["missing"]:
            fail(ERRORS["NVML_ERROR_FUNCTION_NOT_FOUND"])
        return c_nvmlMemory_v2_t(version=version, **mem)

    @api
    def nvmlDeviceGetTemperatureV(h: c_nvmlDevice_t, sensor: int, version: int = 0x100000C) -> int:
        if sensor != 0:
            fail(ERRORS["NVML_ERROR_INVALID_ARGUMENT"])
        return spec_of(h)["temperature"]

    @api
    def nvmlDeviceGetTemperature(h: c_nvmlDevice_t, sensor: int) -> int:
        return spec_of(h)["temperature"]

    @api
    def nvmlDeviceGetFanSpeed(h: c_nvmlDevice_t) -> int:
        fan = spec_of(h)["fan"]
        if fan is None:
            fail(ERRORS["NVML_ERROR_NOT_SUPPORTED"])
        return fan

    @api
    def nvmlDeviceGetCurrPcieLinkWidth(h: c_nvmlDevice_t) -> int:
        return spec_of(h)["pcie_width"]

    @api
    def nvmlDeviceGetCurrPcieLinkGeneration(h: c_nvmlDevice_t) -> int:
        return spec_of(h)["pcie_gen"]

    @api
    def nvmlDeviceGetMaxPcieLinkGeneration(h: c_nvmlDevice_t) -> int:
        return spec_of(h)["pcie_max_gen"]

    @api
    def nvmlDeviceGetMaxPcieLinkWidth(h: c_nvmlDevice_t) -> int:
        return spec_of(h)["pcie_max_width"]

    @api
    def nvmlDeviceGetPowerUsage(h: c_nvmlDevice_t) -> int:
        return spec_of(h)["power_mw"]

    @api
    def nvmlDeviceGetEnforcedPowerLimit(h: c_nvmlDevice_t) -> int:
        return spec_of(h)["power_limit_mw"]

    @api
    def nvmlDeviceGetPowerManagementLimitConstraints(h: c_nvmlDevice_t) -> list[int]:
        return list(spec_of(h)["power_limits_mw"])

    @api
    def nvmlDeviceGetTotalEnergyConsumption(h: c_nvmlDevice_t) -> int:
        return int(spec_of(h)["energy_mj"])

    @api
    def nvmlDeviceGetClockInfo(h: c_nvmlDevice_t, clock_type: int) -> int:
        return spec_of(h)["clocks"][clock_type]

    @api
    def nvmlDeviceGetMaxClockInfo(h: c_nvmlDevice_t, clock_type: int) -> int:
        return spec_of(h)["max_clocks"][clock_type]

    @api
    def nvmlDeviceGetMemoryBusWidth(h: c_nvmlDevice_t) -> int:
        return spec_of(h)["bus_width"]

    @api
    def nvmlDeviceGetSupportedClocksEventReasons(h: c_nvmlDevice_t) -> int:
        return spec_of(h)["reasons_supported"]

    @api
    def nvmlDeviceGetCurrentClocksEventReasons(h: c_nvmlDevice_t) -> int:
        return spec_of(h)["reasons"]

    @api
    def nvmlDeviceGetCurrentClocksThrottleReasons(h: c_nvmlDevice_t) -> int:
        return spec_of(h)["reasons"]

    @api
    def nvmlDeviceGetTotalEccErrors(h: c_nvmlDevice_t, error_type: int, counter_type: int) -> int:
        ecc = spec_of(h)["ecc"]
        if ecc is None:
            fail(ERRORS["NVML_ERROR_NOT_SUPPORTED"])
        return ecc[error_type]

    @api
    def nvmlDeviceGetRemappedRows(h: c_nvmlDevice_t) -> tuple[int, int, int, int]:
        rows = spec_of(h)["remapped"]
        if rows is None:
            fail(ERRORS["NVML_ERROR_NOT_SUPPORTED"])
        return tuple(rows)

    @api
    def nvmlDeviceGetNvLinkState(h: c_nvmlDevice_t, link: int) -> int:
        n = spec_of(h)["nvlink_links"]
        if n == 0:
            fail(ERRORS["NVML_ERROR_NOT_SUPPORTED"])
        if link >= n:
            fail(ERRORS["NVML_ERROR_INVALID_ARGUMENT"])
        return 1

    value_types = {82: 1, 94: 1, 38: 3, 45: 3, 52: 3, 59: 3, 138: 3, 139: 3, 197: 3, 198: 3}

    @api
    def nvmlDeviceGetFieldValues(h: c_nvmlDevice_t, field_ids: list[Any]) -> list[c_nvmlFieldValue_t]:
        spec = spec_of(h)
        out = []
        for fid in field_ids:
            try:
                fid, scope = fid
            except TypeError:
                scope = 0
            fv = c_nvmlFieldValue_t(fieldId=fid, scopeId=scope, timestamp=int(state["time"] * 1e6),
                                    latencyUsec=0, value=c_nvmlValue_t())
            value = spec["fields"].get(fid)
            if fid in (138, 139) and value is not None and scope != ALL_LINKS:
                n = spec["nvlink_links"]
                value = value // n if scope < n else None
            if value is None:
                fv.nvmlReturn = ERRORS["NVML_ERROR_NOT_SUPPORTED"]
            else:
                fv.nvmlReturn = 0
                fv.valueType = value_types.get(fid, 3)
                member = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")[fv.valueType]
                setattr(fv.value, member, value)
            out.append(fv)
        return out

    # -- MIG ------------------------------------------------------------------------------------------
    @api
    def nvmlDeviceGetMigMode(h: c_nvmlDevice_t) -> list[int]:
        if not spec_of(h)["mig_capable"]:
            fail(ERRORS["NVML_ERROR_NOT_SUPPORTED"])
        if spec_of(h)["mig"] is None:
            return [0, 0]
        return [1, 1]

    @api
    def nvmlDeviceGetMaxMigDeviceCount(h: c_nvmlDevice_t) -> int:
        return 7 if spec_of(h)["mig"] is not None else 0

    @api
    def nvmlDeviceGetMigDeviceHandleByIndex(h: c_nvmlDevice_t, index: int) -> c_nvmlDevice_t:
        migs = spec_of(h)["mig"] or []
        if index >= 7:
            fail(ERRORS["NVML_ERROR_INVALID_ARGUMENT"])
        if index >= len(migs):
            fail(ERRORS["NVML_ERROR_NOT_FOUND"])
        return c_nvmlDevice_t(h.gpu, (migs[index]["gi"], migs[index]["ci"]), index)

    @api
    def nvmlDeviceGetGpuInstanceId(h: c_nvmlDevice_t) -> int:
        m = mig_of(h)
        if m is None:
            fail(ERRORS["NVML_ERROR_INVALID_ARGUMENT"])
        return m["gi"]

    @api
    def nvmlDeviceGetComputeInstanceId(h: c_nvmlDevice_t) -> int:
        m = mig_of(h)
        if m is None:
            fail(ERRORS["NVML_ERROR_INVALID_ARGUMENT"])
        return m["ci"]

    # -- GPM ------------------------------------------------------------------------------------------
    @api
    def nvmlGpmQueryDeviceSupport(h: c_nvmlDevice_t) -> c_nvmlGpmSupport_t:
        return c_nvmlGpmSupport_t(version=1, isSupportedDevice=1 if spec_of(h)["gpm_supported"] else 0)

    @api
    def nvmlGpmSampleAlloc() -> struct_c_nvmlGpmSample_t:
        s = struct_c_nvmlGpmSample_t(len(state["samples"]))
        state["samples"].append(s)
        return s

    @api
    def nvmlGpmSampleFree(sample: struct_c_nvmlGpmSample_t) -> None:
        if sample.freed:
            fail(ERRORS["NVML_ERROR_INVALID_ARGUMENT"])
        sample.freed = True

    def _take(h: c_nvmlDevice_t, gi: int | None, sample: struct_c_nvmlGpmSample_t) -> None:
        if sample.freed:
            fail(ERRORS["NVML_ERROR_INVALID_ARGUMENT"])
        if not spec_of(h)["gpm_supported"]:
            fail(ERRORS["NVML_ERROR_NOT_SUPPORTED"])
        state["seq"] += 1
        sample.taken = (h.gpu, gi, state["seq"], state["time"])

    @api
    def nvmlGpmSampleGet(h: c_nvmlDevice_t, sample: struct_c_nvmlGpmSample_t) -> struct_c_nvmlGpmSample_t:
        if spec_of(h)["mig"] is not None:
            fail(ERRORS["NVML_ERROR_NOT_SUPPORTED"])  # device-level GPM is off in MIG mode
        _take(h, None, sample)
        return sample

    @api
    def nvmlGpmMigSampleGet(h: c_nvmlDevice_t, gi: int, sample: struct_c_nvmlGpmSample_t) -> struct_c_nvmlGpmSample_t:
        if not any(m["gi"] == gi for m in spec_of(h)["mig"] or []):
            fail(ERRORS["NVML_ERROR_INVALID_ARGUMENT"])
        _take(h, gi, sample)
        return sample

    @api
    def nvmlGpmMetricsGet(mg: c_nvmlGpmMetricsGet_t) -> c_nvmlGpmMetricsGet_t:
        if mg.version != CONSTANTS["NVML_GPM_METRICS_GET_VERSION"]:
            fail(ERRORS["NVML_ERROR_ARGUMENT_VERSION_MISMATCH"])
        s1, s2 = mg.sample1, mg.sample2
        if s1 is None or s2 is None or s1.taken is None or s2.taken is None or s1.freed or s2.freed:
            fail(ERRORS["NVML_ERROR_INVALID_ARGUMENT"])
        if s1.taken[:2] != s2.taken[:2] or s2.taken[2] <= s1.taken[2]:
            fail(ERRORS["NVML_ERROR_INVALID_ARGUMENT"])
        gpu, gi = s1.taken[0], s1.taken[1]
        if gpu in state["lost"]:
            fail(ERRORS["NVML_ERROR_GPU_IS_LOST"])
        values = gpus[gpu]["gpm"] if gi is None else next(m for m in gpus[gpu]["mig"] if m["gi"] == gi).get("gpm", {})
        if not 0 < mg.numMetrics <= CONSTANTS["NVML_GPM_METRIC_MAX"]:
            fail(ERRORS["NVML_ERROR_INVALID_ARGUMENT"])
        for i in range(mg.numMetrics):
            m = mg.metrics[i]
            if m.metricId in values:
                m.nvmlReturn, m.value = 0, float(values[m.metricId])
            else:  # a real H200 (driver 580.159.04) answers INVALID_ARGUMENT for unsupported ids
                m.nvmlReturn, m.value = gpus[gpu]["gpm_unsupported_rc"], 0.0
        return mg

    # -- events ---------------------------------------------------------------------------------------
    @api
    def nvmlEventSetCreate() -> c_nvmlEventSet_t:
        es = c_nvmlEventSet_t()
        state["event_sets"].append(es)
        return es

    @api
    def nvmlDeviceRegisterEvents(h: c_nvmlDevice_t, event_types: int, es: c_nvmlEventSet_t) -> None:
        if not spec_of(h)["xid_supported"]:
            fail(ERRORS["NVML_ERROR_NOT_SUPPORTED"])
        es.devices[h.gpu] = es.devices.get(h.gpu, 0) | int(event_types)

    @api
    def nvmlEventSetWait_v2(es: c_nvmlEventSet_t, timeoutms: int) -> c_nvmlEventData_t:
        if es.freed:
            fail(ERRORS["NVML_ERROR_INVALID_ARGUMENT"])
        try:
            return es.queue.get(timeout=timeoutms / 1000.0)
        except queue.Empty:
            fail(ERRORS["NVML_ERROR_TIMEOUT"])

    @api
    def nvmlEventSetWait(es: c_nvmlEventSet_t, timeoutms: int) -> c_nvmlEventData_t:
        return nvmlEventSetWait_v2(es, timeoutms)

    @api
    def nvmlEventSetFree(es: c_nvmlEventSet_t) -> None:
        es.freed = True

    # -- processes ------------------------------------------------------------------------------------
    @api
    def nvmlDeviceGetComputeRunningProcesses(h: c_nvmlDevice_t) -> list[Any]:
        spec, m = spec_of(h), mig_of(h)
        if m is None and spec["mig"] is not None and not spec["mig_privileged"]:
            fail(ERRORS["NVML_ERROR_NO_PERMISSION"])  # the parent handle in MIG mode, unprivileged
        if m is not None and m.get("processes_error"):
            fail(m["processes_error"])  # a MIG device that cannot answer (test control)
        return _process_list(spec, m, mps=False)

    def _process_list(spec: dict[str, Any], m: dict[str, Any] | None, mps: bool) -> list[Any]:
        out = []
        for p in spec["processes"]:
            if mps and not p.get("mps"):
                continue  # the MPS list: its clients only; the compute list: server and clients
            if m is not None and (p.get("gi"), p.get("ci", 0)) != (m["gi"], m["ci"]):
                continue  # a MIG device handle answers for its own instance only
            out.append(types.SimpleNamespace(pid=p["pid"], usedGpuMemory=p.get("mem"),
                                             gpuInstanceId=p.get("gi", INVALID_ID),
                                             computeInstanceId=p.get("ci", INVALID_ID)))
        return out

    mod.nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses

    @api
    def nvmlDeviceGetMPSComputeRunningProcesses(h: c_nvmlDevice_t) -> list[Any]:
        """The MPS clients (entries with ``mps: True``); ``mps_error`` on the GPU makes the call
        fail with that code (an unprivileged caller, a driver or vGPU without it)."""
        spec, m = spec_of(h), mig_of(h)
        if spec.get("mps_error"):
            fail(spec["mps_error"])
        if m is None and spec["mig"] is not None and not spec["mig_privileged"]:
            fail(ERRORS["NVML_ERROR_NO_PERMISSION"])  # as the compute list: the parent in MIG mode
        return _process_list(spec, m, mps=True)

    mod.nvmlDeviceGetMPSComputeRunningProcesses_v3 = nvmlDeviceGetMPSComputeRunningProcesses

    @api
    def nvmlDeviceGetProcessUtilization(h: c_nvmlDevice_t, timestamp: int) -> list[Any]:
        # MPS clients have no samples of their own: the server's pid carries their work (issue 36,
        # measured on the reporter's GPUs; nvml.h does not say which pid a sample names)
        now_us = int(state["time"] * 1e6)
        samples = [c_nvmlProcessUtilizationSample_t(pid=p["pid"], timeStamp=now_us, smUtil=p.get("sm", 0),
                                                    memUtil=0, encUtil=0, decUtil=0)
                   for p in spec_of(h)["processes"] if "sm" in p and not p.get("mps") and now_us > timestamp]
        if not samples:
            fail(ERRORS["NVML_ERROR_NOT_FOUND"])
        return samples

    # -- test controls --------------------------------------------------------------------------------
    def fake_advance(seconds: float) -> None:
        state["time"] += seconds
        for g in gpus:
            g["energy_mj"] += g["power_mw"] * seconds
            for fid, rate in g["rates"].items():
                g["fields"][fid] = g["fields"].get(fid, 0) + int(rate * seconds)

    def fake_lose(index: int) -> None:
        state["lost"].add(index)

    def fake_recover(index: int) -> None:
        state["lost"].discard(index)

    def fake_inject_xid(index: int, code: int) -> None:
        for es in state["event_sets"]:
            if not es.freed and es.devices.get(index, 0) & CONSTANTS["nvmlEventTypeXidCriticalError"]:
                es.queue.put(c_nvmlEventData_t(device=c_nvmlDevice_t(index), eventType=0x8, eventData=code,
                                               gpuInstanceId=INVALID_ID, computeInstanceId=INVALID_ID))

    def fake_live_gpm_samples() -> int:
        return sum(1 for s in state["samples"] if not s.freed)

    def fake_destroy_gpu_instance(index: int, gi: int) -> None:
        """MIG reconfiguration: GPU instance ``gi`` of GPU ``index`` (and its compute instances)
        goes away with the processes that ran in it; handles to it answer NOT_FOUND."""
        g = gpus[index]
        g["mig"] = [m for m in g["mig"] if m["gi"] != gi]
        g["processes"] = [p for p in g["processes"] if p.get("gi") != gi]

    def fake_create_gpu_instance(index: int, entry: dict[str, Any]) -> None:
        """MIG reconfiguration: a new MIG device (``gi``, ``ci``, ``profile``, ``memory``) in
        the first free enumeration slot (where a destroyed one was)."""
        gpus[index]["mig"].insert(0, entry)

    mod.fake_state = state
    mod.fake_calls = calls
    mod.fake_advance = fake_advance
    mod.fake_lose = fake_lose
    mod.fake_recover = fake_recover
    mod.fake_inject_xid = fake_inject_xid
    mod.fake_live_gpm_samples = fake_live_gpm_samples
    mod.fake_destroy_gpu_instance = fake_destroy_gpu_instance
    mod.fake_create_gpu_instance = fake_create_gpu_instance
    mod.fake_time = lambda: state["time"]
    return mod
