"""AMD GPUs through the ``amdsmi`` Python binding (ROCm), for what sysfs does not offer.

The amdgpu sysfs source already reads activity, memory, clocks, power, temperatures, PCIe and the
XGMI byte counters of ``gpu_metrics``; this source adds only what sysfs lacks, so no canonical
series comes from two sources:
    ecc.{correctable,uncorrectable,deferred}_count            (amdsmi_get_gpu_total_ecc_count)
    ecc_block.{correctable,uncorrectable,deferred}_count      per RAS block, label ``block``
    xgmi.link_up (1/0, label ``link``), xgmi.{read,write}_kb (label ``link``; unmapped by default,
        amdgpu's gpu_metrics provides the same counters)
    client.engine_usage.gfx ns per client (label ``client``) and ``client.evidence``: the
        busy-client count of the default ``processes: count`` (sources/evidence.py), never exported.
        amdsmi builds its process list by walking ``/proc`` of the exporter's own PID namespace
        and skipping, silently, every process whose ``/proc/<pid>/fdinfo`` it may not read
        (ROCm amdsmi, ``gpuvsmi_get_pids``), so the count is complete only in the host PID
        namespace with every fdinfo readable; otherwise it is partial
        (``pid_namespace_private`` / ``procfs_unreadable``, as DRM fdinfo's)
    process.{vram_mem,gtt_mem,cpu_mem,mem} bytes and process.engine_usage.{gfx,enc} ns, labels
        ``pid`` and ``process`` (with ``options: {processes: series}``, top ``process_top_n``)

Importing ``amdsmi`` may fail in any way (PyPI 7.0.2 without ROCm prints two lines to stdout and
raises KeyError); the import runs only in ``open``, with stdout/stderr redirected at both the Python
and the file-descriptor level, and any exception makes the source unavailable with the reason.
Values the binding returns as ``"N/A"`` and calls answering NOT_SUPPORTED are omitted (never 0);
a NOT_SUPPORTED call is counted once and not repeated.

Device identity matches the amdgpu sysfs source (key = PCI address, gpu = DRM card number,
uuid = sysfs ``unique_id`` or ``pci-<address>``) so series of both sources join.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from .base import Device, PollResult, SourceBase, SourceUnavailable
from .context import DEFAULT_CONTEXT, SourceContext
from .evidence import host_pid_namespace, mark, procfs_visibility
from .options import AmdsmiOptions

NOT_SUPPORTED = 2  # amdsmi_status_t AMDSMI_STATUS_NOT_SUPPORTED
_TIMEOUTS = (8, 9)  # AMDSMI_STATUS_TIMEOUT, AMDSMI_STATUS_RETRY

DEFAULT_ECC_BLOCKS = ("UMC", "SDMA", "GFX", "MMHUB", "PCIE_BIF", "HDP", "XGMI_WAFL")


def import_amdsmi(name: str = "amdsmi") -> tuple[ModuleType | None, str]:
    """Import the binding silently.  Returns (module, "") or (None, reason)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved: list[int] = []
    devnull = -1
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):
            saved.append(os.dup(fd))
            os.dup2(devnull, fd)
    except OSError:
        pass  # no usable fds (odd embedding): the Python-level redirect below still applies
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            module = importlib.import_module(name)
        return module, ""
    except (Exception, SystemExit) as exc:
        return None, f"cannot import {name}: {type(exc).__name__}: {exc}"
    finally:
        for fd, old in zip((1, 2), saved, strict=False):
            os.dup2(old, fd)
            os.close(old)
        if devnull >= 0:
            os.close(devnull)


def _num(value: Any) -> float | None:
    """A number the binding returned, or None for "N/A" strings, dicts, bools and the like."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


class AmdsmiSource(SourceBase):
    name = "amdsmi"

    def __init__(self, context: SourceContext = DEFAULT_CONTEXT, *, module: ModuleType | Any | None = None,
                 procfs: Path | str = "/proc"):
        self.sysfs = Path(context.sysfs)
        # the /proc the library walks for its process list: always the process's own, whatever
        # --path.procfs says (a test hands a fixture tree)
        self.procfs = Path(procfs)
        self._host_pids = False
        self._visible: tuple[bool, str] | None = None  # procfs_visibility of this poll, once asked
        self.options = context.typed(AmdsmiOptions)
        self._module = module
        self._smi: Any = None
        self._handles: list[tuple[Any, Device]] = []
        self._unsupported: set[tuple[str, str]] = set()

    # -------------------------------------------------------------------------------- identity
    def _identity(self, handle: Any, index: int) -> Device:
        bdf = str(self._call("", "amdsmi_get_gpu_device_bdf", handle, quiet=True) or "")
        pci_dir = self.sysfs / "bus" / "pci" / "devices" / bdf
        card = ""
        with contextlib.suppress(OSError):
            for entry in sorted(os.listdir(pci_dir / "drm")):
                if re.fullmatch(r"card\d+", entry):
                    card = entry[4:]
                    break
        if not card:
            info = self._call("", "amdsmi_get_gpu_enumeration_info", handle, quiet=True)
            if isinstance(info, dict) and _num(info.get("drm_card")) is not None:
                card = str(int(info["drm_card"]))
        unique_id = ""
        with contextlib.suppress(OSError, UnicodeDecodeError):
            unique_id = (pci_dir / "unique_id").read_text().strip()
        asic = self._call("", "amdsmi_get_gpu_asic_info", handle, quiet=True)
        model = asic.get("market_name", "") if isinstance(asic, dict) else ""
        serial = asic.get("asic_serial", "") if isinstance(asic, dict) else ""
        return Device(
            key=bdf or f"amdsmi{index}", vendor="amd", index=card or str(index), mapping="amdsmi",
            uuid=unique_id or f"pci-{bdf or index}", model=str(model or "AMD GPU"),
            pci_bus_id=bdf, driver="amdgpu", serial=str(serial if serial != "N/A" else ""))

    # -------------------------------------------------------------------------------- lifecycle
    def open(self) -> None:
        smi = self._module
        if smi is None:
            smi, reason = import_amdsmi()
            if smi is None:
                raise SourceUnavailable(reason)
        self._smi = smi
        self._unsupported = set()
        try:
            flags = getattr(smi, "AmdSmiInitFlags", None)
            if flags is not None and hasattr(flags, "INIT_AMD_GPUS"):
                smi.amdsmi_init(flags.INIT_AMD_GPUS)
            else:
                smi.amdsmi_init()
            handles = list(smi.amdsmi_get_processor_handles())
        except Exception as exc:  # OSError in "degraded mode" wrappers, library errors, anything
            self._smi = None
            raise SourceUnavailable(f"amdsmi init failed: {type(exc).__name__}: {exc}") from None
        if not handles:
            with contextlib.suppress(Exception):
                smi.amdsmi_shut_down()
            self._smi = None
            raise SourceUnavailable("amdsmi found no AMD GPUs")
        self._handles = [(h, self._identity(h, i)) for i, h in enumerate(handles)]
        self._host_pids = host_pid_namespace(self.procfs)  # a process keeps its PID namespace

    def close(self) -> None:
        if self._smi is not None:
            with contextlib.suppress(Exception):
                self._smi.amdsmi_shut_down()
        self._smi = None
        self._handles = []

    # -------------------------------------------------------------------------------- calls
    def _call(self, key: str, fn: str, *args: Any, errors: Any = None, quiet: bool = False) -> Any:
        """Call ``amdsmi.<fn>(*args)``; None on any failure (counted unless quiet)."""
        memo = (key, fn + repr(args[1:]))
        if memo in self._unsupported:
            return None
        func = getattr(self._smi, fn, None)
        if func is None:
            self._unsupported.add(memo)
            return None
        try:
            return func(*args)
        except Exception as exc:
            code = None
            getter = getattr(exc, "get_error_code", None)
            if callable(getter):
                with contextlib.suppress(Exception):
                    code = getter()
            if code == NOT_SUPPORTED:
                self._unsupported.add(memo)
                kind = "not_supported"
            elif code in _TIMEOUTS:
                kind = "timeout"
            else:
                kind = "read_error"
            if errors is not None and not quiet:
                errors[kind] += 1
            return None

    # -------------------------------------------------------------------------------- poll
    def poll(self) -> PollResult:
        sample = PollResult()
        self._visible = None  # what amdsmi's process list can see: walked once per poll, when needed
        for handle, dev in self._handles:
            sample.devices.append(dev)
            sample.device_up[dev.key] = True
            try:
                self._poll_device(handle, dev.key, sample)
            except Exception:
                sample.errors["read_error"] += 1
        return sample

    def _poll_device(self, h: Any, key: str, sample: PollResult) -> None:
        errors = sample.errors
        total = self._call(key, "amdsmi_get_gpu_total_ecc_count", h, errors=errors)
        if isinstance(total, dict):
            for name in ("correctable_count", "uncorrectable_count", "deferred_count"):
                sample.add(key, f"ecc.{name}", _num(total.get(name)))
        blocks_enum = getattr(self._smi, "AmdSmiGpuBlock", None)
        blocks = self.options.ecc_blocks
        for block in DEFAULT_ECC_BLOCKS if blocks is None else blocks:
            member = getattr(blocks_enum, block, None)
            if member is None:
                continue
            counts = self._call(key, "amdsmi_get_gpu_ecc_count", h, member, errors=errors)
            if isinstance(counts, dict):
                for name in ("correctable_count", "uncorrectable_count", "deferred_count"):
                    sample.add(key, f"ecc_block.{name}", _num(counts.get(name)), (("block", block.lower()),))
        status = self._call(key, "amdsmi_get_gpu_xgmi_link_status", h, errors=errors)
        if isinstance(status, dict) and isinstance(status.get("status"), list):
            for i, st in enumerate(status["status"]):
                up = {"U": 1, "D": 0}.get(str(st).upper())
                sample.add(key, "xgmi.link_up", up, (("link", str(i)),))
        links = self._call(key, "amdsmi_get_link_metrics", h, errors=errors)
        if isinstance(links, dict) and isinstance(links.get("links"), list):
            for i, link in enumerate(links["links"]):
                if isinstance(link, dict):
                    sample.add(key, "xgmi.read_kb", _num(link.get("read")), (("link", str(i)),))
                    sample.add(key, "xgmi.write_kb", _num(link.get("write")), (("link", str(i)),))
        mode = self.options.processes
        if mode != "off":
            self._poll_processes(h, key, sample, mode)

    def _poll_processes(self, h: Any, key: str, sample: PollResult, mode: str) -> None:
        procs = self._call(key, "amdsmi_get_gpu_process_list", h, errors=sample.errors)
        if not isinstance(procs, list):
            mark(sample, key, "amdsmi", False, "not_supported")
            return
        if self._visible is None:
            self._visible = procfs_visibility(self.procfs, self._host_pids)
        mark(sample, key, "amdsmi", *self._visible)
        if mode == "count":  # the busy-client count only: the gfx engine counter per pid
            for p in procs:
                if isinstance(p, dict) and _num(p.get("pid")) is not None:
                    eng = p.get("engine_usage") if isinstance(p.get("engine_usage"), dict) else {}
                    sample.add(key, "client.engine_usage.gfx", _num(eng.get("gfx")),
                               (("client", str(int(p["pid"]))),))
            return
        rows: list[tuple[float, str, str, dict[str, float | None]]] = []
        for p in procs:
            if not isinstance(p, dict) or _num(p.get("pid")) is None:
                continue
            mem = p.get("memory_usage") if isinstance(p.get("memory_usage"), dict) else {}
            eng = p.get("engine_usage") if isinstance(p.get("engine_usage"), dict) else {}
            values = {
                "process.mem": _num(p.get("mem")),
                "process.vram_mem": _num(mem.get("vram_mem")),
                "process.gtt_mem": _num(mem.get("gtt_mem")),
                "process.cpu_mem": _num(mem.get("cpu_mem")),
                "process.engine_usage.gfx": _num(eng.get("gfx")),
                "process.engine_usage.enc": _num(eng.get("enc")),
            }
            name = p.get("name")
            pname = name if isinstance(name, str) and name and name != "N/A" else "unknown"
            rows.append((values["process.vram_mem"] or 0.0, str(int(p["pid"])), pname, values))
        rows.sort(key=lambda r: -r[0])
        top_n = self.options.process_top_n
        other: dict[str, float] = {}
        for rank, (_, pid, pname, values) in enumerate(rows):
            for field_name, value in values.items():
                if value is None:
                    continue
                if rank < top_n:
                    sample.add(key, field_name, value, (("pid", pid), ("process", pname)))
                elif not field_name.startswith("process.engine_usage"):  # counters of gone pids don't sum
                    other[field_name] = other.get(field_name, 0.0) + value
        for field_name, value in other.items():
            sample.add(key, field_name, value, (("pid", "other"), ("process", "other")))
