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
    processes: ProcessMode = "count"
    processes_top_n: int = Field(10, ge=1)
    xid: bool = True
    xid_timeout_ms: int = Field(500, ge=1, le=60_000)
    gpm: bool = True
    gpm_metrics: list[str] | None = None  # NVML_GPM_METRIC_* suffixes
    gpm_min_window_s: Duration = 0.1
    gpm_reseed_factor: float = Field(5.0, gt=1)
    gpm_max_window_s: Duration = 600.0
    interval: Duration | None = None
    nvlink_per_link: bool = False
    mig: bool = True
    mig_rescan_polls: int = Field(30, ge=1)

    @field_validator("gpm_metrics")
    @classmethod
    def _gpm_names(cls, value: list[str] | None) -> list[str] | None:
        import re

        for name in value or []:
            if not re.fullmatch(r"[A-Za-z0-9_]+", name):
                raise ValueError(f"{name!r} is not an NVML_GPM_METRIC_* suffix (e.g. DRAM_BW_UTIL)")
        return value


class DcgmOptions(Options):
    field_ids: list[int] | None = None
    hostname: str = "localhost"
    update_interval_s: Duration = 1.0
    max_keep_age_s: Duration = 60.0


class AmdgpuOptions(Options):
    pcie_bw: bool = True
    pcie_bw_interval: Duration = 1.0
    gpu_metrics: bool = True
    # attribute files kept open and re-read with pread: auto = when the tree is a sysfs mount
    # (a fake tree whose files are replaced by rename needs a fresh open per read)
    keep_open: Literal["auto", "always", "never"] = "auto"


class AmdsmiOptions(Options):
    ecc_blocks: list[str] | None = None
    processes: ProcessMode = "count"
    process_top_n: int = Field(10, ge=1)


class FdinfoOptions(Options):
    processes: ProcessMode = "count"
    top_n: int = 5  # < 0: every process, no "other"
    # the per-poll budget of the /proc scan (fdinfo_scan.py; beyond it the count is partial)
    scan_max_fds: int = Field(default=20000, ge=100)  # fds examined (readlink) per poll
    scan_max_seconds: Duration = 0.05  # wall time of one poll's fd-table work
    # every fd table listed again (new fd numbers) / every fd readlinked again (reused numbers);
    # docs/detection.md: a new tenant is counted within scan_verify_period + 2 polls
    scan_check_period: Duration = 15.0
    scan_verify_period: Duration = 50.0


class TriggerOptions(Options):
    enabled: bool = False
    metric: str = "gpu_memory_contention"
    above: float = 0.5
    for_seconds: DurationOrZero = 30.0
    command: list[str] = []
    timeout: Duration = 300.0
    min_interval: DurationOrZero = 900.0
    # each capture runs in a fresh 0700 folder here (default: the system temp dir)
    staging_dir: Path | None = None

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
    dir: Path | None = None  # required for the source to run; without it the source is off
    top_kernels: int = Field(10, ge=1)
    max_profiles: int = Field(16, ge=1)
    settle: DurationOrZero = 1.0
    # imported values stop feeding series and alerts this long after their import (0: never)
    ttl: DurationOrZero = 600.0
    scan_interval: Duration = 2.0
    max_file_bytes: int = Field(512 * 1024 * 1024, ge=1)  # also after decompression
    max_devices_per_import: int = Field(16, ge=1)
    max_series_per_import: int = Field(20000, ge=1)
    # all kept imports together: the oldest are evicted to make room (at least one import's worth;
    # default: 50000, or max_series_per_import where that is larger)
    max_series_total: int | None = Field(None, ge=1, strict=True)
    # what parsing one artifact may cost: it runs in a child process with these kernel limits
    max_events_per_import: int = Field(1_000_000, ge=1, strict=True)  # trace events, table rows
    import_memory_bytes: int = Field(768 << 20, ge=64 << 20, strict=True)  # RLIMIT_AS of the child
    import_cpu_seconds: int = Field(60, ge=1, le=86400, strict=True)  # RLIMIT_CPU of the child
    import_timeout: Duration = 120.0  # wall clock, then the child is killed
    restore: bool = True
    trigger: TriggerOptions | None = None

    @model_validator(mode="after")
    def _total_holds_one_import(self) -> ProfilesOptions:
        if self.max_series_total is None:
            self.max_series_total = max(50000, self.max_series_per_import)
        elif self.max_series_total < self.max_series_per_import:
            raise ValueError(f"max_series_total ({self.max_series_total}) must be at least "
                             f"max_series_per_import ({self.max_series_per_import})")
        return self


class UpstreamTls(Options):
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    insecure_skip_verify: bool = False


class UpstreamBasicAuth(Options):
    username: str
    password: str = ""
    password_file: Path | None = None


class UpstreamTarget(Options):
    """One vendor exporter the upstream source scrapes (the defaults here are the only ones)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    url: str
    exporter: str
    name: str | None = None  # default: "<exporter>-<position>"
    timeout: Duration = Field(5.0, le=3600)  # seconds for the whole request (connect + body)
    metric_prefix: str = ""
    tls: UpstreamTls | None = None
    basic_auth: UpstreamBasicAuth | None = None
    # per poll; above either the target fails that poll (limit_exceeded), as a Prometheus scrape
    # past sample_limit fails as a whole
    max_series: int = Field(20_000, ge=1, le=1_000_000, strict=True)
    max_label_values: int = Field(1_000, ge=1, le=100_000, strict=True)  # distinct values of one label name
    # the naming generation the target serves, for an operator who knows it (one of the
    # `schemas` of mappings/upstream/<exporter>.yaml, checked at load); default: recognised per
    # scrape.  ("schema" is a BaseModel attribute, hence the alias.)
    schema_pin: str | None = Field(None, alias="schema", pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")

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
    targets: list[UpstreamTarget] = []

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
    scenario: str = "demo"
    phase: str | None = None  # held until the process stops
    # seeds the simulated GPUs' UUIDs and serials (default: the host name), so that two
    # simulated nodes never report the same GPU
    host: str | None = Field(None, min_length=1, max_length=253)
    # the phases run this many times faster than their durations say (a time-compressed demo)
    speed: float = Field(1.0, gt=0, le=1000)
    processes: ProcessMode = "count"  # co-tenancy evidence as the real sources give it
    devices_per_vendor_scale: int = Field(1, ge=1, le=64)


OPTIONS: dict[str, type[Options]] = {
    "nvml": NvmlOptions, "dcgm": DcgmOptions, "amdgpu": AmdgpuOptions, "amdsmi": AmdsmiOptions,
    "intel": NoOptions, "levelzero": NoOptions, "fdinfo": FdinfoOptions, "upstream": UpstreamOptions,
    "profiles": ProfilesOptions, "simulator": SimulatorOptions,
}
