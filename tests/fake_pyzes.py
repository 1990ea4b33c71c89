"""A faithful fake of the ``pyzes`` 0.1.3 module (Level Zero Sysman ctypes binding).

Same function names, call style (``rc = zesX(handle, byref(struct))``, count-then-fill
enumeration), ctypes structure layouts and field names, constants and ``ze_result_t`` codes as
``pyzes/__init__.py``; only the subset the exporter calls.  The hardware behind it is a list of
``FakeDevice`` objects that tests change between polls.
"""

from __future__ import annotations

from ctypes import Structure, c_char, c_int32, c_int64, c_ubyte, c_uint8, c_uint32, c_uint64, c_void_p
from dataclasses import dataclass, field
from types import SimpleNamespace

ze_bool_t = c_uint8
ze_result_t = c_int32
ZE_RESULT_SUCCESS = 0
ZE_RESULT_ERROR_DEVICE_LOST = 0x70000001
ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS = 0x70010000
ZE_RESULT_ERROR_UNSUPPORTED_FEATURE = 0x78000003
ZE_RESULT_ERROR_UNINITIALIZED = 0x78000001
ZE_MAX_DEVICE_UUID_SIZE = 16
ZES_STRING_PROPERTY_SIZE = 64
ZE_MAX_DEVICE_NAME = 256
ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES = 0x1
ZES_STRUCTURE_TYPE_PCI_PROPERTIES = 0x2
ZES_STRUCTURE_TYPE_ENGINE_PROPERTIES = 0x5
ZES_STRUCTURE_TYPE_MEM_PROPERTIES = 0xB
ZES_STRUCTURE_TYPE_MEM_STATE = 0x1E
ZES_MEM_LOC_SYSTEM = 0
ZES_MEM_LOC_DEVICE = 1
ZES_ENGINE_GROUP_ALL = 0
ZES_ENGINE_GROUP_COMPUTE_ALL = 1
ZES_ENGINE_GROUP_MEDIA_ALL = 2
ZES_ENGINE_GROUP_COPY_ALL = 3
ZES_ENGINE_GROUP_COMPUTE_SINGLE = 4
ZES_ENGINE_GROUP_RENDER_SINGLE = 5
ZES_ENGINE_GROUP_RENDER_ALL = 12
ZES_ENGINE_GROUP_FORCE_UINT32 = 0x7FFFFFFF


class zes_driver_handle_t(c_void_p):
    pass


class zes_device_handle_t(c_void_p):
    pass


class zes_mem_handle_t(c_void_p):
    pass


class zes_engine_handle_t(c_void_p):
    pass


class ze_device_uuid_t(Structure):
    _fields_ = [("id", c_ubyte * ZE_MAX_DEVICE_UUID_SIZE)]


class ze_device_properties_t(Structure):
    _fields_ = [("stype", c_int32), ("pNext", c_void_p), ("type", c_int32), ("vendorId", c_uint32),
                ("deviceId", c_uint32), ("flags", c_uint32), ("subdeviceId", c_uint32),
                ("coreClockRate", c_uint32), ("maxMemAllocSize", c_uint64), ("maxHardwareContexts", c_uint32),
                ("maxCommandQueuePriority", c_uint32), ("numThreadsPerEU", c_uint32),
                ("physicalEUSimdWidth", c_uint32), ("numEUsPerSubslice", c_uint32),
                ("numSubslicesPerSlice", c_uint32), ("numSlices", c_uint32), ("timerResolution", c_uint64),
                ("timestampValidBits", c_uint32), ("kernelTimestampValidBits", c_uint32),
                ("uuid", ze_device_uuid_t), ("name", c_char * ZE_MAX_DEVICE_NAME)]


class zes_device_properties_t(Structure):
    _fields_ = [("stype", c_int32), ("pNext", c_void_p), ("core", ze_device_properties_t),
                ("numSubdevices", c_uint32), ("serialNumber", c_char * ZES_STRING_PROPERTY_SIZE),
                ("boardNumber", c_char * ZES_STRING_PROPERTY_SIZE), ("brandName", c_char * ZES_STRING_PROPERTY_SIZE),
                ("modelName", c_char * ZES_STRING_PROPERTY_SIZE), ("vendorName", c_char * ZES_STRING_PROPERTY_SIZE),
                ("driverVersion", c_char * ZES_STRING_PROPERTY_SIZE)]


class zes_pci_address_t(Structure):
    _fields_ = [("domain", c_uint32), ("bus", c_uint32), ("device", c_uint32), ("function", c_uint32)]


class zes_pci_speed_t(Structure):
    _fields_ = [("gen", c_int32), ("width", c_int32), ("maxBandwidth", c_int64)]


class zes_pci_properties_t(Structure):
    _fields_ = [("stype", c_int32), ("pNext", c_void_p), ("address", zes_pci_address_t),
                ("maxSpeed", zes_pci_speed_t), ("haveBandwidthCounters", ze_bool_t),
                ("havePacketCounters", ze_bool_t), ("haveReplayCounters", ze_bool_t)]


class zes_mem_properties_t(Structure):
    _fields_ = [("stype", c_int32), ("pNext", c_void_p), ("type", c_int32), ("onSubdevice", ze_bool_t),
                ("subdeviceId", c_uint32), ("location", c_int32), ("physicalSize", c_uint64),
                ("busWidth", c_int32), ("numChannels", c_int32)]


class zes_mem_state_t(Structure):
    _fields_ = [("stype", c_int32), ("pNext", c_void_p), ("health", c_int32), ("free", c_uint64),
                ("size", c_uint64)]


class zes_mem_bandwidth_t(Structure):
    _fields_ = [("readCounter", c_uint64), ("writeCounter", c_uint64), ("maxBandwidth", c_uint64),
                ("timestamp", c_uint64)]


class zes_engine_properties_t(Structure):
    _fields_ = [("stype", c_int32), ("pNext", c_void_p), ("type", c_uint32), ("onSubdevice", ze_bool_t),
                ("subdeviceId", c_uint32)]


class zes_engine_stats_t(Structure):
    _fields_ = [("activeTime", c_uint64), ("timestamp", c_uint64)]


# ---- the fake hardware ---------------------------------------------------------------------
@dataclass
class FakeEngine:
    type: int
    active: int = 0
    timestamp: int = 0
    subdevice: int | None = None
    rc: int = ZE_RESULT_SUCCESS


@dataclass
class FakeMemory:
    size: int
    free: int
    location: int = ZES_MEM_LOC_DEVICE
    read: int = 0
    write: int = 0
    max_bw: int = 0
    timestamp: int = 0
    bw_rc: int = ZE_RESULT_SUCCESS


@dataclass
class FakeDevice:
    pci: tuple[int, int, int, int]
    model: str = "Intel(R) Data Center GPU Max 1100"
    serial: str = "unknown"
    engines: list[FakeEngine] = field(default_factory=list)
    memories: list[FakeMemory] = field(default_factory=list)
    engines_rc: int = ZE_RESULT_SUCCESS  # INSUFFICIENT_PERMISSIONS when not root


STATE = SimpleNamespace(devices=[], init_rc=ZE_RESULT_SUCCESS, handles={})


def reset(devices: list[FakeDevice], init_rc: int = ZE_RESULT_SUCCESS) -> None:
    STATE.devices, STATE.init_rc, STATE.handles = devices, init_rc, {}


def _handle(obj) -> int:
    hid = id(obj)
    STATE.handles[hid] = obj
    return hid


def _obj(h):
    return STATE.handles[h.value if hasattr(h, "value") else h]


def _fill(p_count, array, items, handle_type) -> int:
    count = p_count._obj
    if array is None:
        count.value = len(items)
        return ZE_RESULT_SUCCESS
    n = min(count.value, len(items))
    for i in range(n):
        array[i] = handle_type(_handle(items[i]))
    count.value = n
    return ZE_RESULT_SUCCESS


def zesInit(flags):
    return STATE.init_rc


def zesDriverGet(pCount, phDrivers):
    return _fill(pCount, phDrivers, [STATE] if STATE.devices is not None else [], zes_driver_handle_t)


def zesDeviceGet(hDriver, pCount, phDevices):
    return _fill(pCount, phDevices, STATE.devices, zes_device_handle_t)


def zesDevicePciGetProperties(hDevice, pProperties):
    dev = _obj(hDevice)
    p = pProperties._obj
    p.address.domain, p.address.bus, p.address.device, p.address.function = dev.pci
    return ZE_RESULT_SUCCESS


def zesDeviceGetProperties(hDevice, pProperties):
    dev = _obj(hDevice)
    p = pProperties._obj
    p.modelName = dev.model.encode()
    p.serialNumber = dev.serial.encode()
    p.core.vendorId = 0x8086
    return ZE_RESULT_SUCCESS


def zesDeviceEnumEngineGroups(hDevice, pCount, phEngine):
    dev = _obj(hDevice)
    if dev.engines_rc:
        pCount._obj.value = 0
        return dev.engines_rc
    return _fill(pCount, phEngine, dev.engines, zes_engine_handle_t)


def zesEngineGetProperties(hEngine, pProperties):
    eng = _obj(hEngine)
    p = pProperties._obj
    p.type = eng.type
    p.onSubdevice = eng.subdevice is not None
    p.subdeviceId = eng.subdevice or 0
    return ZE_RESULT_SUCCESS


def zesEngineGetActivity(hEngine, pStats):
    eng = _obj(hEngine)
    if eng.rc:
        return eng.rc
    pStats._obj.activeTime, pStats._obj.timestamp = eng.active, eng.timestamp
    return ZE_RESULT_SUCCESS


def zesDeviceEnumMemoryModules(hDevice, pCount, phMemory):
    return _fill(pCount, phMemory, _obj(hDevice).memories, zes_mem_handle_t)


def zesMemoryGetProperties(hMemory, pProperties):
    mem = _obj(hMemory)
    pProperties._obj.location = mem.location
    pProperties._obj.physicalSize = mem.size
    return ZE_RESULT_SUCCESS


def zesMemoryGetState(hMemory, pState):
    mem = _obj(hMemory)
    pState._obj.size, pState._obj.free = mem.size, mem.free
    return ZE_RESULT_SUCCESS


def zesMemoryGetBandwidth(hMemory, pBandwidth):
    mem = _obj(hMemory)
    if mem.bw_rc:
        return mem.bw_rc
    b = pBandwidth._obj
    b.readCounter, b.writeCounter, b.maxBandwidth, b.timestamp = mem.read, mem.write, mem.max_bw, mem.timestamp
    return ZE_RESULT_SUCCESS
