"""A scenario of the simulated node (YAML under mappings/scenarios/): devices, timed phases in
canonical terms, and what the detection suite expects of each device."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..durations import Duration
from ..indicators.config import PriceEntry
from ..map.schema import default_mappings_dir, parse_operand
from ..yamlfile import ConfigError, load_model


class Cycle(BaseModel):
    """A value that steps through a list, one entry per full poll (a flickering process list)."""

    model_config = ConfigDict(extra="forbid")
    cycle: list[float] = Field(min_length=1)


Value = float | list[float] | str | Cycle


class SimDevice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    vendor: Literal["nvidia", "amd", "intel"]
    case: str = ""  # what this device stands for in a detection scenario
    mapping: str
    model: str
    count: int = Field(default=1, ge=1, le=4096)
    driver: str = ""
    # mappings of artefacts that accompany this device's live readings (e.g. "profiles/ncu" for
    # the L2 miss rate only a profiler gives); targets the live mapping cannot carry go there
    extra_mappings: list[str] = []
    values: dict[str, Value] = {}
    # co-tenancy evidence (a source that counts this GPU's clients): by default where the device
    # or a phase gives it per-process utilization; false: a GPU no evidence source can see
    evidence: bool | None = None
    # canonical series this device's library does not report ("not supported"), whatever the
    # phases set (e.g. an Intel GPU whose Level Zero has no memory bandwidth counter)
    unsupported: list[str] = Field(default=[], max_length=256)


class Phase(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    duration: Duration
    description: str = ""
    values: dict[str, Value] = {}
    # per-device overrides, keyed "vendor:index" (e.g. "nvidia:0")
    devices: dict[str, dict[str, Value]] = {}
    # per device ("vendor:index"): counters (canonical names ending in _total) that step by this
    # much once, when the phase starts (an XID event, a burst of ECC errors); a counter that
    # stepped is reported from then on, as a driver's event count is
    events: dict[str, dict[str, float]] = {}
    # devices ("vendor:index") lost during this phase: still listed, no longer answering (as a GPU
    # that fell off the bus: NVML_ERROR_GPU_IS_LOST); events of the phase show when it is back
    lost: list[str] = []
    # every poll of the simulated library fails with this message during the phase (the source
    # is down, its GPUs' series are missing), e.g. a driver upgraded under the running exporter
    poll_error: str = Field(default="", max_length=200)

    @field_validator("events")
    @classmethod
    def _counters(cls, v: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        for device, steps in v.items():
            for key, step in steps.items():
                name, _ = parse_operand(key)
                if not name.endswith("_total") or not 0 < step <= 1e6:
                    raise ValueError(f"events of {device}: {key}: only a counter (a name ending in "
                                     f"_total) can step, by a positive amount up to 1e6 (got {step})")
        return v


class ExpectWindow(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    start: Duration = Field(alias="from")
    end: Duration = Field(alias="to")
    state: Literal["idle", "healthy", "memory_bound", "contended", "shared", "throttled", "unknown"]


class Expect(BaseModel):
    """What the detection suite expects of one device: its memory state within time windows
    (seconds since the start) and the bounds of its contended seconds at the end."""

    model_config = ConfigDict(extra="forbid")
    case: str = ""
    states: list[ExpectWindow] = []
    contended_seconds: tuple[float, float] | None = None
    # the same device when no source counts clients (simulator option processes: off); None: as above
    without_process_data: ExpectVariant | None = None


class ExpectVariant(BaseModel):
    model_config = ConfigDict(extra="forbid")
    states: list[ExpectWindow] = []
    contended_seconds: tuple[float, float] | None = None


Expect.model_rebuild()


class SimCloud(BaseModel):
    """The simulated node's cloud identity: its cloud labels, in place of a metadata service (which
    the simulator never asks).  Values are label values (short identifiers)."""

    model_config = ConfigDict(extra="forbid")
    cloud: Literal["aws", "azure", "gcp"]
    region: str = Field(default="", pattern=r"^[A-Za-z0-9._:/-]{0,128}$")
    zone: str = Field(default="", pattern=r"^[A-Za-z0-9._:/-]{0,128}$")
    instance_type: str = Field(default="", pattern=r"^[A-Za-z0-9._:/-]{0,128}$")
    instance_id: str = Field(default="", pattern=r"^[A-Za-z0-9._:/-]{0,128}$")


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str = ""
    seed: int = 1
    loop: bool = True
    devices: list[SimDevice] = Field(min_length=1)
    phases: list[Phase] = Field(min_length=1)
    # per device ("vendor:index"): expected indicator behaviour (tests/test_detection_scenarios.py)
    expect: dict[str, Expect] = {}
    # list prices of the simulated GPUs: the price table used when the configuration has none
    # (indicators.cost.prices), so the cost series of a plain `--simulate` show real numbers
    prices: list[PriceEntry] = Field(default=[], max_length=256)
    # the cloud labels of the simulated node (none when absent): never from a metadata service
    cloud: SimCloud | None = None

    @field_validator("devices", "phases")
    @classmethod
    def _keys(cls, v: list) -> list:
        for item in v:
            for key in [*getattr(item, "values", {}), *getattr(item, "unsupported", [])]:
                parse_operand(key)
        return v

    @model_validator(mode="after")
    def _device_keys(self) -> Scenario:
        """Every "vendor:index" a phase names is a device of the scenario."""
        count: dict[str, int] = {}
        for d in self.devices:
            count[d.vendor] = count.get(d.vendor, 0) + d.count
        known = {f"{v}:{i}" for v, n in count.items() for i in range(n)}
        for p in self.phases:
            unknown = sorted({*p.devices, *p.events, *p.lost} - known)
            if unknown:
                raise ValueError(f"phase {p.name}: no device {', '.join(unknown)} "
                                 f"(devices: {', '.join(sorted(known))})")
        return self

    def phase(self, name: str) -> Phase:
        for p in self.phases:
            if p.name == name:
                return p
        raise ConfigError(f"scenario {self.name}: no phase {name!r} "
                          f"(phases: {', '.join(p.name for p in self.phases)})")

    def phase_at(self, t: float) -> tuple[Phase, float]:
        total = sum(p.duration for p in self.phases)
        if self.loop:
            t %= total
        for p in self.phases:
            if t < p.duration:
                return p, t
            t -= p.duration
        return self.phases[-1], self.phases[-1].duration


def scenarios_dir() -> Path:
    return default_mappings_dir() / "scenarios"


def builtin_scenarios() -> list[str]:
    return sorted(p.stem for p in scenarios_dir().glob("*.yaml"))


def load_scenario(name_or_path: str) -> Scenario:
    path = Path(name_or_path)
    if not path.suffix:
        path = scenarios_dir() / f"{name_or_path}.yaml"
        if not path.is_file():
            raise ConfigError(f"unknown scenario {name_or_path!r}; built-in scenarios: "
                              f"{', '.join(builtin_scenarios())} (or give a YAML file)")
    return load_model(path, Scenario)
