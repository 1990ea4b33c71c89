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
nested (kind)              ``/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-<qos>.slice/...``
cgroup namespace           leading ``..`` (the exporter in a pod with a private cgroup namespace):
                           ``/../../kubepods-besteffort-pod<uid_>.slice/cri-containerd-<id>.scope``
=========================  ============================================================================

Paths are anchored at the top of the kubelet's tree and followed down level by level (systemd
slices each named after their parent); a ``kubepods-...-pod<uid>`` component anywhere else, e.g.
in a user's delegated ``user.slice`` subtree (which that user may name as they like), is not a
pod: a host user cannot charge their processes to another tenant's pod.

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
_QOS = ("burstable", "besteffort")
# cgroupfs driver: kubepods[/<qos>]/pod<uid>/<id>
_CGROUPFS_POD_RE = re.compile(rf"\Apod({_UID})\Z")
# systemd driver: the pod slice, named after its parents ("kubepods-burstable-pod<uid_>.slice")
_SYSTEMD_POD_RE = re.compile(rf"\A(?:[a-z0-9]+-)?kubepods(?:-(?:burstable|besteffort))?-pod({_UID})\.slice\Z")
# the container component, right after the pod component
_CONTAINER_RE = re.compile(r"\A(?:(cri-containerd|crio|docker|containerd)[-:])?([0-9a-f]{64})(?:\.scope)?\Z")
# containerd's cgroup v1 systemd form packs pod and container into one component
_V1_SYSTEMD_RE = re.compile(
    rf"\A(?:[a-z0-9-]*-)?kubepods(?:-[a-z]+)?-pod({_UID})\.slice:(cri-containerd|crio|docker):([0-9a-f]{{64}})\Z")
_V1_SYSTEMD_PARENTS = ("system.slice", "containerd.service")
# the top of the kubelet's tree, from the cgroup root: kubepods (cgroupfs), kubepods.slice
# (systemd), kind/k3d nodes' kubelet.slice/kubelet-kubepods.slice
_SYSTEMD_ROOTS = (("kubepods.slice",), ("kubelet.slice", "kubelet-kubepods.slice"))


@dataclass(frozen=True, slots=True)
class ContainerRef:
    pod_uid: str       # with dashes, lower case
    container_id: str  # 64 hex digits
    runtime: str       # containerd, cri-o, docker or "" (cgroupfs paths do not say)


NOT_IN_POD = ContainerRef("", "", "")  # the cgroup file was read: a host process, no pod

_RUNTIME = {"cri-containerd": "containerd", "containerd": "containerd", "crio": "cri-o",
            "docker": "docker", None: ""}


def parse_cgroup_path(path: str) -> ContainerRef | None:
    """The pod and container of one cgroup path, or None when it is not a pod container.

    Only the layouts the kubelet creates are believed, anchored at the top of its tree: the path
    starts at ``kubepods`` (or a kind node's ``kubelet.slice``) and goes down slice by slice to
    the pod and then the container, which ends it.  A ``kubepods...pod<uid>`` component anywhere
    else (a user's own delegated subtree under ``user.slice``) is not a pod.  Leading ``..``
    components (a path outside the reader's cgroup namespace) may start anywhere in that tree,
    but never above it: the first named component must still be the kubelet's.
    """
    parts = [p for p in path.strip().split("/") if p]
    relative = bool(parts) and parts[0] == ".."
    while parts and parts[0] == "..":
        parts = parts[1:]
    if len(parts) < 1 or ".." in parts or "." in parts:
        return None
    if (m := _V1_SYSTEMD_RE.match(parts[-1])) is not None:
        parents = tuple(parts[:-1])
        ok = parents == _V1_SYSTEMD_PARENTS or (relative and _V1_SYSTEMD_PARENTS[-len(parents):] == parents)
        return ContainerRef(m.group(1).replace("_", "-"), m.group(3), _RUNTIME[m.group(2)]) if ok else None
    systemd = parts[0].endswith(".slice")
    # the container component: the first after the slices, or after the pod<uid> directory;
    # cgroups below it (a container's own sub-cgroups) stay the container's
    k = next((i + (not systemd) for i, p in enumerate(parts)
              if (not p.endswith(".slice") if systemd else _CGROUPFS_POD_RE.match(p))), len(parts))
    if k == 0 or k >= len(parts):
        return None
    cm = _CONTAINER_RE.match(parts[k])
    if cm is None:
        return None  # crio-conmon-<id>.scope, a pod-level process, a sandbox sub-cgroup
    uid = (_systemd_pod if systemd else _cgroupfs_pod)(parts[:k], relative)
    if uid is None:
        return None
    return ContainerRef(uid.replace("_", "-"), cm.group(2), _RUNTIME[cm.group(1)])


def _cgroupfs_pod(parents: list[str], relative: bool) -> str | None:
    """``kubepods[/<qos>]/pod<uid>`` (relative: any tail of it that ends at the pod)."""
    pm = _CGROUPFS_POD_RE.match(parents[-1])
    if pm is None:
        return None
    above = tuple(parents[:-1])
    for full in (("kubepods",), *(("kubepods", q) for q in _QOS)):
        if above == full or (relative and len(above) < len(full) and full[len(full) - len(above):] == above):
            return pm.group(1)
    return None


def _systemd_pod(parents: list[str], relative: bool) -> str | None:
    """A chain of slices, each named after its parent (``a.slice/a-b.slice/a-b-c.slice``), from
    a root the kubelet owns down to the pod slice (relative: starting inside that chain)."""
    pm = _SYSTEMD_POD_RE.match(parents[-1])
    if pm is None or not all(p.endswith(".slice") for p in parents):
        return None
    for parent, child in zip(parents, parents[1:], strict=False):
        if not child.startswith(parent[: -len(".slice")] + "-"):
            return None
    if relative:
        return pm.group(1) if "kubepods" in parents[0] else None
    for root in _SYSTEMD_ROOTS:
        if tuple(parents[:len(root)]) == root and len(parents) <= len(root) + 2:
            return pm.group(1)
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
