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
    """Per GPU and metric robust baseline (median / MAD of binned medians), learned under load.

    Samples are grouped into bins of ``bin_seconds`` of learned signal; each bin's median enters
    the fast reference (the last ``fast_bins`` bins) and, ``long_bin_bins`` at a time, the long
    reference (the last ``long_bins`` medians of those).  Learning stops while the GPU is
    contended, throttled or the metric is flagged, so a problem is not learned as normal.
    """

    bin_seconds: float = Field(60.0, gt=0)
    fast_bins: int = Field(60, ge=2, le=10080)
    # bins learned before z-scores, deviation and drop flags are exported
    warmup_bins: int = Field(5, ge=1)
    long_bin_bins: int = Field(60, ge=1, le=10080)
    long_bins: int = Field(168, ge=1, le=10080)
    # hourly bins before the protected level (the highest hourly median) flags a decline: 2 h
    long_warmup_bins: int = Field(2, ge=1)
    deviation_sigma: float = Field(2.0, gt=0)
    # the value compared with the baseline is the median of the last compare_seconds of samples
    compare_seconds: float = Field(30.0, gt=0)
    # a deviation is flagged only after it held this long (and cleared after it is gone as long)
    persistence_seconds: float = Field(60.0, ge=0)
    # a deviation held this long is accepted as the new normal: the baseline starts over
    # (0: never; a GPU stays flagged until the level comes back)
    relearn_after_seconds: float = Field(21600.0, ge=0)
    # the long reference flags a decline of at least this fraction (slow drifts the fast one learns)
    long_drop_fraction: float = Field(0.25, gt=0, lt=1)
    # bandwidth and miss-rate baselines learn only while utilization is above this
    # (the seed's baselines are "under normal production load")
    load_utilization_percent: float = Field(85.0, ge=0, le=100)
    # sigma used for z-scores is at least this fraction of the median (constant signals)
    min_relative_stddev: float = Field(0.05, ge=0)


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
    # the state `throttled` (the loss is explained by the clocks, not by a neighbour) needs one
    # of these reasons (hardware slowdown: the clocks are cut, whatever the load) ...
    slowdown_reasons: tuple[str, ...] = ("hw_thermal", "sw_thermal", "thermal", "prochot", "hw_slowdown",
                                         "hw_power_brake")
    # ... or a power reason with the compute clock at least this fraction below its maximum (a
    # loaded GPU sits at its power cap for hours a few percent below its top clock: that alone
    # explains no loss; no clock reported: a power reason alone explains nothing)
    power_clock_drop_fraction: float = Field(0.20, gt=0, lt=1)
    # the dominant cause is the first active one in this order
    priority: tuple[str, ...] = ("thermal_throttle", "power_throttle", "bandwidth_saturation",
                                 "memory_pressure", "coherency")

    @model_validator(mode="after")
    def _priority_is_causes(self) -> RootCauseConfig:
        if sorted(self.priority) != sorted(CAUSES):
            raise ValueError(f"priority must list each of {list(CAUSES)} once")
        return self


class StateConfig(_Strict):
    """The per-GPU memory state (state.py, docs/detection.md): idle bars and evidence rules."""

    # below both bars (and the compute signal below the utilization bar) the GPU is idle
    idle_utilization_percent: float = Field(5.0, ge=0, le=100)
    idle_bandwidth_percent: float = Field(5.0, ge=0, le=100)
    # a process is an active client while its utilization is at least this
    client_active_percent: float = Field(5.0, ge=0, le=100)
    # active clients that make the memory-bound signature contention
    min_clients: int = Field(2, ge=2)
    # with min_clients or more active clients, bandwidth utilization above this is contention
    # whatever the compute signal.  Measured on an H200 (docs/detection.md): two time-sliced copy
    # jobs each lost 55 % of their throughput while the GPU's DRAM utilization FELL from 87 % to
    # 78 % and occupancy stayed at 71 %, so the 85 %/50 % signature never matched real
    # co-location.  100 keeps the seed's signature as the only route to "contended".
    shared_bandwidth_percent: float = Field(70.0, ge=0, le=100)
    # a client seen active within this many seconds (and at least two poll intervals of the
    # source that counted it) still counts: a process list that misses a time-sliced tenant for
    # one poll does not flip the state
    client_holdover_seconds: float = Field(3.0, ge=0)
    # per-process data showing one active client overrides a throughput drop
    single_client_vetoes_drop: bool = True
    # memory-bound reference (the compute signal while memory-bound without interference):
    # robust median over bins of this many seconds, warm after warmup_bins bins
    reference_bin_seconds: float = Field(5.0, gt=0)
    reference_bins: int = Field(24, ge=2, le=4096)
    reference_warmup_bins: int = Field(6, ge=1)
    # throughput drop: compute signal below reference x (1 - drop_fraction) ...
    drop_fraction: float = Field(0.30, gt=0, lt=1)
    # ... the median of the compute signal over this many seconds (noise does not break a drop) ...
    drop_compare_seconds: float = Field(5.0, gt=0)
    # ... continuously for this long (a persistence window, not a single sample)
    drop_persistence_seconds: float = Field(10.0, ge=0)
    # a throughput drop that no per-process data confirms, held this long, may be a job change
    # as well as a neighbour: the state turns unknown (throughput_drop_unconfirmed) instead of
    # staying contended indefinitely (0: stays contended)
    drop_confirm_seconds: float = Field(900.0, ge=0)
    # idle this long: the next job starts a fresh reference
    reference_reset_idle_seconds: float = Field(60.0, ge=0)


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
    # seed: (baseline time - actual time) x price, + surcharge_dollars per surcharge_step of loss
    # (e.g. $0.20 per 10 %), booked per hour of contended time; 0 disables the surcharge
    surcharge_dollars: float = Field(0.0, ge=0)
    surcharge_step: float = Field(0.10, gt=0, le=1)
    # slowdown assumed while contended when no memory-bound reference measures it
    default_slowdown: float = Field(0.0, ge=0, le=1)


class IndicatorConfig(_Strict):
    enabled: bool = True
    contention: ContentionConfig = ContentionConfig()
    variability: VariabilityConfig = VariabilityConfig()
    baseline: BaselineConfig = BaselineConfig()
    bandwidth_drop: BandwidthDropConfig = BandwidthDropConfig()
    rootcause: RootCauseConfig = RootCauseConfig()
    cost: CostConfig = CostConfig()
    state: StateConfig = StateConfig()
