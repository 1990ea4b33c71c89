"""Per-process GPU utilization and memory, bounded to the top N processes per GPU.

Two modes (``processes`` option, sources/evidence.py).  ``count`` (the default) reads only what
the busy-client count needs: ``client.sm_util`` (label ``client``, the pid, never exported) from
nvmlDeviceGetProcessUtilization, and on MIG GPUs (where NVML reports no per-process
utilization) ``client.contexts`` per GPU instance from the compute process list of each MIG
device, asked with the MIG device's own handle (NVML documents that the parent handle returns
the aggregate in MIG mode only to a caller with the privilege for it); each GPU is marked with
``client.evidence`` (1 when every call answered; else 0 and the reason: ``no_permission``,
``not_supported``, ``read_error``, ``mps_clients_uncountable``, ``mps_client_activity_unknown``).
No name is exported; one is read only to recognise the CUDA MPS server among the sampled pids
(``_mps``: its active clients in NVML's MPS process list are counted instead).  ``series``
exports the per-process series below as well.

Raw fields of ``series``: ``process.sm_util`` (percent, from nvmlDeviceGetProcessUtilization samples since the
last poll) and ``process.memory_used`` (bytes, from nvmlDeviceGetComputeRunningProcesses), with
labels ``pid`` and ``process`` (the command name from ``<procfs>/<pid>/comm``, else NVML's
process name) plus ``gpu_instance``/``compute_instance`` on MIG (memory only there).  Processes beyond the top N
(ranked by utilization, then memory) are summed under ``pid="other", process="other"``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import safefile
from .base import PollResult
from .evidence import COMM_MAX_BYTES, host_pid_namespace, mark
from .fdinfo_activity import cpu_time
from .nvml_calls import NOT_FOUND, SUCCESS, CallGuard
from .nvml_readers import MigInstance

INVALID_ID = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of a process entry outside MIG
# the MPS server's command name ("nvidia-cuda-mps-server"; /proc/<pid>/comm keeps 15 characters)
MPS_SERVER_COMM = "nvidia-cuda-mps"
MPS_UNCOUNTABLE = "mps_clients_uncountable"  # evidence reason (indicators/clients.UNCOUNTED)
MPS_NO_ACTIVITY = "mps_client_activity_unknown"  # the same, for clients whose CPU time is unreadable
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")  # the unit of utime and stime (proc(5))


@dataclass
class _Proc:
    pid: int
    sm: float | None = None
    mem: float | None = None
    gi: int | None = None
    ci: int | None = None


class ProcessReader:
    def __init__(self, nvml: Any, guard: CallGuard, procfs: Path, top_n: int = 10,
                 mode: str = "series", mps_cpu_percent: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.nvml = nvml
        self.guard = guard
        self.procfs = procfs
        self.top_n = max(0, int(top_n))
        self.mode = mode
        self.last_ts: dict[str, int] = {}
        self._names: dict[int, str] = {}
        # GPU -> MPS client -> (start time, CPU ticks, when read)
        self._cpu: dict[str, dict[int, tuple[bytes, int, float]]] = {}
        self._cpu_share = mps_cpu_percent / 100.0 * CLOCK_TICKS  # ticks per second of an active client
        self._clock = clock
        self._host_pids: bool | None = None

    def name(self, pid: int) -> str:
        if pid in self._names:
            return self._names[pid]
        name = ""
        try:
            # bounded while read (a comm is at most 16 bytes; --path.procfs may point anywhere)
            raw = safefile.read_path(self.procfs / str(pid) / "comm", COMM_MAX_BYTES)
            name = raw.decode("utf-8", "replace").strip()
        except OSError:
            try:
                name = str(self.nvml.nvmlSystemGetProcessName(pid)).rsplit("/", 1)[-1]
            except Exception:  # noqa: BLE001 - a name is best effort
                name = ""
        if len(self._names) > 4096:
            self._names.clear()
        self._names[pid] = name
        return name

    def read(self, sample: PollResult, key: str, handle: Any, mig: Sequence[MigInstance] = ()) -> None:
        """The GPU's clients (and, in ``series`` mode, its per-process series).  ``mig``: the
        GPU's MIG devices, which are asked one by one (the parent handle answers only a
        privileged caller in MIG mode)."""
        if mig:
            self._mig(sample, key, mig)
            return
        if self.mode == "count":
            self._count(sample, key, handle)
            return
        errors = sample.errors
        procs: dict[int, _Proc] = {}
        running = self.guard.call(errors, key, "process.memory_used",
                                  "nvmlDeviceGetComputeRunningProcesses", handle) or []
        for p in running:
            pr = procs.setdefault(int(p.pid), _Proc(int(p.pid)))
            if p.usedGpuMemory is not None:
                pr.mem = float(p.usedGpuMemory)
        answered = self._utilization(sample, key, handle)
        why = "not_supported"
        if answered is not None:
            answered, why, clients = self._mps(sample, key, handle, answered)
            for p in clients:  # the compute list names them too (an H200 did): no second count
                pr = procs.setdefault(int(p.pid), _Proc(int(p.pid)))
                if p.usedGpuMemory is not None:
                    pr.mem = float(p.usedGpuMemory)
        mark(sample, key, "nvml", answered is not None and not why, why)
        for pid, sm in (answered or {}).items():
            procs.setdefault(pid, _Proc(pid)).sm = sm
        self._emit(sample, key, list(procs.values()))

    def _emit(self, sample: PollResult, key: str, procs: list[_Proc]) -> None:
        """``series`` mode: the top N processes by utilization, then memory; the rest pooled."""
        ranked = sorted(procs, key=lambda p: (p.sm or 0.0, p.mem or 0.0, -p.pid), reverse=True)
        top, rest = ranked[: self.top_n], ranked[self.top_n:]
        for p in top:
            labels: tuple[tuple[str, str], ...] = (("pid", str(p.pid)), ("process", self.name(p.pid)))
            if p.gi is not None:
                labels += (("gpu_instance", str(p.gi)),)
                if p.ci is not None:
                    labels += (("compute_instance", str(p.ci)),)
            sample.add(key, "process.sm_util", p.sm, labels)
            sample.add(key, "process.memory_used", p.mem, labels)
        if rest:
            other = (("pid", "other"), ("process", "other"))
            sms = [p.sm for p in rest if p.sm is not None]
            mems = [p.mem for p in rest if p.mem is not None]
            if sms:
                sample.add(key, "process.sm_util", sum(sms), other)
            if mems:
                sample.add(key, "process.memory_used", sum(mems), other)

    def _utilization(self, sample: PollResult, key: str, handle: Any) -> dict[int, float] | None:
        """pid -> SM percent of the newest sample since the previous read; None when the call
        failed or is not supported (NOT_FOUND: no process ran since, an empty answer)."""
        samples = self.guard.call(sample.errors, key, "process.sm_util", "nvmlDeviceGetProcessUtilization",
                                  handle, self.last_ts.get(key, 0),
                                  empty_codes=(SUCCESS, NOT_FOUND), empty=[])
        if samples is None:
            self._keep(key, sample.errors)
            return None
        latest: dict[int, Any] = {}
        for s in samples:
            pid = int(s.pid)
            if pid not in latest or s.timeStamp > latest[pid].timeStamp:
                latest[pid] = s
            self.last_ts[key] = max(self.last_ts.get(key, 0), int(s.timeStamp))
        return {pid: float(s.smUtil) for pid, s in latest.items()}

    def _count(self, sample: PollResult, key: str, handle: Any) -> None:
        """Count-only evidence: per-client utilization (internal); no names, no memory."""
        latest = self._utilization(sample, key, handle)
        if latest is None:
            mark(sample, key, "nvml", False, "not_supported")
            return
        latest, why, _ = self._mps(sample, key, handle, latest)
        for pid, sm in sorted(latest.items()):
            sample.add(key, "client.sm_util", sm, (("client", str(pid)),))
        mark(sample, key, "nvml", not why, why)

    def _mps(self, sample: PollResult, key: str, handle: Any,
             util: dict[int, float]) -> tuple[dict[int, float], str, list[Any]]:
        """CUDA MPS: the utilization samples name the MPS server for the work of all its clients
        (the clients have no samples of their own; seen on an H200, deploy/device-check's MPS
        case), so the server is no tenant and each client listed by
        nvmlDeviceGetMPSComputeRunningProcesses that is active (``_active``) is one, at the
        server's utilization (NVML reports no per-client share).  Returns (pid -> percent, why
        the count is partial, the MPS clients).  The server is recognised by its name
        (``nvidia-cuda-mps-server``), read only where the list names clients or cannot be read
        (never exported in count mode); where it cannot be read (no permission, not supported,
        vGPU) and a sample names the server, the server stays as one client and the count is
        partial (``mps_clients_uncountable``): one busy server may stand for any number of tenants."""
        if not util:
            self._keep(key, sample.errors)
            return util, "", []
        clients = self.guard.call(sample.errors, key, "client.mps", "nvmlDeviceGetMPSComputeRunningProcesses",
                                  handle)
        if clients == []:  # no MPS client: nothing to look for (the common case reads no name)
            self._cpu.pop(key, None)
            return util, "", []
        servers = [pid for pid in util if self._is_mps_server(pid)]
        if not servers:
            self._keep(key, sample.errors)
            return util, "", list(clients or [])
        if clients is None:
            self._keep(key, sample.errors)
            return util, MPS_UNCOUNTABLE, []
        busy = max(util[pid] for pid in servers)
        out = {pid: v for pid, v in util.items() if pid not in servers}
        pids = sorted({int(p.pid) for p in clients} - set(servers))
        if not pids:  # a list that names the server only: the server's work is one tenant's
            out[min(servers)] = busy
            return out, "", list(clients)
        active, why = self._active(key, pids, sample.errors, busy > 0)
        for pid in active:
            out[pid] = max(out.get(pid, 0.0), busy)
        return out, why, list(clients)

    def _active(self, key: str, pids: list[int], errors: Any, busy: bool) -> tuple[list[int], str]:
        """The MPS clients that submitted work since the previous poll, and why that is not
        known of all of them.  MPS has no per-client activity, and a client holds its listing
        while idle (an H200 listed a paused process beside a busy one), so a listed client is
        no proof of a tenant at work.  What is read instead is the client's CPU time
        (``utime`` + ``stime`` of ``<procfs>/<pid>/stat``, world-readable, the whole thread
        group): submitting work takes CPU time, so a client that ran less than
        ``mps_client_cpu_percent`` of a core since the previous poll (and at least one tick) is
        idle: an H200's paused client, its CUDA threads alive, ran about 0.1 % of a core, a busy
        copy loop 100 %.  A lone client is the server's work, whatever its time (its time is
        still taken: it is the baseline when a second client comes).  Unknown, which leaves the
        count partial (``mps_client_activity_unknown``; two clients known active still prove
        co-tenancy): a client seen for the first time (no previous time; the same pid with
        another start time is another process), a stat that cannot be read (exited, hidepid),
        every client where ``procfs`` is not the host's pid namespace (NVML's pids are the
        host's), and a busy server none of whose clients ran (blocking waits on long kernels:
        which of them submitted cannot be told)."""
        if self._host_pids is None:
            self._host_pids = host_pid_namespace(self.procfs)
        if not self._host_pids:
            return (pids, "") if len(pids) <= 1 else ([], MPS_NO_ACTIVITY)
        last = self._cpu.get(key, {})
        now = self._cpu_times(key, pids, errors)
        if len(pids) <= 1:
            return pids, ""
        active = [pid for pid in pids if pid in now and pid in last and last[pid][0] == now[pid][0]
                  and now[pid][1] - last[pid][1] >= max(1.0, self._cpu_share * (now[pid][2] - last[pid][2]))]
        unknown = any(pid not in now or pid not in last or last[pid][0] != now[pid][0] for pid in pids)
        return active, MPS_NO_ACTIVITY if unknown or (busy and not active) else ""

    def _keep(self, key: str, errors: Any) -> None:
        """A poll that does not judge the MPS clients still takes their CPU times: no baseline
        goes stale over polls without samples, without the server, or without an answer."""
        if key in self._cpu:
            self._cpu_times(key, list(self._cpu[key]), errors)

    def _cpu_times(self, key: str, pids: list[int], errors: Any) -> dict[int, tuple[bytes, int, float]]:
        """The CPU times of ``pids`` now, kept as the next poll's baseline (``_active``)."""
        t = self._clock()
        now = {pid: (*got, t) for pid in pids if (got := cpu_time(str(self.procfs), str(pid), errors))}
        if now:
            self._cpu[key] = now
        else:
            self._cpu.pop(key, None)
        return now

    def _is_mps_server(self, pid: int) -> bool:
        return self.name(pid).startswith(MPS_SERVER_COMM)

    def _mig(self, sample: PollResult, key: str, instances: Sequence[MigInstance]) -> None:
        """A MIG GPU: the processes holding a compute context on each MIG device, asked with
        that device's own handle (NVML gives no per-process utilization in MIG mode), counted per
        GPU instance.  The evidence is complete only when every MIG device answered; one that
        did not leaves the count partial (its instance gets no count: never "0 clients").

        A process is counted in the GPU instance its entry names (``gpuInstanceId``, where
        valid), not the one the scan recorded for the handle: after a MIG reconfiguration a
        handle may answer for another instance.  Such an answer, like a failed call, is counted
        as a ``read_error`` (the source rescans the GPU's MIG devices on the next poll) and
        leaves the evidence partial; an instance the scan does not know is not counted."""
        per_gi: dict[int, set[int]] = {}
        gi_labels = {inst.gpu_instance: inst.gi_labels for inst in instances}
        procs: list[_Proc] = []
        failed = ""
        for inst in instances:
            field = f"client.contexts.{inst.gpu_instance}.{inst.compute_instance}"
            running = self.guard.call(sample.errors, key, field, "nvmlDeviceGetComputeRunningProcesses",
                                      inst.handle)
            if running is None:
                failed = failed or self.guard.failure_reason(key, field)
                continue
            ids = [_instance_ids(p, inst) for p in running]
            if any(gi != inst.gpu_instance for gi, _ in ids):  # it answers for another instance
                sample.errors["read_error"] += 1
                failed = failed or "read_error"
            for p, (gi, ci) in zip(running, ids, strict=True):
                if gi not in gi_labels:
                    continue
                pids = per_gi.setdefault(gi, set())
                pid = int(p.pid)
                if pid in pids:
                    continue
                pids.add(pid)
                if self.mode == "series":
                    mem = float(p.usedGpuMemory) if p.usedGpuMemory is not None else None
                    procs.append(_Proc(pid, None, mem, gi, ci))
        for gi, pids in sorted(per_gi.items()):  # never empty: a set is made for its first pid
            sample.add(key, "client.contexts", len(pids), gi_labels[gi])
        mark(sample, key, "nvml", not failed, failed)
        if self.mode == "series":
            self._emit(sample, key, procs)


def _instance_ids(p: Any, inst: MigInstance) -> tuple[int, int]:
    """(GPU instance, compute instance) of a process entry read through ``inst``'s handle: the
    entry's own ids where valid (NVML: 0xFFFFFFFF when not set), else the scanned instance's."""
    gi = getattr(p, "gpuInstanceId", None)
    ci = getattr(p, "computeInstanceId", None)
    if not isinstance(gi, int) or not 0 <= gi < INVALID_ID:
        return inst.gpu_instance, inst.compute_instance
    return gi, ci if isinstance(ci, int) and 0 <= ci < INVALID_ID else inst.compute_instance
