"""NVIDIA GPUs through NVML (``nvidia-ml-py``, module ``pynvml``).

Collector name ``nvml``.  Emits raw NVML readings (see ``nvml_readers`` for the field list and
units); ``mappings/nvml.yaml`` turns them into canonical series.  Pieces:

* ``nvml_readers``: per-GPU NVML calls (utilization, memory v2, power, energy, clocks, clock
  event reasons, field values for PCIe/NVLink counters, ECC, remapped rows).
* ``nvml_gpm``: GPM two-sample metrics on Hopper+ (per GPU and per MIG GPU instance).
* ``nvml_events``: XID counts from an event-set wait in a background thread.
* ``nvml_processes``: the busy-client count (default) or per-process series, top N per GPU.
* ``nvml_calls``: error classification; unsupported series are counted once and not retried.

A GPU that returns GpuIsLost/Unknown is reported with ``device_up=False``; the others continue,
and every poll re-checks the device count and re-acquires handles of GPUs that were lost.  MIG
devices are scanned every ``mig_rescan_polls`` polls, and on the poll after any MIG read that
failed (a handle taken before a MIG reconfiguration is stale).

Options (the ``nvml`` section of the config; all optional):
  processes: count (off | count | series), processes_top_n: 10, xid: true, xid_timeout_ms: 500, gpm: true,
  gpm_metrics: [NVML_GPM_METRIC_* suffixes], gpm_min_window_s: 0.1, gpm_reseed_factor: 5,
  gpm_max_window_s: 600, interval: <poll interval s, sharpens the GPM reseed rule>,
  nvlink_per_link: false, mig: true, mig_rescan_polls: 30
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from .base import Abilities, Device, PollResult, SourceBase, SourceUnavailable
from .context import DEFAULT_CONTEXT, SourceContext
from .nvml_calls import LOST_CODES, CallGuard, DeviceLost
from .nvml_events import XidWatcher
from .nvml_gpm import DEFAULT_GPM_METRICS, GpmReader
from .nvml_processes import ProcessReader
from .nvml_readers import DEFAULT_FIELDS, DeviceReader, GpuState, MigInstance, field_requests
from .options import NvmlOptions

# the raw fields one nvmlDeviceGetUtilizationRates call gives
UTILIZATION_FIELDS = frozenset({"utilization.gpu", "utilization.memory"})

_MIG_NAME = re.compile(r"\bMIG\s+(\S+)\s*$")


def _failures(errors: Counter[str]) -> int:
    """NVML calls that failed other than by a lasting refusal, as counted so far in a poll."""
    return errors["read_error"] + errors["timeout"]


def _text(v: Any) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace").strip("\x00 ")
    return str(v).strip()


def normalize_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:31:00.0`` -> ``0000:31:00.0`` (the sysfs spelling), lower case."""
    bus_id = bus_id.strip().lower()
    dom, sep, rest = bus_id.partition(":")
    if sep and len(dom) > 4 and set(dom[:-4]) <= {"0"}:
        bus_id = f"{dom[-4:]}:{rest}"
    return bus_id


def mig_profile(name: str) -> str:
    """``NVIDIA A100-SXM4-40GB MIG 1g.5gb`` -> ``1g.5gb`` (compute-instance names: ``1c.2g.10gb``)."""
    m = _MIG_NAME.search(name)
    return m.group(1) if m else ""


class NvmlSource(SourceBase):
    name: ClassVar[str] = "nvml"
    abilities = Abilities(fast_poll=True)

    def __init__(self, context: SourceContext = DEFAULT_CONTEXT, *, module: Any = None,
                 clock: Callable[[], float] | None = None) -> None:
        self.procfs = Path(context.procfs)
        self.options = context.typed(NvmlOptions)
        # what poll_fast reads: the raw fields feeding a `fast: true` metric (None without a
        # mapping set: utilization and every GPM metric)
        fast = context.fast_fields("nvml")
        self._fast_util = fast is None or not fast.isdisjoint(UTILIZATION_FIELDS)
        self._fast_gpm = None if fast is None else frozenset(f for f in fast if f.startswith("gpm."))
        self._fast_gpm_any = self._fast_gpm is None or bool(self._fast_gpm)  # poll_fast reads GPM
        self._module = module
        self._clock = clock or (lambda: time.monotonic())
        self.nv: Any = None
        self.guard: CallGuard | None = None
        self.reader: DeviceReader | None = None
        self.gpm: GpmReader | None = None
        self.xid: XidWatcher | None = None
        self.procs: ProcessReader | None = None
        self.gpus: dict[int, GpuState] = {}
        self.driver = ""
        self._pending: Counter[str] = Counter()
        self._polls = 0

    # -- lifecycle ---------------------------------------------------------------------------
    def open(self) -> None:
        nv = self._module
        if nv is None:
            try:
                nv = importlib.import_module("pynvml")
            except ImportError as exc:
                raise SourceUnavailable("nvidia-ml-py not installed (module pynvml)") from exc
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise SourceUnavailable(f"NVML init failed: {type(exc).__name__}: {exc}") from exc
        except OSError as exc:
            raise SourceUnavailable(f"NVML init failed: {exc}") from exc
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as exc:
            self._shutdown(nv)
            raise SourceUnavailable(f"NVML device count failed: {type(exc).__name__}: {exc}") from exc
        if count == 0:
            self._shutdown(nv)
            raise SourceUnavailable("NVML found no NVIDIA GPU")
        self.nv = nv
        opts = self.options
        self.guard = CallGuard(nv)
        self.reader = DeviceReader(nv, self.guard)
        if opts.gpm:
            self.gpm = GpmReader(
                nv, self.guard, tuple(opts.gpm_metrics or DEFAULT_GPM_METRICS),
                min_window_s=opts.gpm_min_window_s, reseed_factor=opts.gpm_reseed_factor,
                max_window_s=opts.gpm_max_window_s, interval_s=opts.interval or None)
        if opts.xid:
            self.xid = XidWatcher(nv, timeout_ms=opts.xid_timeout_ms)
        if opts.processes != "off":
            self.procs = ProcessReader(nv, self.guard, self.procfs, opts.processes_top_n, opts.processes,
                                       opts.mps_client_cpu_percent, self._clock)
        try:
            self.driver = _text(nv.nvmlSystemGetDriverVersion())
        except Exception:  # noqa: BLE001 - identity only
            self.driver = ""
        self._discover(self._pending)

    def close(self) -> None:
        if self.xid is not None:
            self.xid.stop()
            self.xid = None
        if self.gpm is not None:
            self.gpm.close()
        if self.nv is not None:
            self._shutdown(self.nv)
            self.nv = None
        self.gpus.clear()

    @staticmethod
    def _shutdown(nv: Any) -> None:
        try:
            nv.nvmlShutdown()
        except Exception:  # noqa: BLE001 - teardown
            pass

    # -- discovery ---------------------------------------------------------------------------
    def _discover(self, errors: Counter[str]) -> None:
        nv = self.nv
        try:
            count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError:
            errors["read_error"] += 1
            return
        for index in range(count):
            st = self.gpus.get(index)
            if st is not None and st.handle is not None:
                continue
            try:
                self._attach(errors, index)
            except DeviceLost:
                pass
        for index, st in self.gpus.items():
            if index >= count and st.handle is not None:
                self._lose(errors, st)

    def _attach(self, errors: Counter[str], index: int) -> None:
        nv = self.nv
        old = self.gpus.get(index)
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nv.nvmlDeviceGetUUID(handle))
        except nv.NVMLError as exc:
            if old is None:
                errors["device_lost" if exc.value in LOST_CODES else "read_error"] += 1
            return
        bus = ""
        try:
            bus = normalize_bus_id(_text(nv.nvmlDeviceGetPciInfo(handle).busId))
        except Exception:  # noqa: BLE001 - fall back to the UUID as key
            bus = ""
        ident: dict[str, str] = {}
        for attr, fn in (("model", "nvmlDeviceGetName"), ("serial", "nvmlDeviceGetSerial")):
            try:
                ident[attr] = _text(getattr(nv, fn)(handle))
            except Exception:  # noqa: BLE001 - identity is best effort (serial: NotSupported on GeForce)
                ident[attr] = ""
        device = Device(key=bus or uuid, vendor="nvidia", index=str(index), mapping="nvml", uuid=uuid,
                        model=ident["model"], pci_bus_id=bus, driver=self.driver, serial=ident["serial"])
        if old is not None and old.device.key != device.key and self.gpm is not None:
            self.gpm.drop_device(old.device.key)
        st = GpuState(index=index, device=device, handle=handle)
        self.gpus[index] = st
        try:
            self._setup(errors, st)
        except DeviceLost:
            self._lose(errors, st)
            raise

    def _setup(self, errors: Counter[str], st: GpuState) -> None:
        assert self.reader is not None
        self.reader.read_static(errors, st)
        per_link = self.options.nvlink_per_link
        links = self.reader.active_links(errors, st) if per_link else []
        st.fields = field_requests(self.nv, DEFAULT_FIELDS, links, per_link)
        st.fields = [f for f in st.fields if not self.guard.is_skipped(st.key, f.name)]
        st.gpm = self.gpm is not None and self.gpm.device_supported(errors, st.key, st.handle)
        self._scan_mig(errors, st)
        if self.xid is not None:
            self.xid.register(st.key, st.handle, st.device.uuid)

    def _scan_mig(self, errors: Counter[str], st: GpuState) -> None:
        nv, g = self.nv, self.guard
        st.mig = []
        st.polls_since_mig_scan = 0
        st.mig_stale = False
        if st.device.partitions:
            st.device = dataclasses.replace(st.device, partitions=())
        if not self.options.mig:
            return
        mode = g.call(errors, st.key, "mig_mode", "nvmlDeviceGetMigMode", st.handle)
        if not mode or mode[0] != getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1):
            return
        n = g.call(errors, st.key, "mig_count", "nvmlDeviceGetMaxMigDeviceCount", st.handle) or 0
        uuids: dict[str, str] = {}  # gpu_instance -> MIG UUID (pod attribution)
        for i in range(int(n)):
            try:
                mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(st.handle, i)
                gi = int(nv.nvmlDeviceGetGpuInstanceId(mh))
                ci = int(nv.nvmlDeviceGetComputeInstanceId(mh))
                name = _text(nv.nvmlDeviceGetName(mh))
            except nv.NVMLError as exc:
                if exc.value in LOST_CODES:
                    raise DeviceLost(exc.value) from None
                continue  # NotFound: an empty MIG slot
            st.mig.append(MigInstance(mh, gi, ci, mig_profile(name)))
            with contextlib.suppress(nv.NVMLError):
                uuids.setdefault(str(gi), _text(nv.nvmlDeviceGetUUID(mh)))
        st.device = dataclasses.replace(st.device, partitions=tuple(sorted(uuids.items())))

    def _lose(self, errors: Counter[str], st: GpuState) -> None:
        if st.up:
            errors["device_lost"] += 1  # once per transition, not every poll while it stays lost
        st.up = False
        st.handle = None
        st.mig = []
        if self.gpm is not None:
            self.gpm.drop_device(st.key)

    # -- polling -----------------------------------------------------------------------------
    def poll(self) -> PollResult:
        if self.nv is None:
            raise RuntimeError("NvmlSource.poll() before open()")
        sample = PollResult()
        sample.errors.update(self._pending)
        self._pending.clear()
        self._polls += 1
        self._discover(sample.errors)
        for index in sorted(self.gpus):
            st = self.gpus[index]
            sample.devices.append(st.device)
            if st.handle is None:
                sample.device_up[st.key] = False
                continue
            mark = len(sample.readings)
            try:
                self._read_gpu(sample, st, self._clock())
            except DeviceLost:
                del sample.readings[mark:]  # nothing half-read from a GPU that is gone
                self._lose(sample.errors, st)
                sample.device_up[st.key] = False
                continue
            st.up = True
            sample.device_up[st.key] = True
        self._read_xid(sample)
        return sample

    def poll_fast(self) -> PollResult:
        """Cheap signals for the contention indicators between full polls: the raw fields
        feeding a ``fast: true`` metric, i.e. utilization and, on Hopper and newer, GPM (SM
        occupancy, DRAM bandwidth) over the window since the previous GPM read.  MIG GPUs and
        lost GPUs are left to the full poll."""
        sample = PollResult()
        if self.nv is None:
            return sample
        now = self._clock()
        for index in sorted(self.gpus):
            st = self.gpus[index]
            if st.handle is None or st.mig or not st.up:
                continue
            sample.devices.append(st.device)
            try:
                if self._fast_util:
                    util = self.guard.call(sample.errors, st.key, "utilization",
                                           "nvmlDeviceGetUtilizationRates", st.handle)
                    if util is not None:
                        sample.add(st.key, "utilization.gpu", util.gpu)
                        sample.add(st.key, "utilization.memory", util.memory)
                if st.gpm and self.gpm is not None and self._fast_gpm_any:
                    self.gpm.read(sample, st.key, st.handle, now, only=self._fast_gpm)
            except DeviceLost:
                continue  # the next full poll marks it lost and re-discovers
        return sample

    def _read_gpu(self, sample: PollResult, st: GpuState, now: float) -> None:
        assert self.reader is not None
        self.reader.read(sample, st)
        st.polls_since_mig_scan += 1
        if st.mig_stale or st.polls_since_mig_scan >= self.options.mig_rescan_polls:
            self._scan_mig(sample.errors, st)
        failures = _failures(sample.errors)
        for inst in st.mig:
            self.reader.read_memory(sample, st.key, inst.handle, inst.labels)
        if st.gpm and self.gpm is not None:
            if not st.mig:
                self.gpm.read(sample, st.key, st.handle, now)
            seen: set[int] = set()
            for inst in st.mig:
                if inst.gpu_instance in seen:
                    continue
                seen.add(inst.gpu_instance)
                self.gpm.read(sample, st.key, st.handle, now, gi=inst.gpu_instance, labels=inst.gi_labels)
        if self.procs is not None:
            self.procs.read(sample, st.key, st.handle, mig=st.mig)
        # a MIG read that failed (or answered for another instance) may hold a handle the
        # scan made before a MIG reconfiguration: scan again on the next poll, not in 30
        st.mig_stale = bool(st.mig) and _failures(sample.errors) > failures

    def _read_xid(self, sample: PollResult) -> None:
        if self.xid is None:
            return
        counts, last, errs = self.xid.snapshot()
        sample.errors.update(errs)
        for key in sorted(counts):
            for code in sorted(counts[key]):
                sample.add(key, "xid.count", counts[key][code], (("xid", str(code)),))
            if key in last:
                sample.add(key, "xid.last_timestamp", last[key])
