"""Settings of the contention indicators: thresholds and windows, defaults as the seed states them.

The seed document's numbers (``../shared/seed``): GPUMemoryContention = memory bandwidth
utilization > 85 % while compute occupancy < 50 %; a clean run has a coefficient of variation
< 0.05; baseline deviation = more than 2 standard deviations below the learned baseline; bandwidth
drop under load = bandwidth 30 % below baseline while utilization > 85 %; memory pressure = L2
miss rate > 40 % (or a large rise) with bandwidth below saturation; saturation = bandwidth > 90 %
with a low miss rate.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

CAUSES = ("memory_pressure", "bandwidth_saturation", "coherency", "thermal_throttle", "power_throttle")
BASES = ("occupancy", "sm_active", "utilization")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ContentionConfig(_Strict):
    """GPUMemoryContention: bandwidth high while the compute signal is low."""

    bandwidth_utilization_percent: float = Field(85.0, ge=0, le=100)
    compute_percent: float = Field(50.0, ge=0, le=100)
    # compute signals in order of preference; the first one present is the `basis` label
    basis_order: tuple[str, ...] = BASES

    @model_validator(mode="after")
    def _known_bases(self) -> ContentionConfig:
        unknown = [b for b in self.basis_order if b not in BASES]
        if unknown or not self.basis_order:
            raise ValueError(f"basis_order must list some of {list(BASES)}, got {list(self.basis_order)}")
        return self


class VariabilityConfig(_Strict):
    """Coefficient of variation and quantiles over a sliding window of fast samples."""

    window_seconds: float = Field(60.0, gt=0)
    # fewer samples than this in the window: no variability series
    min_samples: int = Field(10, ge=2)
    # hard cap on the ring buffer (memory per window does not depend on uptime)
    max_samples: int = Field(4096, ge=16)
    cov_clean: float = Field(0.05, ge=0)
    # Sarle's bimodality coefficient (skew^2 + 1) / kurtosis; 5/9 is a uniform distribution
    bimodality_coefficient: float = Field(0.6, gt=0, le=1)
    # heavy tail: max(p99 - p50, p50 - p1) > this x inter-quartile range (a normal gives 1.7)
    tail_to_body_ratio: float = Field(3.0, gt=0)
    # statistics are recomputed at most this often (samples still enter at every poll)
    recompute_seconds: float = Field(1.0, ge=0)


class BaselineConfig(_Strict):
    """Per GPU and metric EWMA baseline, learned while the GPU is loaded."""

    half_life_seconds: float = Field(3600.0, gt=0)
    # samples learned before z-scores, deviation and drop flags are exported
    warmup_samples: int = Field(300, ge=1)
    deviation_sigma: float = Field(2.0, gt=0)
    # bandwidth and miss-rate baselines learn only while utilization is above this
    # (the seed's baselines are "under normal production load")
    load_utilization_percent: float = Field(85.0, ge=0, le=100)
    # stddev used for z-scores is at least this fraction of the mean (constant signals)
    min_relative_stddev: float = Field(0.01, ge=0)


class BandwidthDropConfig(_Strict):
    drop_fraction: float = Field(0.30, gt=0, lt=1)
    utilization_percent: float = Field(85.0, ge=0, le=100)


class RootCauseConfig(_Strict):
    pressure_miss_percent: float = Field(40.0, ge=0, le=100)
    # a "large rise vs baseline": miss >= factor x baseline AND at least `points` higher
    pressure_miss_rise_factor: float = Field(2.0, ge=1)
    pressure_miss_rise_points: float = Field(10.0, ge=0)
    saturation_bandwidth_percent: float = Field(90.0, ge=0, le=100)
    # "low miss rate" for saturation
    saturation_max_miss_percent: float = Field(40.0, ge=0, le=100)
    # claim saturation from bandwidth alone where no miss rate is reported
    saturation_without_miss_rate: bool = False
    coherency_link_utilization_percent: float = Field(80.0, ge=0, le=100)
    coherency_throughput_drop_fraction: float = Field(0.30, gt=0, lt=1)
    # interconnect throughput is the counter rate over at least this span
    interconnect_rate_seconds: float = Field(5.0, gt=0)
    thermal_reasons: tuple[str, ...] = ("hw_thermal", "sw_thermal", "thermal", "prochot")
    power_reasons: tuple[str, ...] = ("sw_power_cap", "hw_power_brake", "power_cap", "current", "voltage")
    # the dominant cause is the first active one in this order
    priority: tuple[str, ...] = ("thermal_throttle", "power_throttle", "bandwidth_saturation",
                                 "memory_pressure", "coherency")

    @model_validator(mode="after")
    def _priority_is_causes(self) -> RootCauseConfig:
        if sorted(self.priority) != sorted(CAUSES):
            raise ValueError(f"priority must list each of {list(CAUSES)} once")
        return self


class PriceEntry(_Strict):
    """One row of the price table. Empty fields match anything; model is a case-insensitive glob."""

    vendor: str = ""
    model: str = ""
    cloud: str = ""
    dollars_per_hour: float = Field(ge=0)


class CostConfig(_Strict):
    # cloud of this node when the daemon does not pass one (aws, gcp, azure, onprem, ...)
    cloud: str = ""
    prices: tuple[PriceEntry, ...] = ()


class IndicatorConfig(_Strict):
    enabled: bool = True
    contention: ContentionConfig = ContentionConfig()
    variability: VariabilityConfig = VariabilityConfig()
    baseline: BaselineConfig = BaselineConfig()
    bandwidth_drop: BandwidthDropConfig = BandwidthDropConfig()
    rootcause: RootCauseConfig = RootCauseConfig()
    cost: CostConfig = CostConfig()
