"""The exporter's shared vocabulary, at the bottom of the import graph.

Everything here is plain data: what a source reports (``Device``, ``Reading``, ``PollResult``),
how a GPU is named across the pipeline (``DeviceId``), and how its canonical series travel from
the mapper to the renderer: ``Frames``, per GPU the series by ``SeriesId`` (name and the labels
beyond the GPU's identity).  Only the renderer turns a ``DeviceId`` into ``vendor``/``gpu``/
``uuid`` labels (``Sample`` is what it renders).  This module imports nothing from the exporter.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import NamedTuple

Labels = tuple[tuple[str, str], ...]
DeviceId = tuple[str, str, str]  # (vendor, gpu, uuid): the one id of a GPU past its source
Extra = Labels  # a series' labels beyond the GPU's identity, sorted by name (() for none)
SeriesId = tuple[str, Extra]  # (series name, extra labels): a series within one GPU's frame
Frame = dict[SeriesId, float]  # one GPU's series
Frames = dict[DeviceId, Frame]  # per GPU: what the mapper returns, the store keeps, the engine reads

# Every canonical per-GPU series starts with these three labels, in this order.
IDENTITY_LABELS = ("vendor", "gpu", "uuid")
IDENTITY_WIDTH = len(IDENTITY_LABELS)
_EXACT = 1 << 1000  # an int within this converts to a finite float


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


def identity_labels(device_id: DeviceId) -> Labels:
    """The leading labels of every rendered series of a GPU: vendor, gpu, uuid."""
    return (("vendor", device_id[0]), ("gpu", device_id[1]), ("uuid", device_id[2]))


class Sample(NamedTuple):
    """One rendered series: its name, all its labels (identity first) and its value."""

    name: str
    labels: Labels
    value: float


def frame_count(frames: Frames) -> int:
    """How many series ``frames`` holds."""
    return sum(map(len, frames.values()))


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


@dataclass
class SourceStats:
    """What a running source has done: its health and its counters.  Owned by the source's runner
    (``exporter/run/runner.py``), read by the renderer, carried whole across a reload
    (``carry_from``: every field, whatever is added later).  The self-metrics these become are
    declared in ``exporter/render/self_metrics.py``."""

    # starting | up | down | absent.  absent: on by default but the backend is not on this node
    # (not asked for, never up): reported with its reason, never as source_up 0.  down: enabled
    # and failing (asked for explicitly, or up before).
    state: str = "starting"
    was_up: bool = False        # has been up since the exporter started
    reason: str = ""
    up: bool = False
    polls: int = 0
    last_duration: float = 0.0
    last_success: float = 0.0   # unix time of the last successful poll
    # per declared per-source counter (name after unified_gpu_exporter_): label value ("" for a
    # counter without a label beyond source) -> count
    counts: dict[str, Counter[str]] = field(default_factory=dict)

    def counter(self, name: str) -> Counter[str]:
        """The counts of the per-source counter ``name`` (declared in render/self_metrics.py)."""
        c = self.counts.get(name)
        if c is None:
            c = self.counts[name] = Counter()
        return c

    @property
    def errors(self) -> Counter[str]:
        """``source_errors_total`` by kind."""
        return self.counter("source_errors_total")

    def carry_from(self, prev: SourceStats) -> None:
        """Take over ``prev``'s values (the same source before a reload): copies, never shared."""
        for f in fields(self):
            setattr(self, f.name, copy.deepcopy(getattr(prev, f.name)))

    def snapshot(self) -> SourceStats:
        """A copy the render thread can read while the source keeps counting."""
        snap = copy.copy(self)
        snap.counts = {name: Counter(c) for name, c in list(self.counts.items())}
        return snap
