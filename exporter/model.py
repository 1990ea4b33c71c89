"""The exporter's shared vocabulary, at the bottom of the import graph.

Everything here is plain data: what a source reports (``Device``, ``Reading``, ``PollResult``),
how a canonical series is keyed (``Labels``, ``SeriesKey``), and how a GPU is named across the
pipeline (``DeviceId``).  Sources produce these types; mapping, store, indicators, enrichers and
exposition consume them.  This module imports nothing from the exporter.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

Labels = tuple[tuple[str, str], ...]
SeriesKey = tuple[str, Labels]  # (series name, ((label, value), ...)), identity labels first
DeviceId = tuple[str, str, str]  # (vendor, gpu, uuid)

# Every canonical per-GPU series starts with these three labels, in this order.
IDENTITY_LABELS = ("vendor", "gpu", "uuid")
IDENTITY_WIDTH = len(IDENTITY_LABELS)
_EXACT = 1 << 1000  # an int within this converts to a finite float
# canonical metrics a fast poll may refresh between full polls: the contention indicators' inputs
# (a source's poll_fast returns what feeds them; the runner keeps only these from it)
FAST_METRICS = frozenset({
    "gpu_compute_utilization_percent", "gpu_compute_occupancy_percent", "gpu_sm_active_percent",
    "gpu_tensor_utilization_percent", "gpu_memory_bandwidth_utilization_percent",
    "gpu_l2_cache_miss_rate_percent",
    # whether the profiling values above are values (exporter/profiling_guard.py): refreshed with them
    "gpu_profiling_available",
})


@dataclass(frozen=True, slots=True)
class Device:
    """Identity of one GPU (or one MIG/partition instance's parent GPU) as a source sees it.

    ``key`` is unique within the source and stable across polls (PCI bus id or UUID).
    ``index`` becomes the canonical ``gpu`` label: the vendor's stable index on the node
    (NVML index, DRM card minor number).  ``mapping`` names the file in ``mappings/`` whose
    rules translate this device's raw readings.
    """

    key: str
    vendor: str
    index: str
    mapping: str
    uuid: str = ""
    model: str = ""
    pci_bus_id: str = ""
    driver: str = ""
    serial: str = ""
    simulated: bool = False
    # (gpu_instance, MIG UUID) of each MIG instance: pod attribution matches MIG devices by these
    partitions: tuple[tuple[str, str], ...] = ()

    @property
    def id(self) -> DeviceId:
        return (self.vendor, self.index, self.uuid)


def identity_labels(dev: Device) -> Labels:
    """The leading labels of every series of ``dev``: vendor, gpu, uuid."""
    return (("vendor", dev.vendor), ("gpu", dev.index), ("uuid", dev.uuid))


def device_id_of(labels: Labels) -> DeviceId:
    """The ``DeviceId`` named by a canonical label tuple (its first three labels)."""
    return (labels[0][1], labels[1][1], labels[2][1])


@dataclass(slots=True)
class Reading:
    """One raw value: ``(device key, vendor field name, value)`` plus optional raw labels.

    ``labels`` carries per-reading dimensions such as a link number, a process id or a MIG
    instance id, as ``(name, value)`` pairs; the mapping renames them to canonical label names.
    """

    device: str
    field: str
    value: float
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(slots=True)
class PollResult:
    """What one ``Source.poll`` returns: the devices seen, their raw readings, and what failed."""

    devices: list[Device] = field(default_factory=list)
    readings: list[Reading] = field(default_factory=list)
    # device key -> False when the device was found before but cannot be read now (lost GPU)
    device_up: dict[str, bool] = field(default_factory=dict)
    # error kind -> count during this poll (malformed value, not_supported, read_error, ...)
    errors: Counter[str] = field(default_factory=Counter)
    # monotonic time at which the readings were taken (set by the daemon when left at 0)
    monotonic: float = 0.0
    # self-metric samples about the source itself, (name after unified_gpu_exporter_, labels,
    # value): exported only for names the exposition declares (SOURCE_SELF_METRICS), e.g. the
    # upstream source's upstream_schema_info
    self_samples: list[tuple[str, tuple[tuple[str, str], ...], float]] = field(default_factory=list)

    def add(self, device: str, field_name: str, value: float | int | None,
            labels: tuple[tuple[str, str], ...] = ()) -> None:
        """Append a reading; a value that is not a finite number is counted, not stored."""
        if value is None:
            return
        if type(value) is int and -_EXACT <= value <= _EXACT:  # most sysfs readings: finite as is
            self.readings.append(Reading(device, field_name, float(value), labels))
            return
        try:
            v = float(value)
        except (TypeError, ValueError):
            self.errors["malformed_value"] += 1
            return
        if not math.isfinite(v):
            self.errors["malformed_value"] += 1
            return
        self.readings.append(Reading(device, field_name, v, labels))
