"""The contract between a source and the rest of the daemon.

A source only reads hardware (or a file tree, or a library) and returns raw readings in the
vendor's own field names and units.  It knows nothing about canonical names: the mapping file
named by each device (``Device.mapping``) turns raw readings into canonical series.

Sources are synchronous; the daemon runs each one in its own worker thread with a timeout, so a
source may block (NVML, amdsmi, slow sysfs files) without stalling anything else.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, runtime_checkable


class SourceUnavailable(Exception):
    """Raised by ``Source.open`` when the backend is absent (library missing, no devices).

    The message is shown once in the log and in ``unified_gpu_exporter_source_info``; it is not an
    error of the exporter.
    """


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
class Sample:
    """What one ``poll`` returns."""

    devices: list[Device] = field(default_factory=list)
    readings: list[Reading] = field(default_factory=list)
    # device key -> False when the device was found before but cannot be read now (lost GPU)
    device_up: dict[str, bool] = field(default_factory=dict)
    # error kind -> count during this poll (malformed value, not_supported, read_error, ...)
    errors: Counter[str] = field(default_factory=Counter)
    # monotonic time at which the readings were taken (set by the daemon when left at 0)
    monotonic: float = 0.0

    def add(self, device: str, field_name: str, value: float | int | None,
            labels: tuple[tuple[str, str], ...] = ()) -> None:
        """Append a reading; a value that is not a finite number is counted, not stored."""
        if value is None:
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


@runtime_checkable
class Source(Protocol):
    """One backend.  ``name`` is the collector name used by ``--collector.<name>``."""

    name: ClassVar[str]

    def open(self) -> None:
        """Initialise the backend; raise ``SourceUnavailable`` with a reason when it is absent."""

    def poll(self) -> Sample:
        """Read every device once.  Must not raise for a single bad device or value."""

    def close(self) -> None:
        """Release the backend.  Called on shutdown and before a reload re-opens it."""
