"""Which pod and container a host PID belongs to, from ``<procfs>/<pid>/cgroup``.

The kubelet puts every container in a cgroup below ``kubepods``; the path names the pod UID
and the container ID. The shapes differ by cgroup version, cgroup driver and runtime:

=========================  ============================================================================
cgroup v2, systemd driver  ``0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/cri-containerd-<id>.scope``
                           (CRI-O: ``crio-<id>.scope``; cri-dockerd: ``docker-<id>.scope``; Guaranteed
                           pods sit directly under ``kubepods.slice/kubepods-pod<uid_>.slice``)
cgroup v2, cgroupfs        ``0::/kubepods/besteffort/pod<uid>/<id>``
cgroup v1                  one line per hierarchy, ``4:memory:/kubepods/burstable/pod<uid>/<id>`` or the
                           systemd form above; containerd's v1 systemd form is
                           ``/system.slice/containerd.service/kubepods-burstable-pod<uid_>.slice:cri-containerd:<id>``
nested (kind, k3d)         any prefix before ``kubepods`` (``/kubelet.slice/kubelet-kubepods.slice/...``)
=========================  ============================================================================

systemd slice names spell the UID's dashes as underscores; it is returned with dashes.
CRI-O's ``crio-conmon-<id>.scope`` is the container monitor, not the workload, and is ignored.
Input is bounded (the file is read up to 64 KiB) and matched by anchored expressions only.
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from dataclasses import dataclass

MAX_CGROUP_BYTES = 64 * 1024

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
# the pod component: "pod<uid>" (cgroupfs) or "kubepods[-<qos>]-pod<uid_>.slice" (systemd)
_POD_RE = re.compile(rf"^(?:[a-z0-9-]*kubepods(?:-[a-z]+)?-)?pod({_UID})(?:\.slice)?$")
# the container component, after the pod component
_CONTAINER_RE = re.compile(r"^(?:(cri-containerd|crio|docker|containerd)[-:])?([0-9a-f]{64})(?:\.scope)?$")
# containerd's cgroup v1 systemd form packs pod and container into one component
_V1_SYSTEMD_RE = re.compile(
    rf"^(?:[a-z0-9-]*-)?kubepods(?:-[a-z]+)?-pod({_UID})\.slice:(cri-containerd|crio|docker):([0-9a-f]{{64}})$")


@dataclass(frozen=True, slots=True)
class ContainerRef:
    pod_uid: str       # with dashes, lower case
    container_id: str  # 64 hex digits
    runtime: str       # containerd, cri-o, docker or "" (cgroupfs paths do not say)


NOT_IN_POD = ContainerRef("", "", "")  # the cgroup file was read: a host process, no pod

_RUNTIME = {"cri-containerd": "containerd", "containerd": "containerd", "crio": "cri-o",
            "docker": "docker", None: ""}


def parse_cgroup_path(path: str) -> ContainerRef | None:
    """The pod and container of one cgroup path, or None when it is not a pod container."""
    parts = [p for p in path.strip().split("/") if p]
    if not any("kubepods" in p for p in parts):
        return None
    for i, part in enumerate(parts):
        if (m := _V1_SYSTEMD_RE.match(part)) is not None:
            return ContainerRef(m.group(1).replace("_", "-"), m.group(3), _RUNTIME[m.group(2)])
        pm = _POD_RE.match(part)
        if pm is None or i + 1 >= len(parts):
            continue
        cm = _CONTAINER_RE.match(parts[i + 1])
        if cm is None:
            return None  # crio-conmon-<id>.scope, a pod-level process, a sandbox sub-cgroup
        return ContainerRef(pm.group(1).replace("_", "-"), cm.group(2), _RUNTIME[cm.group(1)])
    return None


def parse_proc_cgroup(text: str) -> ContainerRef | None:
    """``/proc/<pid>/cgroup`` content (v1: several ``id:controllers:path`` lines; v2: ``0::path``)."""
    for line in text.splitlines():
        _, sep, rest = line.partition(":")
        if not sep:
            continue
        _, sep, path = rest.partition(":")
        if sep and (ref := parse_cgroup_path(path)) is not None:
            return ref
    return None


def read_pid(procfs: str, pid: int) -> ContainerRef | None:
    """Read and parse one process's cgroup file: None when gone or unreadable, ``NOT_IN_POD``
    for a process outside every pod."""
    try:
        fd = os.open(f"{procfs}/{int(pid)}/cgroup", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, MAX_CGROUP_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    return parse_proc_cgroup(data.decode("ascii", "replace")) or NOT_IN_POD


class PidCache:
    """Bounded LRU of ``pid -> (process start time, ContainerRef | None)``.

    A PID is re-read when its start time (field 22 of ``<pid>/stat``) changes, so a recycled PID
    never inherits the pod of the process that had it before."""

    def __init__(self, procfs: str, size: int = 8192) -> None:
        self.procfs = procfs
        self.size = max(1, int(size))
        self._entries: OrderedDict[int, tuple[str, ContainerRef | None]] = OrderedDict()
        self.reads = 0

    def _start_time(self, pid: int) -> str | None:
        try:
            with open(f"{self.procfs}/{int(pid)}/stat", "rb") as f:
                raw = f.read(4096)
        except OSError:
            return None
        # comm may hold spaces and ')'; the fields after the last ')' are fixed
        tail = raw.rpartition(b")")[2].split()
        return tail[19].decode() if len(tail) > 19 else None

    def lookup(self, pid: int) -> ContainerRef | None:
        start = self._start_time(pid)
        if start is None:
            self._entries.pop(pid, None)
            return None
        hit = self._entries.get(pid)
        if hit is not None and hit[0] == start:
            self._entries.move_to_end(pid)
            return hit[1]
        self.reads += 1
        ref = read_pid(self.procfs, pid)
        self._entries[pid] = (start, ref)
        self._entries.move_to_end(pid)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return ref

    def __len__(self) -> int:
        return len(self._entries)
