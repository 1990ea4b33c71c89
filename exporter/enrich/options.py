"""The ``enrich:`` section of the configuration file, as strict pydantic models.

Validated with the rest of the file (``config.Config``): an unknown section or key, a period out
of range or a value of the wrong type is a configuration error naming file, line and field.  The
models import nothing heavy, so a node without Kubernetes never loads the enricher's code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

# cloud metadata (cloud.py)
CLOUD_LABELS = ("cloud", "region", "zone", "instance_type", "instance_id")
PROVIDERS = ("aws", "azure", "gcp")

# pod attribution (kubernetes.py, pod_index.py)
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-*", "amd.com/gpu",
                     "gpu.intel.com/i915", "gpu.intel.com/xe")
DEFAULT_DRA_DRIVERS = ("gpu.nvidia.com", "*.nvidia.com", "gpu.amd.com", "*.amd.com", "gpu.intel.com",
                       "*.intel.com")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _known(kind: str, values: list[str], known: tuple[str, ...]) -> list[str]:
    bad = [v for v in values if v not in known]
    if bad:
        raise ValueError(f"unknown {kind}(s) {', '.join(bad)} (known: {', '.join(known)})")
    return values


class CloudOptions(_Strict):
    """``enrich.cloud``: cloud identity labels from the instance metadata services."""

    enabled: bool = Field(True, description=(
        "look up cloud labels (cloud, region, zone, instance_type, instance_id) from the instance metadata "
        "service of the provider the machine's DMI names"))
    providers: list[str] = Field(list(PROVIDERS), description=(
        "providers that may be asked (aws, azure, gcp); set explicitly, the DMI check is skipped"))
    timeout_seconds: float = Field(1.0, ge=0.01, le=86400, allow_inf_nan=False, description=(
        "timeout of one metadata request (bounded below: a loop every microsecond spins a core)"))
    refresh_seconds: float = Field(3600.0, ge=0.1, le=86400, allow_inf_nan=False, description=(
        "how often the metadata is asked again"))
    labels: list[str] = Field(list(CLOUD_LABELS), description="which of the five cloud labels to emit")
    endpoints: dict[str, str] = Field({}, description=(
        "base URL per provider (tests point these at fake servers)"))

    @field_validator("enabled", mode="before")
    @classmethod
    def _boolean(cls, value: Any) -> Any:
        if not isinstance(value, bool):  # "false" read as true would keep probing on
            raise ValueError(f"must be true or false (a YAML boolean), got {value!r}")
        return value

    @field_validator("providers")
    @classmethod
    def _providers(cls, value: list[str]) -> list[str]:
        return _known("provider", value, PROVIDERS)

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: list[str]) -> list[str]:
        return _known("label", value, CLOUD_LABELS)


class KubernetesOptions(_Strict):
    """``enrich.kubernetes``: pod attribution."""

    enabled: bool | None = Field(None, description=(
        "attribute GPUs to pods; unset: on where the kubelet's pod-resources socket exists"))
    socket: str = Field(DEFAULT_SOCKET, description="the kubelet's pod-resources socket")
    refresh_seconds: float = Field(30.0, ge=0.1, le=3600, allow_inf_nan=False, description=(
        "how often the pod-resources allocations are read again (bounded below: a loop every "
        "microsecond spins a core)"))
    timeout_seconds: float = Field(5.0, ge=0.01, le=120, allow_inf_nan=False, description=(
        "timeout of one pod-resources call"))
    resource_names: list[str] = Field(list(DEFAULT_RESOURCES), description=(
        "device plugin resource names (globs) that are GPUs"))
    dra_drivers: list[str] = Field(list(DEFAULT_DRA_DRIVERS), description=(
        "DRA driver names (globs) whose allocations are GPUs"))
    pod_labels: list[str] = Field(default_factory=list, max_length=32, description=(
        "pod labels copied onto attributed series as label_<name> (sanitised), exact keys"))
    workload_label: str = Field("app.kubernetes.io/name", description=(
        "the pod label whose value becomes the `workload` label; without it the owning controller"))
    api: Literal["auto", "on", "off"] = Field("auto", description=(
        "API server pod list (labels, workload, PID -> pod): auto = where in-cluster credentials exist"))
    api_server: str | None = Field(None, description=(
        "API server URL (default: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)"))
    token_file: str = Field("/var/run/secrets/kubernetes.io/serviceaccount/token", description=(
        "service account token for the API server (re-read: it rotates)"))
    ca_file: str = Field("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt", description=(
        "the cluster CA the API server's certificate is checked against"))
    node_name: str | None = Field(None, description=(
        "this node's name (default: $NODE_NAME, from the downward API)"))
    max_pods: int = Field(1000, ge=1, le=100000, description=(
        "pods read from the API server at most (a larger list is refused)"))
    pid_refresh_seconds: float = Field(2.0, ge=0.1, le=600, allow_inf_nan=False, description=(
        "how often new per-process PIDs are resolved to pods; the cache of PID -> pod is bounded"))
    pid_cache_size: int = Field(8192, ge=16, le=1_000_000, description=(
        "PIDs resolved to pods at most (the cache of PID -> pod is bounded)"))


class HpcJobsOptions(_Strict):
    """``enrich.hpc_jobs``: Slurm jobs from a prolog/epilog mapping directory (hpc_jobs.py)."""

    directory: str = Field(min_length=1, description=(
        "the job mapping directory written by the scheduler's prolog/epilog: a file per GPU (dcgm-"
        "exporter's or device-metrics-exporter's format)"))
    vendors: list[str] = Field([], description=(
        "which GPUs a file's index names; empty: every vendor's GPU of that index"))
    max_files: int = Field(256, ge=1, le=4096, description=(
        "GPU files read at most (8 GPUs x 7 MIG instances = 56 files)"))
    refresh_seconds: float = Field(1.0, ge=0.1, le=600, allow_inf_nan=False, description=(
        "how often the directory is read, on its own thread; renders serve the last read"))
    series_label: bool = Field(False, description=(
        "dcgm-exporter's per-series hpc_job label on every series of a GPU a job holds (docs/jobs.md: its "
        "cost)"))

    @field_validator("series_label", mode="before")
    @classmethod
    def _boolean(cls, value: Any) -> Any:
        if not isinstance(value, bool):
            raise ValueError(f"must be true or false (a YAML boolean), got {value!r}")
        return value

    @field_validator("vendors")
    @classmethod
    def _vendors(cls, value: list[str]) -> list[str]:
        return _known("vendor", value, ("nvidia", "amd", "intel"))


class EnrichConfig(_Strict):
    """``enrich:``; a section left out (or empty) has its defaults."""

    cloud: CloudOptions = CloudOptions()
    kubernetes: KubernetesOptions | None = Field(None, description="None: no section in the file")
    hpc_jobs: HpcJobsOptions | None = Field(None, description="None: no job mapping (docs/jobs.md)")

    @field_validator("cloud", mode="before")
    @classmethod
    def _empty_cloud(cls, value: Any) -> Any:
        return {} if value is None else value


M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], options: M | Mapping[str, Any] | None) -> M:
    """``options`` as ``model`` (an enricher built from a plain dict, as tests and tools do);
    a ValueError names each bad field."""
    if isinstance(options, model):
        return options
    try:
        return model.model_validate(dict(options or {}))
    except ValidationError as e:
        parts = []
        for err in e.errors():
            loc = ".".join(str(x) for x in err["loc"])
            msg = "unknown option" if err["type"] == "extra_forbidden" else err["msg"]
            parts.append(f"{loc}: {msg}")
        raise ValueError("; ".join(parts)) from None
