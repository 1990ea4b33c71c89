"""GPU identity of a series scraped from a vendor exporter (pure functions, no I/O).

Each supported exporter labels its per-GPU series differently.  ``series_identity`` reads one
series' labels and returns who the series belongs to (``SeriesIdentity``) plus the labels that
are left over as per-reading dimensions.  Identity values are normalized so that a GPU read
through an upstream exporter and natively compare equal:

- PCI bus ids become ``dddd:bb:dd.f`` lowercase (dcgm-exporter prints ``00000000:31:00.0``);
- NVIDIA UUIDs become ``GPU-<lowercase hex>`` (nvidia_gpu_exporter strips the ``GPU-`` prefix
  and lowercases, NVML prints ``GPU-...``); all-zero UUIDs (VM guests, masked captures) are
  treated as absent because they do not identify anything.

``ExporterSpec.selector_labels`` are the labels whose value says *what* a series measures rather
than *which* GPU or sub-unit it belongs to (``clock_type="system"``, ``location="gpu"``).  They
are folded into the raw field name (``gpu_clock{clock_type="system"}``) so that the mapping YAML,
which matches raw fields by exact name, can route each of them to its own canonical series.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace

_PCI_RE = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})"
    r"\.(?P<fn>[0-7])$"
)
_ZERO_UUID_RE = re.compile(r"^[0-]+$")
_CARD_RE = re.compile(r"^card(\d+)$")
_XPUMD_GPU_NAME_RE = re.compile(r"^gpu-(\d+)$")


def normalize_pci_bus_id(value: str) -> str:
    """``00000000:31:00.0`` / ``31:00.0`` / ``0000:1A:00.0`` -> ``0000:31:00.0`` (lowercase).

    Returns "" for anything that is not a PCI address.
    """
    m = _PCI_RE.match(value.strip())
    if m is None:
        return ""
    domain = int(m["domain"] or "0", 16)
    return f"{domain:04x}:{int(m['bus'], 16):02x}:{int(m['dev'], 16):02x}.{m['fn']}"


def _usable(value: str) -> str:
    v = value.strip()
    if not v or v.lower() in ("n/a", "[n/a]", "na", "unknown"):
        return ""
    return v


def normalize_uuid(value: str, *, nvidia: bool = False) -> str:
    """Normalize a GPU UUID; "" when absent or all zeros (a placeholder, not an identity)."""
    v = _usable(value)
    if not v:
        return ""
    prefix, sep, rest = v.partition("-")
    has_prefix = bool(sep) and prefix.upper() in ("GPU", "MIG")
    body = rest if has_prefix else v
    if _ZERO_UUID_RE.match(body):
        return ""
    if nvidia:
        return f"{prefix.upper() if has_prefix else 'GPU'}-{body.lower()}"
    return v.lower()


@dataclass(frozen=True, slots=True)
class SeriesIdentity:
    """Who one series belongs to.  ``ref`` joins the series of one GPU within one scrape."""

    ref: str
    index: str = ""
    uuid: str = ""
    pci_bus_id: str = ""
    model: str = ""
    driver: str = ""
    serial: str = ""
    host: str = ""

    def merged(self, other: SeriesIdentity) -> SeriesIdentity:
        """Fill this identity's empty fields from ``other`` (first value seen wins)."""
        updates = {
            f.name: getattr(other, f.name)
            for f in fields(self)
            if not getattr(self, f.name) and getattr(other, f.name)
        }
        return replace(self, **updates) if updates else self


IdentityFn = Callable[[Mapping[str, str]], "SeriesIdentity | None"]


@dataclass(frozen=True, slots=True)
class ExporterSpec:
    """How to read one vendor exporter's exposition."""

    name: str
    vendor: str
    identify: IdentityFn
    # labels consumed as identity (never passed on as reading labels)
    identity_labels: frozenset[str]
    # labels folded into the raw field name (see module docstring)
    selector_labels: frozenset[str] = field(default_factory=frozenset)

    @property
    def mapping(self) -> str:
        return f"upstream/{self.name}"


def _host(labels: Mapping[str, str]) -> str:
    # dcgm-exporter releases print `Hostname`, main renamed it to `hostname` (PR #655)
    return labels.get("hostname") or labels.get("Hostname") or ""


def _ref(host: str, *parts: str) -> str:
    return "|".join((host, *parts))


def identify_dcgm(labels: Mapping[str, str]) -> SeriesIdentity | None:
    """dcgm-exporter: ``gpu, UUID, pci_bus_id, device, modelName, [GPU_I_*], Hostname|hostname``.

    ``--use-old-namespace`` prints ``uuid``; NVLink entities print ``gpu_uuid``/``model_name``.
    """
    index = labels.get("gpu", "")
    raw_uuid = labels.get("UUID") or labels.get("uuid") or labels.get("gpu_uuid") or ""
    if not index and not raw_uuid:
        return None  # NvSwitch / CPU entities, exporter self-metrics
    uuid = normalize_uuid(raw_uuid, nvidia=True)
    host = _host(labels)
    return SeriesIdentity(
        ref=_ref(host, uuid or f"gpu{index}"),
        index=index,
        uuid=uuid,
        pci_bus_id=normalize_pci_bus_id(labels.get("pci_bus_id", "")),
        model=labels.get("modelName") or labels.get("model_name") or "",
        driver=labels.get("DCGM_FI_DRIVER_VERSION") or labels.get("DCGM_FI_SYSTEM_DRIVER_VERSION") or "",
        serial=_usable(labels.get("DCGM_FI_DEV_SERIAL") or labels.get("DCGM_FI_DEV_BOARD_SERIAL", "")),
        host=host,
    )


def identify_amd_dme(labels: Mapping[str, str]) -> SeriesIdentity | None:
    """ROCm device-metrics-exporter: ``gpu_id, gpu_uuid, serial_number, card_series, card_model,
    driver_version, hostname`` (v1.0 era: upper-case ``GPU_UUID, SERIAL_NUMBER``, no gpu_id)."""
    index = labels.get("gpu_id", "")
    uuid = normalize_uuid(labels.get("gpu_uuid") or labels.get("GPU_UUID") or "")
    serial = _usable(labels.get("serial_number") or labels.get("SERIAL_NUMBER") or "")
    if not index and not uuid and not serial:
        return None  # node-level series (gpu_nodes_total) and per-process series without a GPU
    host = _host(labels)
    return SeriesIdentity(
        ref=_ref(host, f"gpu{index}" if index else (uuid or f"serial{serial}")),
        index=index,
        uuid=uuid,
        pci_bus_id=normalize_pci_bus_id(labels.get("pcie_bus_id") or labels.get("pci_bus_id") or ""),
        # card_series is the product name ("AMD Instinct MI300X OAM"), card_model a part number
        model=_usable(labels.get("card_series", "")) or _usable(labels.get("card_model", "")),
        driver=labels.get("driver_version", ""),
        serial=serial,
        host=host,
    )


def identify_xpumanager(labels: Mapping[str, str]) -> SeriesIdentity | None:
    """XPU Manager 1.x (``uuid, dev_name, pci_bdf, dev_file``) and 2.x xpumd
    (``hw_id, hw_name, pci_bdf``; model/serial only on ``hw_gpu_info``).

    Card-level 1.x series (label ``card``, no device labels) carry no identity and are skipped.
    """
    pci = normalize_pci_bus_id(labels.get("pci_bdf", ""))
    uuid = normalize_uuid(labels.get("uuid") or labels.get("hw_id") or "")
    if not pci and not uuid:
        return None
    index = ""
    card = _CARD_RE.match(labels.get("dev_file", ""))
    if card:  # the DRM card minor, as the native Intel sources use
        index = card[1]
    else:
        gpu_name = _XPUMD_GPU_NAME_RE.match(labels.get("hw_name", ""))
        if gpu_name:  # xpumd names devices gpu-1, gpu-2 ... in Level Zero order
            index = str(int(gpu_name[1]) - 1)
    host = labels.get("node", "")
    return SeriesIdentity(
        ref=_ref(host, pci or uuid),
        index=index,
        uuid=uuid,
        pci_bus_id=pci,
        model=_usable(labels.get("dev_name") or labels.get("hw_model") or ""),
        serial=_usable(labels.get("hw_serial_number", "")),
        host=host,
    )


def identify_nvidia_gpu_exporter(labels: Mapping[str, str]) -> SeriesIdentity | None:
    """utkuozdemir/nvidia_gpu_exporter: every series has ``uuid`` (lowercase, ``GPU-`` stripped);
    index, PCI bus id, name, driver and serial are only on ``nvidia_smi_gpu_info``."""
    raw_uuid = labels.get("uuid", "")
    if not raw_uuid:
        return None
    uuid = normalize_uuid(raw_uuid, nvidia=True)
    return SeriesIdentity(
        ref=_ref("", raw_uuid.lower()),
        index=labels.get("index", ""),
        uuid=uuid,
        pci_bus_id=normalize_pci_bus_id(labels.get("pci_bus_id", "")),
        model=labels.get("name", ""),
        driver=labels.get("driver_version", ""),
        serial=_usable(labels.get("serial", "")),
    )


EXPORTERS: dict[str, ExporterSpec] = {
    spec.name: spec
    for spec in (
        ExporterSpec(
            name="dcgm-exporter",
            vendor="nvidia",
            identify=identify_dcgm,
            identity_labels=frozenset({
                "gpu", "UUID", "uuid", "gpu_uuid", "pci_bus_id", "device", "modelName",
                "model_name", "Hostname", "hostname", "DCGM_FI_DRIVER_VERSION",
                "DCGM_FI_SYSTEM_DRIVER_VERSION", "DCGM_FI_DEV_SERIAL", "DCGM_FI_DEV_BOARD_SERIAL",
            }),
        ),
        ExporterSpec(
            name="amd-device-metrics-exporter",
            vendor="amd",
            identify=identify_amd_dme,
            identity_labels=frozenset({
                "gpu_id", "gpu_uuid", "GPU_UUID", "serial_number", "SERIAL_NUMBER", "card_series",
                "card_model", "card_vendor", "driver_version", "vbios_version", "hostname",
                "pcie_bus_id", "pci_bus_id",
            }),
            selector_labels=frozenset({"clock_type"}),
        ),
        ExporterSpec(
            name="xpumanager",
            vendor="intel",
            identify=identify_xpumanager,
            identity_labels=frozenset({
                "uuid", "dev_name", "pci_dev", "vendor", "pci_bdf", "dev_file", "node", "hw_id",
                "hw_model", "hw_serial_number", "hw_vendor",
            }),
            selector_labels=frozenset({
                # 1.x
                "location", "type", "sub_dev",
                # 2.x (OpenTelemetry attributes, dots escaped to underscores)
                "hw_gpu_task", "hw_frequency_domain", "aggregation", "hw_limit_type",
                "hw_sensor_location", "statistic", "hw_memory_location", "network_io_direction",
                "com_intel_subdevice_id", "sample_status", "error_type", "error_category",
                "hw_type", "hw_state", "com_intel_speed_throttle_reason",
            }),
        ),
        ExporterSpec(
            name="nvidia_gpu_exporter",
            vendor="nvidia",
            identify=identify_nvidia_gpu_exporter,
            identity_labels=frozenset({
                "uuid", "name", "index", "pci_bus_id", "driver_version", "serial", "vbios_version",
                "compute_cap", "cuda_version", "driver_model_current", "driver_model_pending",
                "pci_sub_device_id",
            }),
        ),
    )
}


def field_name(metric: str, labels: Mapping[str, str], selectors: frozenset[str]) -> str:
    """The raw field of a series: the metric name, qualified by its selector labels (sorted)."""
    picked = sorted((k, v) for k, v in labels.items() if k in selectors)
    if not picked:
        return metric
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in picked)
    return f"{metric}{{{inner}}}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def dimension_labels(labels: Mapping[str, str], spec: ExporterSpec) -> tuple[tuple[str, str], ...]:
    """Labels left after identity and selectors: per-reading dimensions (link, pid, MIG ids)."""
    return tuple(
        sorted(
            (k, v)
            for k, v in labels.items()
            if k not in spec.identity_labels and k not in spec.selector_labels
        )
    )
