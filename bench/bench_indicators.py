"""CPU cost of the contention indicators at the fast sampling interval (not a test; `make bench`).

Drives IndicatorEngine.update() for GPUS devices every INTERVAL seconds of a fake monotonic clock
with the canonical series an 8-GPU NVLink node produces (utilization, occupancy, bandwidth, L2
miss rate, 15 throttle reasons, 18 NVLink links x tx/rx counters and utilization, temperatures,
clocks, power: ~100 series per GPU).  Windows are filled first, so the measurement is the steady
state.  Reports process CPU time per simulated second as a percent of one core (budget: 5 %).

    python bench/bench_indicators.py [--gpus 8] [--interval 0.1] [--seconds 120] [--recompute 1.0]
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, installed or not
from exporter.indicators import IndicatorConfig, IndicatorEngine  # noqa: E402
from exporter.run.baseline_file import BaselineFile  # noqa: E402

BUDGET_PERCENT = 5.0
REASONS = ("gpu_idle", "app_clocks", "sw_power_cap", "hw_slowdown", "sync_boost", "sw_thermal",
           "hw_thermal", "hw_power_brake", "display_clocks", "other", "idle", "power_cap", "thermal",
           "current", "voltage")
LINKS = 18


@functools.cache
def sid(name: str, *labels: tuple[str, str]) -> tuple:
    """A series id (name, sorted extra labels), one object per series as the mapper's plans keep."""
    return (name, tuple(sorted(labels)))


def device_series(g: int, i: int, counters: list[float]) -> dict[tuple, float]:
    """One poll of one GPU (its frame): slowly varying load with an intermittent contention pattern."""
    phase = math.sin(i / 50.0 + g)
    contended = (i + 7 * g) % 40 < 6
    s: dict[tuple, float] = {
        sid("gpu_compute_utilization_percent"): 92.0 + 5.0 * phase,
        sid("gpu_compute_occupancy_percent"): 35.0 if contended else 65.0 + 5.0 * phase,
        sid("gpu_sm_active_percent"): 80.0 + 5.0 * phase,
        sid("gpu_tensor_utilization_percent"): 40.0 + 10.0 * phase,
        sid("gpu_memory_bandwidth_utilization_percent"): 92.0 if contended else 70.0 + 3.0 * phase,
        sid("gpu_memory_bandwidth_gbps"): (0.92 if contended else 0.70) * 3350.0,
        sid("gpu_memory_peak_bandwidth_gbps"): 3350.0,
        sid("gpu_l2_cache_miss_rate_percent"): 30.0 if contended else 10.0,
        sid("gpu_memory_used_bytes"): 60e9,
        sid("gpu_memory_total_bytes"): 80e9,
        sid("gpu_memory_utilization_percent"): 75.0,
        sid("gpu_power_watts"): 550.0 + 50.0 * phase,
        sid("gpu_energy_joules_total"): 1e6 + i * 55.0,
        sid("gpu_temperature_celsius", ("sensor", "gpu")): 65.0,
        sid("gpu_temperature_celsius", ("sensor", "memory")): 70.0,
        sid("gpu_clock_mhz", ("domain", "graphics")): 1980.0,
        sid("gpu_clock_mhz", ("domain", "sm")): 1980.0,
        sid("gpu_clock_mhz", ("domain", "memory")): 2619.0,
        sid("gpu_clock_mhz", ("domain", "video")): 1545.0,
        sid("gpu_pcie_bytes_total", ("direction", "tx")): 1e9 + i * 1e6,
        sid("gpu_pcie_bytes_total", ("direction", "rx")): 2e9 + i * 1e6,
    }
    for r in REASONS:
        s[sid("gpu_throttle_active", ("reason", r))] = 1.0 if (r == "sw_power_cap" and contended) else 0.0
    refresh = i % 10 == 0  # NVLink counters refresh once a second
    for link in range(LINKS):
        for k, direction in enumerate(("tx", "rx")):
            idx = 2 * link + k
            if refresh:
                counters[idx] += 2.5e9
            s[sid("gpu_interconnect_bytes_total", ("interconnect", "nvlink"), ("direction", direction),
                  ("link", str(link)))] = counters[idx]
        s[sid("gpu_interconnect_utilization_percent", ("interconnect", "nvlink"), ("link", str(link)))] = \
            60.0 + 20.0 * phase
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--interval", type=float, default=0.1, help="fast sampling interval, seconds")
    ap.add_argument("--seconds", type=float, default=120.0, help="simulated seconds measured")
    ap.add_argument("--recompute", type=float, default=None,
                    help="variability.recompute_seconds (default: the config default, 1 s)")
    args = ap.parse_args()

    ids = [("nvidia", str(g), f"GPU-{g:08x}-bench") for g in range(args.gpus)]
    counters = {d: [0.0] * (2 * LINKS) for d in ids}
    variability = {} if args.recompute is None else {"recompute_seconds": args.recompute}
    config = IndicatorConfig.model_validate({
        "variability": variability,
        "baseline": {"bin_seconds": 1.0, "warmup_bins": 5},
        "cost": {"prices": [{"vendor": "nvidia", "model": "*H100*", "dollars_per_hour": 2.85}]},
    })
    with tempfile.TemporaryDirectory() as state:
        engine = IndicatorEngine(config, None, args.interval)
        for d in ids:
            engine.set_device_info(d, model="NVIDIA H100 80GB HBM3", vendor="nvidia")
        warm = round(config.variability.window_seconds / args.interval)
        measured = round(args.seconds / args.interval)
        # the series dicts are built outside the timed region: the daemon has them already
        cpu = 0.0
        series_out = 0
        for i in range(warm + measured):
            devices = {d: device_series(g, i, counters[d]) for g, d in enumerate(ids)}
            t0 = time.process_time()
            out = engine.update(i * args.interval, devices)
            elapsed = time.process_time() - t0
            if i >= warm:
                cpu += elapsed
                series_out = sum(map(len, out.values()))
        t0 = time.perf_counter()
        BaselineFile(Path(state)).save(engine.baselines)
        save_ms = (time.perf_counter() - t0) * 1000

    simulated = measured * args.interval
    percent = cpu / simulated * 100.0
    per_update_us = cpu / measured * 1e6
    print(f"indicators: {args.gpus} GPUs every {args.interval * 1000:.0f} ms, {series_out} series per update,"
          f" statistics every {config.variability.recompute_seconds:g} s")
    print(f"  update(): {per_update_us:.0f} us per call ({per_update_us / args.gpus:.0f} us per GPU)")
    print(f"  CPU: {percent:.2f} % of one core (budget {BUDGET_PERCENT:.0f} %)"
          f" -> {'OK' if percent < BUDGET_PERCENT else 'OVER BUDGET'}")
    print(f"  state file save: {save_ms:.1f} ms")


if __name__ == "__main__":
    main()
