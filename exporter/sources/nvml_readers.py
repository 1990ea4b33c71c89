"""Per-GPU NVML readers: one function per group of NVML calls, raw names and raw units.

Raw field names follow NVML (units in brackets); ``mappings/nvml.yaml`` converts them:
  utilization.gpu / utilization.memory / utilization.encoder / utilization.decoder [%]
  memory.total / memory.used / memory.free / memory.reserved [bytes] (memory info v2;
      ``memory_v1.used`` when only v1 exists: it includes the reserved part)
  temperature.gpu [degC]   fan.speed [%]   pcie.link_width [lanes]   pcie.link_gen [generation]
  power.usage [mW]  power.limit.enforced [mW]  power.limit.max [mW]  energy.total [mJ]
  clock.<graphics|sm|memory|video> [MHz]   clock_max.<...> [MHz]   memory.bus_width [bits]
  clocks_event_reasons.<Reason> [0/1]  (Reason = suffix of the binding's nvmlClocksEventReason*)
  field.<NAME> (nvmlDeviceGetFieldValues, NAME = suffix of NVML_FI_DEV_<NAME>, raw value;
      per-link scoped ones carry a ``link`` label)
  ecc.volatile.corrected / ecc.volatile.uncorrected [count since driver load]
  remapped_rows.correctable / .uncorrectable [rows], .pending / .failure [0/1]
Static values (max clocks, bus width, max power limit) are read once per discovery.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .base import Device, PollResult
from .nvml_calls import LOST_CODES, SUCCESS, CallGuard, DeviceLost

_CI_PREFIX = re.compile(r"^\d+c\.")  # a compute instance's profile: <n>c.<gpu instance profile>
CLOCKS = (("graphics", "NVML_CLOCK_GRAPHICS"), ("sm", "NVML_CLOCK_SM"),
          ("memory", "NVML_CLOCK_MEM"), ("video", "NVML_CLOCK_VIDEO"))

# nvmlDeviceGetFieldValues requests: (NVML_FI_DEV_<NAME>, scope).  scope None = device-wide,
# "all_links" = the NVLink aggregate (scopeId UINT_MAX), "per_link" = one entry per active link.
DEFAULT_FIELDS: tuple[tuple[str, str | None], ...] = (
    ("PCIE_COUNT_TX_BYTES", None), ("PCIE_COUNT_RX_BYTES", None), ("PCIE_REPLAY_COUNTER", None),
    ("MEMORY_TEMP", None),
    ("NVLINK_THROUGHPUT_DATA_TX", "links"), ("NVLINK_THROUGHPUT_DATA_RX", "links"),
    ("NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", None), ("NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", None),
    ("NVLINK_REPLAY_ERROR_COUNT_TOTAL", None), ("NVLINK_RECOVERY_ERROR_COUNT_TOTAL", None),
)
ALL_LINKS = 0xFFFFFFFF

# c_nvmlValue_t member per NVML_VALUE_TYPE_* (0..6)
VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


@dataclass
class FieldRequest:
    name: str                      # raw field name, field.<NAME>
    field_id: int
    scope: int = 0
    labels: tuple[tuple[str, str], ...] = ()


@dataclass
class MigInstance:
    """One MIG device, as a MIG scan found it; its label tuples are built once, by the scan."""

    handle: Any
    gpu_instance: int
    compute_instance: int
    profile: str
    labels: tuple[tuple[str, str], ...] = field(init=False)     # this compute instance's
    gi_labels: tuple[tuple[str, str], ...] = field(init=False)  # its GPU instance's

    def __post_init__(self) -> None:
        gi = str(self.gpu_instance)
        self.labels = (("gpu_instance", gi), ("compute_instance", str(self.compute_instance)),
                       ("mig_profile", self.profile))
        # the GPU instance's profile: ``1c.2g.10gb`` -> ``2g.10gb`` (compute-instance prefix off)
        self.gi_labels = (("gpu_instance", gi), ("mig_profile", _CI_PREFIX.sub("", self.profile)))


@dataclass
class GpuState:
    index: int
    device: Device
    handle: Any = None
    up: bool = True
    static: list[tuple[str, float]] = field(default_factory=list)
    reason_bits: list[tuple[str, int]] = field(default_factory=list)
    fields: list[FieldRequest] = field(default_factory=list)
    gpm: bool = False
    mig: list[MigInstance] = field(default_factory=list)
    polls_since_mig_scan: int = 0
    mig_stale: bool = False  # a MIG read failed since the last scan: rescan on the next poll

    @property
    def key(self) -> str:
        return self.device.key


def clock_event_reason_bits(nvml: Any, supported_mask: int | None) -> list[tuple[str, int]]:
    """(name, bit) for each single-bit nvmlClocksEventReason* constant of the binding."""
    seen: set[int] = set()
    out: list[tuple[str, int]] = []
    prefix = "nvmlClocksEventReason"
    for attr in sorted(dir(nvml)):
        if not attr.startswith(prefix):
            continue
        bit = getattr(nvml, attr)
        if not isinstance(bit, int) or bit <= 0 or bit & (bit - 1) or bit in seen:
            continue
        if attr in (f"{prefix}UserDefinedClocks",):  # deprecated alias of ApplicationsClocksSetting
            continue
        if supported_mask is not None and not supported_mask & bit:
            continue
        seen.add(bit)
        out.append((attr[len(prefix):], bit))
    return sorted(out, key=lambda x: x[1])


def field_requests(nvml: Any, spec: tuple[tuple[str, str | None], ...], links: list[int],
                   per_link: bool) -> list[FieldRequest]:
    reqs: list[FieldRequest] = []
    for name, scope in spec:
        fid = getattr(nvml, f"NVML_FI_DEV_{name}", None)
        if not isinstance(fid, int):
            continue
        raw = f"field.{name}"
        if scope == "links":
            if per_link:
                reqs += [FieldRequest(raw, fid, link, (("link", str(link)),)) for link in links]
            else:
                reqs.append(FieldRequest(raw, fid, ALL_LINKS))
        else:
            reqs.append(FieldRequest(raw, fid, 0))
    return reqs


def field_value(fv: Any) -> float | None:
    vt = int(fv.valueType)
    if 0 <= vt < len(VALUE_MEMBERS):
        return getattr(fv.value, VALUE_MEMBERS[vt])
    return None


class DeviceReader:
    """Reads one GPU per call; raises DeviceLost when the GPU stops answering."""

    def __init__(self, nvml: Any, guard: CallGuard) -> None:
        self.nvml = nvml
        self.guard = guard

    # -- discovery-time (static) --------------------------------------------------------------
    def read_static(self, errors: Counter[str], st: GpuState) -> None:
        nv, g, k, h = self.nvml, self.guard, st.key, st.handle
        st.static = []
        for name, const in CLOCKS:
            v = g.call(errors, k, f"clock_max.{name}", "nvmlDeviceGetMaxClockInfo", h, getattr(nv, const))
            if v is not None:
                st.static.append((f"clock_max.{name}", v))
        v = g.call(errors, k, "memory.bus_width", "nvmlDeviceGetMemoryBusWidth", h)
        if v is not None:
            st.static.append(("memory.bus_width", v))
        # what the device and its slot support: the reference for a downtrained link
        for raw, fn in (("pcie.max_link_gen", "nvmlDeviceGetMaxPcieLinkGeneration"),
                        ("pcie.max_link_width", "nvmlDeviceGetMaxPcieLinkWidth")):
            v = g.call(errors, k, raw, fn, h)
            if v is not None:
                st.static.append((raw, v))
        v = g.call(errors, k, "power.limit.max", "nvmlDeviceGetPowerManagementLimitConstraints", h)
        if v is not None:
            st.static.append(("power.limit.max", v[1]))
        mask = g.call(errors, k, "clocks_event_reasons.supported",
                      "nvmlDeviceGetSupportedClocksEventReasons", h)
        st.reason_bits = clock_event_reason_bits(nv, mask)

    def active_links(self, errors: Counter[str], st: GpuState) -> list[int]:
        nv = self.nvml
        links: list[int] = []
        for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                if nv.nvmlDeviceGetNvLinkState(st.handle, link):
                    links.append(link)
            except nv.NVMLError as exc:
                if exc.value in LOST_CODES:
                    raise DeviceLost(exc.value) from None
                break  # NotSupported (no NVLink) or InvalidArgument (past the last link)
        return links

    # -- every poll ----------------------------------------------------------------------------
    def read(self, sample: PollResult, st: GpuState) -> None:
        nv, g, k, h = self.nvml, self.guard, st.key, st.handle
        errors = sample.errors
        add = sample.add

        def call(fieldname: str, fn: str, *args: Any) -> Any:
            return g.call(errors, k, fieldname, fn, h, *args)

        util = call("utilization", "nvmlDeviceGetUtilizationRates")
        if util is not None:
            add(k, "utilization.gpu", util.gpu)
            add(k, "utilization.memory", util.memory)
        for eng, fn in (("encoder", "nvmlDeviceGetEncoderUtilization"),
                        ("decoder", "nvmlDeviceGetDecoderUtilization")):
            v = call(f"utilization.{eng}", fn)
            if v is not None:
                add(k, f"utilization.{eng}", v[0])
        self.read_memory(sample, k, h)
        temp_gpu = getattr(nv, "NVML_TEMPERATURE_GPU", 0)
        t = g.call_first(errors, k, "temperature.gpu", (("nvmlDeviceGetTemperatureV", (h, temp_gpu)),
                                                       ("nvmlDeviceGetTemperature", (h, temp_gpu))))
        add(k, "temperature.gpu", t)
        add(k, "fan.speed", call("fan.speed", "nvmlDeviceGetFanSpeed"))
        add(k, "pcie.link_width", call("pcie.link_width", "nvmlDeviceGetCurrPcieLinkWidth"))
        add(k, "pcie.link_gen", call("pcie.link_gen", "nvmlDeviceGetCurrPcieLinkGeneration"))
        add(k, "power.usage", call("power.usage", "nvmlDeviceGetPowerUsage"))
        add(k, "power.limit.enforced", call("power.limit.enforced", "nvmlDeviceGetEnforcedPowerLimit"))
        add(k, "energy.total", call("energy.total", "nvmlDeviceGetTotalEnergyConsumption"))
        for name, const in CLOCKS:
            add(k, f"clock.{name}", call(f"clock.{name}", "nvmlDeviceGetClockInfo", getattr(nv, const)))
        for name, value in st.static:
            add(k, name, value)
        if st.reason_bits:
            reasons = g.call_first(errors, k, "clocks_event_reasons", (
                ("nvmlDeviceGetCurrentClocksEventReasons", (h,)),
                ("nvmlDeviceGetCurrentClocksThrottleReasons", (h,))))
            if reasons is not None:
                for name, bit in st.reason_bits:
                    add(k, f"clocks_event_reasons.{name}", 1 if int(reasons) & bit else 0)
        self.read_fields(sample, st)
        for sev, const in (("corrected", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
                           ("uncorrected", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED")):
            add(k, f"ecc.volatile.{sev}", call(f"ecc.volatile.{sev}", "nvmlDeviceGetTotalEccErrors",
                                               getattr(nv, const), getattr(nv, "NVML_VOLATILE_ECC", 0)))
        rows = call("remapped_rows", "nvmlDeviceGetRemappedRows")
        if rows is not None:
            for name, v in zip(("correctable", "uncorrectable", "pending", "failure"), rows, strict=False):
                add(k, f"remapped_rows.{name}", v)

    def read_memory(self, sample: PollResult, key: str, handle: Any,
                    labels: tuple[tuple[str, str], ...] = ()) -> None:
        nv = self.nvml
        fieldname = "memory" if not labels else "memory.mig"
        mem = self.guard.call_first(sample.errors, key, fieldname, (
            ("nvmlDeviceGetMemoryInfo", (handle, getattr(nv, "nvmlMemory_v2", 0x02000028))),
            ("nvmlDeviceGetMemoryInfo", (handle,))))
        if mem is None:
            return
        sample.add(key, "memory.total", mem.total, labels)
        sample.add(key, "memory.free", mem.free, labels)
        if hasattr(mem, "reserved"):
            sample.add(key, "memory.used", mem.used, labels)
            sample.add(key, "memory.reserved", mem.reserved, labels)
        else:
            sample.add(key, "memory_v1.used", mem.used, labels)

    def read_fields(self, sample: PollResult, st: GpuState) -> None:
        if not st.fields:
            return
        g, k = self.guard, st.key
        values = g.call(sample.errors, k, "field_values", "nvmlDeviceGetFieldValues", st.handle,
                        [(r.field_id, r.scope) for r in st.fields])
        if values is None:
            return
        keep: list[FieldRequest] = []
        for req, fv in zip(st.fields, values, strict=False):
            rc = int(fv.nvmlReturn)
            if rc == SUCCESS:
                keep.append(req)
                sample.add(k, req.name, field_value(fv), req.labels)
                continue
            g.handle_code(sample.errors, k, req.name, rc)  # may raise DeviceLost
            if not g.is_skipped(k, req.name):
                keep.append(req)  # transient error: ask again next poll
        st.fields = keep
