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

    bandwidth_utilization_percent: float = Field(85.0, ge=0, le=100, description=(
        "memory bandwidth utilization above this is the first half of the GPUMemoryContention signature "
        "(seed: 85)"))
    compute_percent: float = Field(50.0, ge=0, le=100, description=(
        "the compute signal (the first of basis_order present) below this, with bandwidth high, is the "
        "second half (seed: 50)"))
    basis_order: tuple[str, ...] = Field(BASES, description=(
        "compute signals in order of preference; the first one present is the `basis` label"))
    fast_bandwidth_percent: float = Field(50.0, ge=0, le=100, description=(
        "fast sampling (`fast_interval`) runs while some GPU's (or MIG instance's) memory bandwidth "
        "utilization is at or above this, or its state is contended, memory_bound or shared, and for 30 s "
        "after; on a calm node (every GPU below it: contention needs 70-85 %) the indicators step with the "
        "full polls and no fast poll runs (once a second where a source's full polls are further apart). "
        "0: fast sampling always"))

    @model_validator(mode="after")
    def _known_bases(self) -> ContentionConfig:
        unknown = [b for b in self.basis_order if b not in BASES]
        if unknown or not self.basis_order:
            raise ValueError(f"basis_order must list some of {list(BASES)}, got {list(self.basis_order)}")
        return self


class VariabilityConfig(_Strict):
    """Coefficient of variation and quantiles over a sliding window of fast samples."""

    window_seconds: float = Field(60.0, gt=0, description=(
        "length of the sliding window of fast samples the coefficient of variation and the quantiles are "
        "computed over"))
    min_samples: int = Field(10, ge=2, description=(
        "fewer samples than this in the window: no variability series"))
    max_samples: int = Field(4096, ge=16, description=(
        "hard cap on the ring buffer (memory per window does not depend on uptime)"))
    cov_clean: float = Field(0.05, ge=0, description=(
        "a coefficient of variation below this is a clean run (seed: 0.05)"))
    bimodality_coefficient: float = Field(0.6, gt=0, le=1, description=(
        "Sarle's bimodality coefficient (skew^2 + 1) / kurtosis; 5/9 is a uniform distribution"))
    tail_to_body_ratio: float = Field(3.0, gt=0, description=(
        "heavy tail: max(p99 - p50, p50 - p1) > this x inter-quartile range (a normal gives 1.7)"))
    recompute_seconds: float = Field(1.0, ge=0, description=(
        "statistics are recomputed at most this often (samples still enter at every poll)"))


class BaselineConfig(_Strict):
    """Per GPU and metric robust baseline (median / MAD of binned medians), learned under load.

    Samples are grouped into bins of ``bin_seconds`` of learned signal; each bin's median enters
    the fast reference (the last ``fast_bins`` bins) and, ``long_bin_bins`` at a time, the long
    reference (the last ``long_bins`` medians of those).  Learning stops while the GPU is
    contended, throttled or the metric is flagged, so a problem is not learned as normal.
    """

    bin_seconds: float = Field(60.0, gt=0, description=(
        "seconds of learned signal per bin; each bin's median enters the fast reference"))
    fast_bins: int = Field(60, ge=2, le=10080, description=(
        "bins in the fast reference (the last fast_bins bin medians)"))
    warmup_bins: int = Field(5, ge=1, description=(
        "bins learned before z-scores, deviation and drop flags are exported"))
    long_bin_bins: int = Field(60, ge=1, le=10080, description=(
        "bins per entry of the long reference (with the defaults one per hour)"))
    long_bins: int = Field(168, ge=1, le=10080, description=(
        "entries in the long reference (with the defaults 168 hours: a week)"))
    long_warmup_bins: int = Field(2, ge=1, description=(
        "hourly bins before the protected level (the highest hourly median) flags a decline: 2 h"))
    deviation_sigma: float = Field(2.0, gt=0, description=(
        "a value more than this many robust standard deviations below the baseline is a deviation (seed: 2)"))
    compare_seconds: float = Field(30.0, gt=0, description=(
        "the value compared with the baseline is the median of the last compare_seconds of samples"))
    persistence_seconds: float = Field(60.0, ge=0, description=(
        "a deviation is flagged only after it held this long (and cleared after it is gone as long)"))
    relearn_after_seconds: float = Field(21600.0, ge=0, description=(
        "a deviation held this long is accepted as the new normal: the baseline starts over (0: never; a "
        "GPU stays flagged until the level comes back)"))
    long_drop_fraction: float = Field(0.25, gt=0, lt=1, description=(
        "the long reference flags a decline of at least this fraction (slow drifts the fast one learns)"))
    load_utilization_percent: float = Field(85.0, ge=0, le=100, description=(
        "bandwidth and miss-rate baselines learn only while utilization is above this (the seed's baselines"
        " are \"under normal production load\")"))
    min_relative_stddev: float = Field(0.05, ge=0, description=(
        "sigma used for z-scores is at least this fraction of the median (constant signals)"))


class BandwidthDropConfig(_Strict):
    drop_fraction: float = Field(0.30, gt=0, lt=1, description=(
        "bandwidth at least this fraction below its baseline while busy is a drop under load (seed: 30 %)"))
    utilization_percent: float = Field(85.0, ge=0, le=100, description=(
        "busy: utilization above this (seed: 85)"))


class RootCauseConfig(_Strict):
    pressure_miss_percent: float = Field(40.0, ge=0, le=100, description=(
        "memory pressure: L2 miss rate above this (or a large rise vs its baseline) with bandwidth below "
        "saturation (seed: 40)"))
    pressure_miss_rise_factor: float = Field(2.0, ge=1, description=(
        "a \"large rise vs baseline\": miss >= factor x baseline AND at least `points` higher"))
    pressure_miss_rise_points: float = Field(10.0, ge=0, description=(
        "the `points` of a large rise: the miss rate at least this many percentage points above its "
        "baseline"))
    saturation_bandwidth_percent: float = Field(90.0, ge=0, le=100, description=(
        "bandwidth saturation: bandwidth utilization above this with a low miss rate (seed: 90)"))
    saturation_max_miss_percent: float = Field(40.0, ge=0, le=100, description=(
        "\"low miss rate\" for saturation"))
    saturation_without_miss_rate: bool = Field(False, description=(
        "claim saturation from bandwidth alone where no miss rate is reported"))
    coherency_link_utilization_percent: float = Field(80.0, ge=0, le=100, description=(
        "coherency: interconnect link utilization at least this ..."))
    coherency_throughput_drop_fraction: float = Field(0.30, gt=0, lt=1, description=(
        "... while interconnect throughput is this fraction or more below its baseline"))
    interconnect_rate_seconds: float = Field(5.0, gt=0, description=(
        "interconnect throughput is the counter rate over at least this span"))
    thermal_reasons: tuple[str, ...] = Field(("hw_thermal", "sw_thermal", "thermal", "prochot"), description=(
        "throttle reasons that make the cause thermal_throttle"))
    power_reasons: tuple[str, ...] = Field(("sw_power_cap", "hw_power_brake", "power_cap", "current", "voltage"), description=(
        "throttle reasons that make the cause power_throttle"))
    slowdown_reasons: tuple[str, ...] = Field(("hw_thermal", "sw_thermal", "thermal", "prochot", "hw_slowdown", "hw_power_brake"), description=(
        "the state `throttled` (the loss is explained by the clocks, not by a neighbour) needs one of these"
        " reasons (hardware slowdown: the clocks are cut, whatever the load) ..."))
    power_clock_drop_fraction: float = Field(0.20, gt=0, lt=1, description=(
        "... or a power reason with the compute clock at least this fraction below its maximum (a loaded "
        "GPU sits at its power cap for hours a few percent below its top clock: that alone explains no "
        "loss; no clock reported: a power reason alone explains nothing)"))
    priority: tuple[str, ...] = Field(("thermal_throttle", "power_throttle", "bandwidth_saturation", "memory_pressure", "coherency"), description=(
        "the dominant cause is the first active one in this order"))

    @model_validator(mode="after")
    def _priority_is_causes(self) -> RootCauseConfig:
        if sorted(self.priority) != sorted(CAUSES):
            raise ValueError(f"priority must list each of {list(CAUSES)} once")
        return self


class StateConfig(_Strict):
    """The per-GPU memory state (state.py, docs/detection.md): idle bars and evidence rules."""

    idle_utilization_percent: float = Field(5.0, ge=0, le=100, description=(
        "below both bars (and the compute signal below the utilization bar) the GPU is idle"))
    idle_bandwidth_percent: float = Field(5.0, ge=0, le=100, description=(
        "bandwidth utilization bar of idle (with idle_utilization_percent)"))
    client_active_percent: float = Field(5.0, ge=0, le=100, description=(
        "a process is an active client while its utilization is at least this"))
    min_clients: int = Field(2, ge=2, description=(
        "active clients that make the memory-bound signature contention"))
    shared_bandwidth_percent: float = Field(70.0, ge=0, le=100, description=(
        "with min_clients or more active clients, bandwidth utilization above this is contention whatever "
        "the compute signal. Measured on an H200 (docs/detection.md): two time-sliced copy jobs each lost "
        "55 % of their throughput while the GPU's DRAM utilization FELL from 87 % to 78 % and occupancy "
        "stayed at 71 %, so the 85 %/50 % signature never matched real co-location. 100 keeps the seed's "
        "signature as the only route to \"contended\"."))
    client_holdover_seconds: float = Field(3.0, ge=0, description=(
        "a client seen active within this many seconds (and at least two poll intervals of the source that "
        "counted it) still counts: a process list that misses a time-sliced tenant for one poll does not "
        "flip the state"))
    single_client_vetoes_drop: bool = Field(True, description=(
        "per-process data showing one active client overrides a throughput drop"))
    reference_bin_seconds: float = Field(5.0, gt=0, description=(
        "memory-bound reference (the compute signal while memory-bound without interference): robust median"
        " over bins of this many seconds, warm after warmup_bins bins"))
    reference_bins: int = Field(24, ge=2, le=4096, description=(
        "bins the memory-bound reference keeps (its robust median)"))
    reference_warmup_bins: int = Field(6, ge=1, description="bins before the memory-bound reference is used")
    drop_fraction: float = Field(0.30, gt=0, lt=1, description=(
        "throughput drop: compute signal below reference x (1 - drop_fraction) ..."))
    drop_compare_seconds: float = Field(5.0, gt=0, description=(
        "... the median of the compute signal over this many seconds (noise does not break a drop) ..."))
    drop_persistence_seconds: float = Field(10.0, ge=0, description=(
        "... continuously for this long (a persistence window, not a single sample)"))
    drop_confirm_seconds: float = Field(900.0, ge=0, description=(
        "a throughput drop that no per-process data confirms, held this long, may be a job change as well "
        "as a neighbour: the state turns unknown (throughput_drop_unconfirmed) instead of staying contended"
        " indefinitely (0: stays contended)"))
    reference_reset_idle_seconds: float = Field(60.0, ge=0, description=(
        "idle this long: the next job starts a fresh reference"))


class PriceEntry(_Strict):
    """One row of the price table. Empty fields match anything; model is a case-insensitive glob."""

    vendor: str = Field("", description="GPU vendor (nvidia, amd, intel); empty: any")
    model: str = Field("", description="case-insensitive glob on the GPU model (e.g. \"*H100*\"); empty: any")
    cloud: str = Field("", description="cloud the price applies to; empty: any")
    dollars_per_hour: float = Field(ge=0, description="price of one GPU hour")


class CostConfig(_Strict):
    cloud: str = Field("", description=(
        "cloud of this node when the daemon does not pass one (aws, gcp, azure, onprem, ...)"))
    prices: tuple[PriceEntry, ...] = Field((), description=(
        "the price table: the first row that matches a GPU prices its hours"))
    surcharge_dollars: float = Field(0.0, ge=0, description=(
        "seed: (baseline time - actual time) x price, + surcharge_dollars per surcharge_step of loss (e.g. "
        "$0.20 per 10 %), booked per hour of contended time; 0 disables the surcharge"))
    surcharge_step: float = Field(0.10, gt=0, le=1, description=(
        "loss per surcharge (0.10: surcharge_dollars per 10 % of slowdown)"))
    default_slowdown: float = Field(0.0, ge=0, le=1, description=(
        "slowdown assumed while contended when no memory-bound reference measures it"))


class IndicatorConfig(_Strict):
    enabled: bool = Field(True, description=(
        "compute the contention indicators (false: the canonical series only, no indicator series)"))
    contention: ContentionConfig = ContentionConfig()
    variability: VariabilityConfig = VariabilityConfig()
    baseline: BaselineConfig = BaselineConfig()
    bandwidth_drop: BandwidthDropConfig = BandwidthDropConfig()
    rootcause: RootCauseConfig = RootCauseConfig()
    cost: CostConfig = CostConfig()
    state: StateConfig = StateConfig()
