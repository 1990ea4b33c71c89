"""Intel GPUs through Level Zero Sysman (the ``pyzes`` ctypes binding), where it is present.

``pyzes`` loads ``/usr/lib/x86_64-linux-gnu/libze_loader.so.1`` at import time and raises
``OSError`` without it, so the import is guarded: the source is then off, with the reason.
Some Sysman calls need privileges: engine groups are only enumerated for root (compute-runtime
checks ``geteuid()==0``; the PMU behind them needs CAP_PERFMON), memory bandwidth needs read
access to the PMT telemetry nodes.  What is refused is logged once and listed in ``notes``.

Raw readings (``mappings/intel.yaml``; device key = PCI address, shared with the sysfs source):

- ``l0.engine.<group>`` busy percent from two ``zesEngineGetActivity`` samples
  (``Δactive/Δtimestamp``), group = ``all``, ``compute_all``, ``render_all``, ``media_all``,
  ``copy_all``, ... (lowercased ``ZES_ENGINE_GROUP_*`` name), label ``subdevice`` for tiles;
- ``l0.memory.{size,free,used}_bytes`` from ``zesMemoryGetState`` over device-local modules;
- ``l0.memory.bandwidth_bytes_per_second`` and ``l0.memory.bandwidth_utilization_percent`` from
  two ``zesMemoryGetBandwidth`` samples.  compute-runtime already returns bytes (it multiplies
  the 32/64-byte transaction counts itself), so the counters are not scaled again.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .base import Device, PollResult, SourceBase, SourceUnavailable
from .context import DEFAULT_CONTEXT, SourceContext
from .drm_fdinfo import card_indices

log = logging.getLogger(__name__)

_LOST = 0x70000001  # ZE_RESULT_ERROR_DEVICE_LOST
_NO_PERMISSION = 0x70010000  # ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS
_UNSUPPORTED = {0x78000003, 0x70010001}  # UNSUPPORTED_FEATURE, NOT_AVAILABLE


def _error_kind(rc: int) -> str:
    if rc == _LOST:
        return "device_lost"
    if rc == _NO_PERMISSION or rc in _UNSUPPORTED:
        return "not_supported"
    return "read_error"


def _rc(value: Any) -> int:
    """A ze_result_t as returned (int or ctypes value) as a non-negative int."""
    return int(getattr(value, "value", value)) & 0xFFFFFFFF


@dataclass(slots=True)
class _L0Device:
    device: Device
    handle: Any
    engines: list[tuple[Any, str, str]] = field(default_factory=list)  # handle, group, subdevice
    memories: list[Any] = field(default_factory=list)
    prev_engine: dict[int, tuple[int, int]] = field(default_factory=dict)
    prev_bw: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # read, write, ts


class LevelZeroSource(SourceBase):
    """Level Zero Sysman engine activity, memory state and memory bandwidth."""

    name: ClassVar[str] = "levelzero"

    def __init__(self, context: SourceContext = DEFAULT_CONTEXT, *, module: Any = None) -> None:
        self.sysfs = Path(context.sysfs)
        self._module = module
        self._zes: Any = None
        self._devices: list[_L0Device] = []
        self._cards: dict[str, str] = {}
        self.notes: list[str] = []  # capabilities refused at open (privileges, support)

    # -- setup --------------------------------------------------------------------------------
    def _import(self) -> Any:
        if self._module is not None:
            return self._module
        try:
            return importlib.import_module("pyzes")
        except Exception as exc:  # OSError without libze_loader; ImportError without pyzes
            raise SourceUnavailable(
                f"pyzes not usable ({type(exc).__name__}: {exc}); needs the pyzes package and the "
                "Level Zero loader libze_loader.so.1") from None

    def _enum(self, fn: Any, parent: Any, handle_type: Any) -> tuple[int, list[Any]]:
        count = ctypes.c_uint32(0)
        rc = _rc(fn(parent, ctypes.byref(count), None))
        if rc or count.value == 0:
            return rc, []
        arr = (handle_type * count.value)()
        rc = _rc(fn(parent, ctypes.byref(count), arr))
        return rc, ([arr[i] for i in range(count.value)] if rc == 0 else [])

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)
            log.warning("levelzero: %s", text)

    def open(self) -> None:
        zes = self._zes = self._import()
        rc = _rc(zes.zesInit(0))
        if rc:
            raise SourceUnavailable(f"zesInit failed (ze_result 0x{rc:08x})")
        count = ctypes.c_uint32(0)
        rc = _rc(zes.zesDriverGet(ctypes.byref(count), None))
        if rc or count.value == 0:
            raise SourceUnavailable(f"no Level Zero Sysman driver (ze_result 0x{rc:08x})")
        drivers = (zes.zes_driver_handle_t * count.value)()
        zes.zesDriverGet(ctypes.byref(count), drivers)
        self._devices = []
        self._cards = card_indices(self.sysfs)
        for i in range(count.value):
            _, handles = self._enum(zes.zesDeviceGet, drivers[i], zes.zes_device_handle_t)
            for h in handles:
                dev = self._describe(h, len(self._devices))
                if dev is not None:
                    self._devices.append(dev)
        if not self._devices:
            raise SourceUnavailable("Level Zero found no Sysman devices")

    def _describe(self, handle: Any, ordinal: int) -> _L0Device | None:
        zes = self._zes
        pci = zes.zes_pci_properties_t()
        pci.stype = zes.ZES_STRUCTURE_TYPE_PCI_PROPERTIES
        if _rc(zes.zesDevicePciGetProperties(handle, ctypes.byref(pci))):
            return None
        a = pci.address
        addr = f"{a.domain:04x}:{a.bus:02x}:{a.device:02x}.{a.function:x}"
        props = zes.zes_device_properties_t()
        props.stype = zes.ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES
        model = serial = uuid = ""
        if _rc(zes.zesDeviceGetProperties(handle, ctypes.byref(props))) == 0:
            model = props.modelName.decode(errors="replace")
            serial = props.serialNumber.decode(errors="replace")
            uuid = bytes(props.core.uuid.id).hex()
        # gpu label = DRM card number, as the sysfs source has it for the same PCI address
        index = self._cards.get(addr, str(ordinal))
        l0 = _L0Device(Device(key=addr, vendor="intel", index=index, mapping="intel", uuid="",
                              model=model, pci_bus_id=addr, driver="levelzero", serial=serial), handle)
        log.debug("levelzero: %s %s uuid %s", addr, model, uuid)
        rc, engines = self._enum(zes.zesDeviceEnumEngineGroups, handle, zes.zes_engine_handle_t)
        if not engines:
            self._note(f"{addr}: engine activity unavailable (ze_result 0x{rc:08x}); "
                       "zesDeviceEnumEngineGroups needs root and CAP_PERFMON")
        names = {v: k[len("ZES_ENGINE_GROUP_"):].lower() for k, v in vars(zes).items()
                 if k.startswith("ZES_ENGINE_GROUP_") and k != "ZES_ENGINE_GROUP_FORCE_UINT32"}
        for eh in engines:
            ep = zes.zes_engine_properties_t()
            ep.stype = zes.ZES_STRUCTURE_TYPE_ENGINE_PROPERTIES
            if _rc(zes.zesEngineGetProperties(eh, ctypes.byref(ep))) == 0:
                sub = str(ep.subdeviceId) if ep.onSubdevice else ""
                l0.engines.append((eh, names.get(ep.type, f"type{ep.type}"), sub))
        _, mems = self._enum(zes.zesDeviceEnumMemoryModules, handle, zes.zes_mem_handle_t)
        for mh in mems:
            mp = zes.zes_mem_properties_t()
            mp.stype = zes.ZES_STRUCTURE_TYPE_MEM_PROPERTIES
            if _rc(zes.zesMemoryGetProperties(mh, ctypes.byref(mp))) == 0 and mp.location == zes.ZES_MEM_LOC_DEVICE:
                l0.memories.append(mh)
        return l0

    def close(self) -> None:
        self._devices = []

    # -- polling ------------------------------------------------------------------------------
    def poll(self) -> PollResult:
        sample = PollResult()
        for dev in self._devices:
            sample.devices.append(dev.device)
            lost = sample.errors["device_lost"]
            self._poll_engines(sample, dev)
            self._poll_memory(sample, dev)
            sample.device_up[dev.device.key] = sample.errors["device_lost"] == lost
        return sample

    def _poll_engines(self, sample: PollResult, dev: _L0Device) -> None:
        zes = self._zes
        for i, (eh, group, sub) in enumerate(dev.engines):
            st = zes.zes_engine_stats_t()
            rc = _rc(zes.zesEngineGetActivity(eh, ctypes.byref(st)))
            if rc:
                sample.errors[_error_kind(rc)] += 1
                continue
            prev = dev.prev_engine.get(i)
            dev.prev_engine[i] = (st.activeTime, st.timestamp)
            if prev is None or st.activeTime < prev[0] or st.timestamp <= prev[1]:
                continue
            pct = (st.activeTime - prev[0]) / (st.timestamp - prev[1]) * 100.0
            sample.add(dev.device.key, f"l0.engine.{group}", pct, (("subdevice", sub),) if sub else ())

    def _poll_memory(self, sample: PollResult, dev: _L0Device) -> None:
        zes = self._zes
        size = free = 0
        have_state = False
        rate = max_bw = 0.0
        have_rate = False
        for i, mh in enumerate(dev.memories):
            ms = zes.zes_mem_state_t()
            ms.stype = zes.ZES_STRUCTURE_TYPE_MEM_STATE
            rc = _rc(zes.zesMemoryGetState(mh, ctypes.byref(ms)))
            if rc == 0:
                size, free, have_state = size + ms.size, free + ms.free, True
            else:
                sample.errors[_error_kind(rc)] += 1
            bw = zes.zes_mem_bandwidth_t()
            rc = _rc(zes.zesMemoryGetBandwidth(mh, ctypes.byref(bw)))
            if rc:
                if rc == _NO_PERMISSION or rc in _UNSUPPORTED:
                    self._note(f"{dev.device.key}: memory bandwidth unavailable (ze_result 0x{rc:08x}); "
                               "needs read access to PMT telem nodes (root)")
                else:
                    sample.errors[_error_kind(rc)] += 1
                continue
            prev = dev.prev_bw.get(i)
            dev.prev_bw[i] = (bw.readCounter, bw.writeCounter, bw.timestamp)
            if prev is None or bw.timestamp <= prev[2] or bw.readCounter < prev[0] or bw.writeCounter < prev[1]:
                continue
            moved = (bw.readCounter - prev[0]) + (bw.writeCounter - prev[1])
            rate += moved / ((bw.timestamp - prev[2]) / 1e6)  # timestamp in microseconds
            max_bw += bw.maxBandwidth
            have_rate = True
        key = dev.device.key
        if have_state:
            sample.add(key, "l0.memory.size_bytes", size)
            sample.add(key, "l0.memory.free_bytes", free)
            sample.add(key, "l0.memory.used_bytes", size - free)
        if have_rate:
            sample.add(key, "l0.memory.bandwidth_bytes_per_second", rate)
            if max_bw > 0:  # A770 on upstream kernels reports maxBandwidth 0 (xpumanager #83)
                sample.add(key, "l0.memory.bandwidth_utilization_percent", rate / max_bw * 100.0)
