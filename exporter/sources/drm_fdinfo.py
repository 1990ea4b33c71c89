"""Per-process GPU engine utilization and memory from DRM fdinfo (vendor-neutral).

Scans ``<procfs>/<pid>/fd`` for DRM file descriptors, parses the matching
``<procfs>/<pid>/fdinfo/<fd>`` (``fdinfo_parser``), de-duplicates clients by
``(drm-pdev, drm-client-id)`` (one client is often reachable through several fds and processes)
and turns two successive samples into busy percentages:

- ns counters (i915, amdgpu, msm, ...): ``Δdrm-engine-<e> / Δwall-time``;
- cycle counters (xe): ``Δdrm-cycles-<e> / Δdrm-total-cycles-<e>``;
- cycles with ``drm-maxfreq-<e>`` and no ns counter: ``Δcycles / (maxfreq × Δwall-time)``;

each divided by ``drm-engine-capacity-<e>`` (1 when absent).  A counter that goes backwards is
ignored (the previous, larger value is kept until it catches up), as the kernel document asks.

Readings (device key = PCI address ``0000:03:00.0``, so they merge with the vendor source of the
same GPU): ``process.engine_utilization`` (percent; labels pid, process, engine) and
``process.memory`` (bytes resident; labels pid, process, region).  Cardinality is bounded:
``options.top_n`` processes per GPU (default 5), the rest summed under ``pid="other"``.  Those
are exported with ``options.processes: series`` only; the default ``count`` emits the internal
``client.engine_utilization`` (label ``client``, no process name read) for the busy-client count
of the indicators, and marks every amdgpu / i915 / xe card with ``client.evidence``: complete when
the procfs is the host's PID namespace (kthreadd is pid 2) and every process's fd table was
readable (``pid_namespace_private`` / ``procfs_unreadable`` otherwise: docs/privileges.md).

Cost: one ``readlink`` per fd (no open) decides whether an fd is a DRM device; only DRM fds have
their fdinfo read.  procfs is read under the ``exporter.safefile`` rule (the tree may be a host
``/proc`` mounted into a container, or a fixture): only all-ASCII-digit pid directories, each
fdinfo file opened through its directory fd without following a symlink or blocking on a FIFO,
a regular file of at most ``FDINFO_MAX_BYTES`` (a larger one is a ``read_error``, not read on).  Targets outside ``/dev/dri`` under ``/dev`` are stat'ed once and the verdict
is cached by ``(pid, fd, target)``.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from .base import Abilities, Device, PollResult, SourceBase, SourceUnavailable
from .context import DEFAULT_CONTEXT, SourceContext
from .evidence import mark, visibility
from .fdinfo_debugfs import COUNTED_DRIVERS
from .fdinfo_parser import FdinfoRecord, normalize_pdev
from .fdinfo_records import make_scanner
from .fdinfo_scan import ScanLimits
from .options import FdinfoOptions
from .sysfs_util import device_driver, read_kv

log = logging.getLogger(__name__)

# Device.vendor from the DRM driver name (identity, not a metric mapping).
DRIVER_VENDOR = {"i915": "intel", "xe": "intel", "amdgpu": "amd", "nvidia-drm": "nvidia", "nvidia": "nvidia"}
_CARD_RE = re.compile(r"^card(\d+)$")
# drivers whose fdinfo carries engine usage (drm-engine-*, drm-cycles-*): their clients can be counted
EVIDENCE_DRIVERS = COUNTED_DRIVERS
MAX_CLIENTS = 64  # internal client readings per GPU and poll (the count needs two)


@dataclass(slots=True)
class _ClientState:
    """Largest counter values seen so far for one client (the monotonic clamp)."""

    t: float
    ns: dict[str, int] = field(default_factory=dict)
    cycles: dict[str, tuple[int, int]] = field(default_factory=dict)  # engine -> (cycles, total)
    freq_cycles: dict[str, int] = field(default_factory=dict)  # cycles used with drm-maxfreq


@dataclass(slots=True)
class _Proc:
    """One process's usage of one GPU, summed over its clients."""

    pid: str
    util: dict[str, float] = field(default_factory=dict)
    memory: dict[str, int] = field(default_factory=dict)

    def rank(self) -> tuple[float, int]:
        return (max(self.util.values(), default=0.0), sum(self.memory.values()))


def engine_utilization(rec: FdinfoRecord, prev: _ClientState, dt_s: float) -> dict[str, float]:
    """Busy percent per engine between ``prev`` and ``rec``; updates ``prev`` (monotonic clamp)."""
    out: dict[str, float] = {}
    for eng, tot in rec.total_cycles.items():
        cyc = rec.cycles.get(eng)
        if cyc is None:
            continue
        old = prev.cycles.get(eng)
        if old is None:
            prev.cycles[eng] = (cyc, tot)
            continue
        if cyc < old[0] or tot < old[1]:  # backwards: keep the larger values, no value now
            prev.cycles[eng] = (max(cyc, old[0]), max(tot, old[1]))
            continue
        prev.cycles[eng] = (cyc, tot)
        if tot > old[1]:
            out[eng] = (cyc - old[0]) / (tot - old[1]) * 100.0 / rec.capacity.get(eng, 1)
    for eng, ns in rec.engine_ns.items():
        if eng in out or (eng in rec.total_cycles and eng in rec.cycles):
            continue
        old_ns = prev.ns.get(eng)
        prev.ns[eng] = ns if old_ns is None else max(ns, old_ns)
        if old_ns is None or ns < old_ns or dt_s <= 0:
            continue
        out[eng] = (ns - old_ns) / (dt_s * 1e9) * 100.0 / rec.capacity.get(eng, 1)
    for eng, hz in rec.maxfreq_hz.items():
        cyc = rec.cycles.get(eng)
        if cyc is None or eng in out or eng in rec.engine_ns or eng in rec.total_cycles or hz <= 0:
            continue
        old_c = prev.freq_cycles.get(eng)
        prev.freq_cycles[eng] = cyc if old_c is None else max(cyc, old_c)
        if old_c is None or cyc < old_c or dt_s <= 0:
            continue
        out[eng] = (cyc - old_c) / (hz * dt_s) * 100.0 / rec.capacity.get(eng, 1)
    return out


def card_drivers(sysfs: Path) -> dict[str, str]:
    """PCI address -> DRM driver name of each ``<sysfs>/class/drm/card*``."""
    out: dict[str, str] = {}
    drm = Path(sysfs) / "class" / "drm"
    for addr, card in card_indices(sysfs).items():
        out[addr] = device_driver(drm / f"card{card}" / "device")
    return out


def card_indices(sysfs: Path) -> dict[str, str]:
    """PCI address -> DRM card number, from ``<sysfs>/class/drm/card*/device``."""
    out: dict[str, str] = {}
    drm = Path(sysfs) / "class" / "drm"
    try:
        entries = sorted(drm.iterdir())
    except OSError:
        return out
    for entry in entries:
        m = _CARD_RE.match(entry.name)
        if not m:
            continue
        addr = ""
        try:
            addr = normalize_pdev(Path(os.readlink(entry / "device")).name)
        except OSError:
            pass
        if not addr:
            addr = normalize_pdev(read_kv(entry / "device" / "uevent").get("PCI_SLOT_NAME", ""))
        if addr:
            out.setdefault(addr, m.group(1))
    return out


class DrmFdinfoSource(SourceBase):
    """Per-process engine utilization and memory from ``/proc/*/fdinfo`` (all DRM drivers)."""

    name: ClassVar[str] = "fdinfo"
    # its cards are the GPUs a native source (amdgpu, intel) reads: it borrows their identity by
    # PCI address, so its client counts land on those GPUs (docs/detection.md)
    abilities: ClassVar[Abilities] = Abilities(provides_identity=False)

    def __init__(self, context: SourceContext = DEFAULT_CONTEXT, *,
                 clock: Callable[[], float] | None = None) -> None:
        self.procfs = Path(context.procfs)
        self.sysfs = Path(context.sysfs)
        options = context.typed(FdinfoOptions)
        self.top_n = options.top_n  # < 0: every process, no "other"
        self.mode = options.processes
        self._clock = clock or (lambda: time.monotonic())
        self._scanner = make_scanner(self.procfs, self.sysfs, ScanLimits(
            max_fds=options.scan_max_fds, max_seconds=options.scan_max_seconds,
            check_period=options.scan_check_period, verify_period=options.scan_verify_period),
            names=self.mode == "series")  # in this process, or the privilege-separated counter
        self._clients: dict[tuple[str, str], _ClientState] = {}
        self._devices: dict[str, Device] = {}
        self._cards: dict[str, str] = {}
        self._counted: dict[str, str] = {}  # pdev -> driver of the cards whose clients are counted
        self._drivers: dict[str, str] = {}  # pdev -> DRM driver of every card ("" unknown)
        self._maybe = False  # a card whose driver could not be read (a capture): scanned
        self._drm_names: frozenset[str] | None = None  # the entries of class/drm last read

    def open(self) -> None:
        if self.mode == "off":
            raise SourceUnavailable("processes: off")
        if not self.procfs.is_dir():
            raise SourceUnavailable(f"procfs not found at {self.procfs}")
        self._cards = card_indices(self.sysfs)
        if not self._cards:  # on by default: a node without DRM cards does not have this source
            raise SourceUnavailable(f"no DRM card under {self.sysfs}/class/drm")
        self._refresh_counted()
        if not self._counted and not self._maybe:  # the runner opens again next poll: a card
            raise SourceUnavailable(self._uncounted_reason())

    def _refresh_counted(self) -> None:
        """The cards bound to a driver whose clients can be counted, re-read when the entries of
        ``class/drm`` change (one listdir a poll): a card appears with its driver's binding and
        goes with its unbinding (hot-plug, driver load or unbind)."""
        try:
            names = frozenset(os.listdir(self.sysfs / "class" / "drm"))
        except OSError:
            names = frozenset()
        if names == self._drm_names:
            return
        self._drm_names = names
        self._cards = card_indices(self.sysfs)
        self._drivers = card_drivers(self.sysfs)
        self._counted = {a: d for a, d in self._drivers.items() if d in EVIDENCE_DRIVERS}
        self._maybe = any(not d for d in self._drivers.values())  # a driver not readable: scan anyway

    def _uncounted_reason(self) -> str:
        bound = ", ".join(sorted(set(self._drivers.values()))) or "none"
        return (f"no DRM card bound to a counted driver ({', '.join(sorted(EVIDENCE_DRIVERS))}) under "
                f"{self.sysfs}/class/drm (drivers: {bound}): /proc is not scanned")

    def close(self) -> None:
        self._scanner.close()
        self._clients.clear()
        self._devices.clear()

    def _device(self, pdev: str, driver: str) -> Device | None:
        dev = self._devices.get(pdev)
        if dev is not None:
            return dev
        vendor = DRIVER_VENDOR.get(driver)
        if vendor is None:
            return None
        if pdev not in self._cards:
            self._cards = card_indices(self.sysfs)
        dev = Device(key=pdev, vendor=vendor, index=self._cards.get(pdev, pdev), mapping="drm_fdinfo",
                     pci_bus_id=pdev, driver=driver)
        self._devices[pdev] = dev
        if driver in EVIDENCE_DRIVERS:
            self._counted.setdefault(pdev, driver)
        return dev

    def poll(self) -> PollResult:
        sample = PollResult()
        now = self._clock()
        sample.monotonic = now
        seen: dict[tuple[str, str], _ClientState] = {}
        procs: dict[str, dict[str, _Proc]] = {}  # pdev -> pid -> usage
        self._refresh_counted()
        if not self._counted and not self._maybe:  # every counted card went away: no scan until one is back
            self._clients.clear()
            sample.errors["no_counted_driver"] += 1
            return sample
        for pid, fd, rec in self._scanner.scan(sample.errors, now):
            if rec.malformed:
                sample.errors["parse_error"] += rec.malformed
            if not rec.pdev or self._device(rec.pdev, rec.driver) is None:
                continue  # platform devices and drivers of no known vendor are not attributed
            key = (rec.pdev, rec.client_id or f"fd:{pid}/{fd}")
            if key in seen:
                continue  # same client through another fd or process: count once
            state = self._clients.get(key)
            if state is None:
                state = _ClientState(t=now)
                engine_utilization(rec, state, 0.0)  # first sample: remember counters only
                util: dict[str, float] = {}
            else:
                util = engine_utilization(rec, state, now - state.t)
                state.t = now
            seen[key] = state
            proc = procs.setdefault(rec.pdev, {}).setdefault(pid, _Proc(pid))
            for eng, pct in util.items():
                proc.util[eng] = proc.util.get(eng, 0.0) + pct
            for region, nbytes in rec.resident().items():
                proc.memory[region] = proc.memory.get(region, 0) + nbytes
        self._clients = seen
        self._mark(sample)
        # the self-metric: 1 when the scan ran in the privilege-separated counting process
        sample.self_samples.append(("privilege_separated", (), 1.0 if self._scanner.separated else 0.0))
        sample.devices = list(self._devices.values())
        for pdev, by_pid in procs.items():
            if self.mode == "count":
                self._emit_clients(sample, pdev, by_pid)
            else:
                self._emit(sample, pdev, by_pid)
        return sample

    def _mark(self, sample: PollResult) -> None:
        """``client.evidence`` for every card whose driver reports engine usage."""
        if not self._counted:
            return
        complete, reason = visibility(self._scanner.host_pids, bool(self._scanner.unreadable), self._scanner.partial)
        if self._scanner.failed:  # the counting process gave no usable answer
            complete, reason = False, "read_error"
        if self._scanner.budget_hit:  # the self-metric: polls whose scan stopped at its budget
            sample.errors["scan_budget_exceeded"] += 1
        for pdev, driver in self._counted.items():
            if self._device(pdev, driver) is not None:
                mark(sample, pdev, "fdinfo", complete, reason)

    def _emit_clients(self, sample: PollResult, pdev: str, by_pid: dict[str, _Proc]) -> None:
        """Count-only: each busy process's engine percentages, by pid, for the indicators."""
        ranked = sorted(by_pid.values(), key=lambda p: (-p.rank()[0], int(p.pid)))[:MAX_CLIENTS]
        for p in ranked:
            for eng, pct in sorted(p.util.items()):
                sample.add(pdev, "client.engine_utilization", pct, (("client", p.pid), ("engine", eng)))

    def _emit(self, sample: PollResult, pdev: str, by_pid: dict[str, _Proc]) -> None:
        ranked = sorted(by_pid.values(), key=lambda p: (-p.rank()[0], -p.rank()[1], int(p.pid)))
        keep = ranked if self.top_n < 0 else ranked[: self.top_n]
        rest = [] if self.top_n < 0 else ranked[self.top_n:]
        rows = [(p.pid, self._scanner.comm(p.pid), p.util, p.memory) for p in keep]
        if rest:
            util: dict[str, float] = {}
            mem: dict[str, int] = {}
            for p in rest:
                for k, v in p.util.items():
                    util[k] = util.get(k, 0.0) + v
                for k, v in p.memory.items():
                    mem[k] = mem.get(k, 0) + v
            rows.append(("other", "other", util, mem))
        for pid, comm, util, mem in rows:
            for eng, pct in sorted(util.items()):
                sample.add(pdev, "process.engine_utilization", pct,
                           (("pid", pid), ("process", comm), ("engine", eng)))
            for region, nbytes in sorted(mem.items()):
                sample.add(pdev, "process.memory", nbytes,
                           (("pid", pid), ("process", comm), ("region", region)))
