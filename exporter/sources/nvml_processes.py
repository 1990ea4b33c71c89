"""Per-process GPU utilization and memory (opt-in), bounded to the top N processes per GPU.

Raw fields: ``process.sm_util`` (percent, from nvmlDeviceGetProcessUtilization samples since the
last poll) and ``process.memory_used`` (bytes, from nvmlDeviceGetComputeRunningProcesses), with
labels ``pid`` and ``process`` (the command name from ``<procfs>/<pid>/comm``, else NVML's
process name) plus ``gpu_instance``/``compute_instance`` on MIG.  Processes beyond the top N
(ranked by utilization, then memory) are summed under ``pid="other", process="other"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import PollResult
from .nvml_calls import NOT_FOUND, SUCCESS, CallGuard

INVALID_ID = 0xFFFFFFFF  # gpuInstanceId/computeInstanceId of a process outside MIG


@dataclass
class _Proc:
    pid: int
    sm: float | None = None
    mem: float | None = None
    gi: int | None = None
    ci: int | None = None


class ProcessReader:
    def __init__(self, nvml: Any, guard: CallGuard, procfs: Path, top_n: int = 10) -> None:
        self.nvml = nvml
        self.guard = guard
        self.procfs = procfs
        self.top_n = max(0, int(top_n))
        self.last_ts: dict[str, int] = {}
        self._names: dict[int, str] = {}

    def name(self, pid: int) -> str:
        if pid in self._names:
            return self._names[pid]
        name = ""
        try:
            name = (self.procfs / str(pid) / "comm").read_text().strip()
        except OSError:
            try:
                name = str(self.nvml.nvmlSystemGetProcessName(pid)).rsplit("/", 1)[-1]
            except Exception:  # noqa: BLE001 - a name is best effort
                name = ""
        if len(self._names) > 4096:
            self._names.clear()
        self._names[pid] = name
        return name

    def read(self, sample: PollResult, key: str, handle: Any) -> None:
        errors = sample.errors
        procs: dict[int, _Proc] = {}
        running = self.guard.call(errors, key, "process.memory_used",
                                  "nvmlDeviceGetComputeRunningProcesses", handle) or []
        for p in running:
            pr = procs.setdefault(int(p.pid), _Proc(int(p.pid)))
            if p.usedGpuMemory is not None:
                pr.mem = float(p.usedGpuMemory)
            gi = getattr(p, "gpuInstanceId", INVALID_ID)
            ci = getattr(p, "computeInstanceId", INVALID_ID)
            if gi is not None and gi != INVALID_ID:
                pr.gi, pr.ci = int(gi), (int(ci) if ci is not None and ci != INVALID_ID else None)
        samples = self.guard.call(errors, key, "process.sm_util", "nvmlDeviceGetProcessUtilization",
                                  handle, self.last_ts.get(key, 0),
                                  empty_codes=(SUCCESS, NOT_FOUND), empty=[]) or []
        latest: dict[int, Any] = {}
        for s in samples:
            if s.pid not in latest or s.timeStamp > latest[s.pid].timeStamp:
                latest[int(s.pid)] = s
            self.last_ts[key] = max(self.last_ts.get(key, 0), int(s.timeStamp))
        for pid, s in latest.items():
            procs.setdefault(pid, _Proc(pid)).sm = float(s.smUtil)
        ranked = sorted(procs.values(), key=lambda p: (p.sm or 0.0, p.mem or 0.0, -p.pid), reverse=True)
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
