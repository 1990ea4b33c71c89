"""The ``options`` of every collector, as strict pydantic models.

``collectors.<name>.options`` in the configuration file is validated against the model of that
collector: an unknown key (``procesess: true``) or a value of the wrong type is a configuration
error naming file, line and field, found by ``--check-config``, at start and on reload, never a
source that quietly runs with its defaults or goes down at runtime.  A source receives its model
(``SourceContext.typed``) and reads attributes: the defaults written here are the only ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from ..durations import MIN_DURATION, parse_duration


def _positive_duration(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds < MIN_DURATION:  # every period bounded below: a thread waking every 1 us spins a core
        raise ValueError(f"must be at least {MIN_DURATION * 1000:g}ms")
    return seconds


def _process_mode(value: Any) -> Any:
    # YAML's true/false (and off/no) of older configs: series / off
    if value is True:
        return "series"
    if value is False:
        return "off"
    return value


# co-tenancy evidence (sources/evidence.py): off | count (default: counted, not exported) | series
ProcessMode = Annotated[Literal["off", "count", "series"], BeforeValidator(_process_mode)]

# seconds, given as a number or a duration string (1.5s, 1m30s, 250ms)
Duration = Annotated[float, BeforeValidator(_positive_duration)]
DurationOrZero = Annotated[float, BeforeValidator(parse_duration)]


class Options(BaseModel):
    """Base of every options model: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")

    def options_dict(self) -> dict[str, Any]:
        """The keys that were set, as plain data for the source."""
        return self.model_dump(exclude_unset=True, mode="python")


class NoOptions(Options):
    """Collectors without options (intel, levelzero)."""


class NvmlOptions(Options):
    processes: ProcessMode = Field("count", description=(
        "co-tenancy evidence: count (clients counted, no per-process series), series (per-process series "
        "too, +2 per process), off"))
    mps_client_cpu_percent: float = Field(2.0, ge=0, le=100, description=(
        "CUDA MPS: a client listed by NVML counts as active while its CPU time since the previous poll "
        "is at least this share of one core (an H200's paused client ran 0.1 %, a busy copy loop 100 %)"))
    processes_top_n: int = Field(10, ge=1, description=(
        "per-process series per GPU at most (the busiest), with processes: series"))
    xid: bool = Field(True, description="watch XID events (gpu_xid_errors_total)")
    xid_timeout_ms: int = Field(500, ge=1, le=60_000, description="how long one poll waits for XID events")
    gpm: bool = Field(True, description="read GPM metrics (Hopper and newer; two samples per value)")
    gpm_metrics: list[str] | None = Field(None, description=(
        "GPM metrics read, as NVML_GPM_METRIC_* suffixes (e.g. DRAM_BW_UTIL; default: utilization, "
        "occupancy, DRAM bandwidth, PCIe and NVLink rates: DEFAULT_GPM_METRICS in sources/nvml_gpm.py)"))
    gpm_min_window_s: Duration = Field(0.1, description=(
        "a GPM window shorter than this is not reported (the next poll gets a longer one)"))
    gpm_reseed_factor: float = Field(5.0, gt=1, description=(
        "a gap longer than this x the expected interval reseeds GPM instead of reporting a stale average"))
    gpm_max_window_s: Duration = Field(600.0, description="a gap longer than this always reseeds GPM")
    interval: Duration | None = Field(None, description=(
        "the poll interval the GPM reseed rule expects (default: the gaps measured)"))
    nvlink_per_link: bool = Field(False, description="per-link NVLink series besides the per-GPU totals")
    mig: bool = Field(True, description="read MIG instances")
    mig_rescan_polls: int = Field(30, ge=1, description=(
        "MIG devices are scanned again every this many polls (and after a MIG read fails)"))

    @field_validator("gpm_metrics")
    @classmethod
    def _gpm_names(cls, value: list[str] | None) -> list[str] | None:
        import re

        for name in value or []:
            if not re.fullmatch(r"[A-Za-z0-9_]+", name):
                raise ValueError(f"{name!r} is not an NVML_GPM_METRIC_* suffix (e.g. DRAM_BW_UTIL)")
        return value


class DcgmOptions(Options):
    field_ids: list[int] | None = Field(None, description=(
        "DCGM field ids to watch (default: GPU utilization and the profiling fields 1001-1012)"))
    hostname: str = Field("localhost", description="host engine to connect to")
    update_interval_s: Duration = Field(1.0, description="DCGM's update frequency for the watched fields")
    max_keep_age_s: Duration = Field(60.0, description="how long DCGM keeps samples of the watched fields")


class AmdgpuOptions(Options):
    pcie_bw: bool = Field(True, description=(
        "read pcie_bw (each read sleeps about 1 s in the kernel: one thread per card)"))
    pcie_bw_interval: Duration = Field(1.0, description="how often pcie_bw is read")
    gpu_metrics: bool = Field(True, description="read the binary gpu_metrics table")
    keep_open: Literal["auto", "always", "never"] = Field("auto", description=(
        "attribute files kept open and re-read with pread: auto = when the tree is a sysfs mount (a fake "
        "tree whose files are replaced by rename needs a fresh open per read)"))


class AmdsmiOptions(Options):
    ecc_blocks: list[str] | None = Field(None, description=(
        "ECC blocks read per GPU, AmdSmiGpuBlock names (default: UMC, SDMA, GFX, MMHUB, PCIE_BIF, HDP, "
        "XGMI_WAFL)"))
    processes: ProcessMode = Field("count", description=(
        "co-tenancy evidence: count, series or off (as nvml's processes)"))
    process_top_n: int = Field(10, ge=1, description=(
        "per-process series per GPU at most, with processes: series"))


class FdinfoOptions(Options):
    processes: ProcessMode = Field("count", description=(
        "co-tenancy evidence from /proc/<pid>/fdinfo: count, series or off (as nvml's processes)"))
    top_n: int = Field(5, description=(
        "per-process series per GPU at most, with processes: series; < 0: every process, no \"other\""))
    scan_max_fds: int = Field(default=20000, ge=100, description=(
        "fds examined (readlink) per poll at most: the /proc scan's per-poll budget (fdinfo_scan.py; beyond"
        " it the count is partial)"))
    scan_max_seconds: Duration = Field(0.05, description="wall time of one poll's fd-table work")
    scan_check_period: Duration = Field(15.0, description=(
        "every fd table is listed again after this long (new fd numbers); a new tenant is counted within "
        "scan_verify_period + 2 polls (docs/detection.md)"))
    scan_verify_period: Duration = Field(50.0, description=(
        "every fd readlinked again after this long (reused fd numbers)"))


class TriggerOptions(Options):
    enabled: bool = Field(False, description="capture a profile when the metric stays above the bar")
    metric: str = Field("gpu_memory_contention", description="the canonical series watched")
    above: float = Field(0.5, description="the bar the metric must stay above")
    for_seconds: DurationOrZero = Field(30.0, description="how long it must stay above before a capture")
    command: list[str] = Field([], description=(
        "the capture command as argv, no shell; {output} and {device} are replaced"))
    timeout: Duration = Field(300.0, description="the whole process group is killed after this")
    min_interval: DurationOrZero = Field(900.0, description="time between two captures (any GPU)")
    staging_dir: Path | None = Field(None, description=(
        "each capture runs in a fresh 0700 folder here (default: the system temp dir)"))

    @field_validator("command", mode="before")
    @classmethod
    def _argv(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError("must be a list (argv), not a shell string")
        return value

    @model_validator(mode="after")
    def _needs_command(self) -> TriggerOptions:
        if self.enabled and not self.command:
            raise ValueError("enabled needs a command")
        return self


class ProfilesOptions(Options):
    dir: Path | None = Field(None, description=(
        "the drop folder profiler artifacts are imported from; without it the source is off"))
    top_kernels: int = Field(10, ge=1, description=(
        "kernels per GPU that keep their name; the rest are kernel=\"other\""))
    max_profiles: int = Field(16, ge=1, description="imported artifacts kept exported (oldest dropped first)")
    settle: DurationOrZero = Field(1.0, description=(
        "a file must stay unchanged this long before it is imported"))
    ttl: DurationOrZero = Field(600.0, description=(
        "imported values stop feeding series and alerts this long after their import (0: never)"))
    scan_interval: Duration = Field(2.0, description="how often the drop folder is scanned")
    max_file_bytes: int = Field(512 * 1024 * 1024, ge=1, description=(
        "largest artifact file, also after decompression"))
    max_devices_per_import: int = Field(16, ge=1, description="GPUs one artifact may name")
    max_series_per_import: int = Field(20000, ge=1, description="series one artifact may give")
    max_series_total: int | None = Field(None, ge=1, strict=True, description=(
        "all kept imports together: the oldest are evicted to make room (at least one import's worth; "
        "default: 50000, or max_series_per_import where that is larger)"))
    max_events_per_import: int = Field(1_000_000, ge=1, strict=True, description=(
        "trace events or table rows one artifact may have (parsing runs in a child process under these "
        "kernel limits)"))
    import_memory_bytes: int = Field(768 << 20, ge=64 << 20, strict=True, description=(
        "RLIMIT_AS of the child"))
    import_cpu_seconds: int = Field(60, ge=1, le=86400, strict=True, description="RLIMIT_CPU of the child")
    import_timeout: Duration = Field(120.0, description="wall clock, then the child is killed")
    restore: bool = Field(True, description="re-read imported/ at start so the series survive a restart")
    trigger: TriggerOptions | None = Field(None, description=(
        "capture a profile when a metric stays high (None: no trigger)"))

    @model_validator(mode="after")
    def _total_holds_one_import(self) -> ProfilesOptions:
        if self.max_series_total is None:
            self.max_series_total = max(50000, self.max_series_per_import)
        elif self.max_series_total < self.max_series_per_import:
            raise ValueError(f"max_series_total ({self.max_series_total}) must be at least "
                             f"max_series_per_import ({self.max_series_per_import})")
        return self


class UpstreamTls(Options):
    ca_file: Path | None = Field(None, description=(
        "CA bundle the target's certificate is checked against (default: the system's)"))
    cert_file: Path | None = Field(None, description="client certificate (mutual TLS), with key_file")
    key_file: Path | None = Field(None, description="the client certificate's key")
    insecure_skip_verify: bool = Field(False, description="do not check the target's certificate")


class UpstreamBasicAuth(Options):
    username: str = Field(description="basic auth user name")
    password: str = Field("", description="the password (prefer password_file)")
    password_file: Path | None = Field(None, description="a file holding the password")


class UpstreamTarget(Options):
    """One vendor exporter the upstream source scrapes (the defaults here are the only ones)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    url: str = Field(description="the exporter's /metrics URL (http:// or https://, no credentials in it)")
    exporter: str = Field(description=(
        "which exporter serves it (dcgm-exporter, amd-device-metrics-exporter, xpumanager, ...): picks "
        "mappings/upstream/<exporter>.yaml"))
    name: str | None = Field(None, description=(
        "the target's name in labels and logs (default: \"<exporter>-<position>\")"))
    timeout: Duration = Field(5.0, le=3600, description="seconds for the whole request (connect + body)")
    metric_prefix: str = Field("", description=(
        "stripped from the target's metric names before mapping (DME's MetricsFieldPrefix, e.g. \"amd_\")"))
    tls: UpstreamTls | None = Field(None, description="TLS settings for an https:// URL")
    basic_auth: UpstreamBasicAuth | None = Field(None, description="basic auth credentials")
    max_series: int = Field(20_000, ge=1, le=1_000_000, strict=True, description=(
        "series per poll at most; above this or max_label_values the target fails that poll "
        "(limit_exceeded), as a Prometheus scrape past sample_limit fails as a whole"))
    max_label_values: int = Field(1_000, ge=1, le=100_000, strict=True, description=(
        "distinct values of one label name per poll at most (as max_series)"))
    schema_pin: str | None = Field(None, alias="schema", pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$", description=(
        "the naming generation the target serves, for an operator who knows it (one of the `schemas` of "
        "mappings/upstream/<exporter>.yaml, checked at load); default: recognised per scrape. (\"schema\" "
        "is a BaseModel attribute, hence the alias.)"))

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        from urllib.parse import urlsplit

        try:
            parsed = urlsplit(value)
            ok = parsed.scheme in ("http", "https") and bool(parsed.hostname)
        except ValueError:  # a malformed port or IPv6 literal
            ok = False
        from ..http_deadline import redact_url
        if not ok:
            raise ValueError(f"must be an http:// or https:// URL with a host, got {redact_url(value)!r}")
        if "@" in parsed.netloc:  # urllib would take "user:password@host" for a host name
            raise ValueError(f"credentials in the URL ({redact_url(value)!r}) are refused: give them as "
                             "basic_auth (username, password_file)")
        return value

    @field_validator("exporter")
    @classmethod
    def _exporter(cls, value: str) -> str:
        from .upstream_identity import EXPORTERS

        if value not in EXPORTERS:
            raise ValueError(f"unknown exporter {value!r} (known: {', '.join(sorted(EXPORTERS))})")
        return value


class UpstreamOptions(Options):
    targets: list[UpstreamTarget] = Field([], description=(
        "the vendor exporters to scrape; the source is on once there is one"))

    def target_names(self) -> list[str]:
        """Each target's name (its own, else ``<exporter>-<position>``)."""
        return [t.name or f"{t.exporter}-{i}" for i, t in enumerate(self.targets)]

    @model_validator(mode="after")
    def _unique_names(self) -> UpstreamOptions:
        seen: set[str] = set()
        for i, name in enumerate(self.target_names()):
            if name in seen:
                raise ValueError(f"targets[{i}].name {name!r} is used twice")
            seen.add(name)
        if not self.targets:  # the default: nothing to check, and the source's code stays unloaded
            return self
        # what only the source's own parser checks (TLS files readable, password file)
        from .upstream_fetch import parse_targets

        try:
            parse_targets(self)
        except (ValueError, OSError) as exc:  # ssl.SSLError is an OSError
            raise ValueError(str(exc)) from None
        return self


class SimulatorOptions(Options):
    scenario: str = Field("demo", description=(
        "built-in scenario name (mappings/scenarios/) or a scenario YAML file"))
    phase: str | None = Field(None, description="hold this phase of the scenario until the process stops")
    host: str | None = Field(None, min_length=1, max_length=253, description=(
        "seeds the simulated GPUs' UUIDs and serials (default: the host name), so that two simulated nodes "
        "never report the same GPU"))
    speed: float = Field(1.0, gt=0, le=1000, description=(
        "the phases run this many times faster than their durations say (a time-compressed demo)"))
    processes: ProcessMode = Field("count", description="co-tenancy evidence as the real sources give it")
    devices_per_vendor_scale: int = Field(1, ge=1, le=64, description=(
        "the scenario's GPUs repeated this many times (a larger simulated node)"))


OPTIONS: dict[str, type[Options]] = {
    "nvml": NvmlOptions, "dcgm": DcgmOptions, "amdgpu": AmdgpuOptions, "amdsmi": AmdsmiOptions,
    "intel": NoOptions, "levelzero": NoOptions, "fdinfo": FdinfoOptions, "upstream": UpstreamOptions,
    "profiles": ProfilesOptions, "simulator": SimulatorOptions,
}
