"""NVIDIA DCGM profiling fields through DCGM's own Python bindings (collector ``dcgm``).

The bindings (``DcgmReader``, ``dcgm_structs``, ``pydcgm``) are not on PyPI; they ship with the
``datacenter-gpu-manager-4-core`` package (DCGM 3.x: ``/usr/local/dcgm/bindings/python3``) and talk
to a running ``nv-hostengine``.  Without them, or without a host engine, the source is off with
the reason.  Fields are requested and emitted by numeric field id (raw field ``dcgm.<id>``),
because DCGM 4.6 renamed ~268 field identifiers while keeping the ids; ``mappings/dcgm.yaml``
holds what each id means.  DCGM's blank sentinels (not supported / not permissioned) are
skipped and counted once per (GPU, field).

Options: hostname ("localhost"), field_ids (list of ints), update_interval_s (1.0),
max_keep_age_s (60).
"""

from __future__ import annotations

import importlib
import sys
import types
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

from .base import Device, PollResult, SourceBase, SourceUnavailable
from .context import DEFAULT_CONTEXT, SourceContext
from .options import DcgmOptions

BINDING_PATHS = ("/usr/share/datacenter-gpu-manager-4/bindings/python3", "/usr/local/dcgm/bindings/python3")

# DCP profiling fields (dcgm_fields.h ids): GR engine active, SM active, SM occupancy, tensor
# active, DRAM active, FP64/FP32/FP16 active, PCIe TX/RX bytes, NVLink TX/RX bytes; and 203
# GPU utilization, which tells the profiling guard (mappings/dcgm.yaml) a busy GPU whose DCP
# fields all read 0 (another profiler holds the counters): those zeros are not values.
DEFAULT_FIELD_IDS = (203, 1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008, 1009, 1010, 1011, 1012)

# fields read as INT64 percent (0-100): 203, DCGM_FI_DEV_GPU_UTIL (DCGM_FT_INT64 in
# dcgmlib/src/dcgm_fields.cpp @ DCGM 4.6.0; DCGM_FI_DEV_GPU_UTIL_RATIO is its 4.6 name, same id
# and unit).  DCGM gives new units new ids (4.6.1's base-unit fields 1600-1612 replace legacy ones,
# which "are retained for backward compatibility"), and a 0-1 ratio cannot be an INT64; should a
# release ever serve one of these ids as a float, that value's unit is not proven: skipped and
# counted (unit_ambiguous), never read as a percent.
INT64_PERCENT_FIELDS = frozenset({203})

# dcgm_structs.h: DCGM_INT64_BLANK = 0x7ffffffffffffff0 (and +1..+3), DCGM_FP64_BLANK = 140737488355328.0
INT64_BLANK = 0x7FFFFFFFFFFFFFF0
FP64_BLANK = 140737488355328.0


def import_bindings(paths: tuple[str, ...] = BINDING_PATHS) -> types.SimpleNamespace:
    """Import DcgmReader and dcgm_structs, adding DCGM's install directories to sys.path."""
    for attempt in range(2):
        try:
            return types.SimpleNamespace(DcgmReader=importlib.import_module("DcgmReader"),
                                         dcgm_structs=importlib.import_module("dcgm_structs"))
        except ImportError:
            if attempt:
                break
            for p in paths:
                if Path(p).is_dir() and p not in sys.path:
                    sys.path.append(p)
    raise SourceUnavailable("DCGM Python bindings not found (install datacenter-gpu-manager-4-core; "
                            f"looked in {', '.join(paths)})")


def _is_blank(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return v >= INT64_BLANK
    if isinstance(v, float):
        return v >= FP64_BLANK
    return False


def _bus(bus_id: Any) -> str:
    s = bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id or "")
    s = s.strip().lower()
    dom, sep, rest = s.partition(":")
    if sep and len(dom) > 4 and set(dom[:-4]) <= {"0"}:
        s = f"{dom[-4:]}:{rest}"
    return s


class DcgmSource(SourceBase):
    name: ClassVar[str] = "dcgm"

    def __init__(self, context: SourceContext = DEFAULT_CONTEXT, *, module: Any = None) -> None:
        self.options = context.typed(DcgmOptions)
        self._module = module
        self.reader: Any = None
        self.devices: dict[int, Device] = {}
        self._blank: set[tuple[int, int]] = set()

    def open(self) -> None:
        mods = self._module or import_bindings()
        opts = self.options
        field_ids = list(opts.field_ids or DEFAULT_FIELD_IDS)
        try:
            reader = mods.DcgmReader.DcgmReader(
                hostname=opts.hostname, fieldIds=field_ids,
                updateFrequency=int(opts.update_interval_s * 1_000_000),
                maxKeepAge=opts.max_keep_age_s, ignoreBlank=True,
                fieldGroupName="unified_gpu_exporter")
            reader.InitWrapped()
        except Exception as exc:  # noqa: BLE001 - DCGMError, library load errors: source off
            raise SourceUnavailable(f"DCGM not usable (is nv-hostengine running?): {exc}") from exc
        self.reader = reader
        self._refresh_devices()
        if not self.devices:
            self.close()
            raise SourceUnavailable("DCGM reports no GPU")

    def _refresh_devices(self) -> None:
        uuids = dict(getattr(self.reader, "m_gpuIdToUUId", {}) or {})
        buses = dict(getattr(self.reader, "m_gpuIdToBusId", {}) or {})
        for gpu_id in sorted(set(uuids) | set(buses)):
            uuid = str(uuids.get(gpu_id, ""))
            bus = _bus(buses.get(gpu_id, ""))
            self.devices[int(gpu_id)] = Device(key=bus or uuid or f"dcgm{gpu_id}", vendor="nvidia",
                                               index=str(gpu_id), mapping="dcgm", uuid=uuid, pci_bus_id=bus)

    def poll(self) -> PollResult:
        if self.reader is None:
            raise RuntimeError("DcgmSource.poll() before open()")
        sample = PollResult()
        errors: Counter[str] = sample.errors
        try:
            data = self.reader.GetLatestGpuValuesAsFieldIdDict() or {}
        except Exception:  # noqa: BLE001 - one failed poll is an error count, not a crash
            errors["read_error"] += 1
            data = {}
        if not data:
            errors["read_error"] += 1  # host engine gone (DcgmReader reconnects on the next call)
        if set(data) - set(self.devices):
            self._refresh_devices()
        for gpu_id, dev in sorted(self.devices.items()):
            sample.devices.append(dev)
            values = data.get(gpu_id)
            sample.device_up[dev.key] = values is not None
            for fid, value in sorted((values or {}).items()):
                if _is_blank(value):
                    if (gpu_id, fid) not in self._blank:
                        self._blank.add((gpu_id, fid))
                        errors["not_supported"] += 1
                    continue
                if fid in INT64_PERCENT_FIELDS and isinstance(value, float):
                    errors["unit_ambiguous"] += 1
                    continue
                sample.add(dev.key, f"dcgm.{int(fid)}", value)
        return sample

    def close(self) -> None:
        if self.reader is not None:
            try:
                self.reader.Shutdown()
            except Exception:  # noqa: BLE001 - teardown
                pass
            self.reader = None
