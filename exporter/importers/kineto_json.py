"""PyTorch profiler (Kineto) chrome-trace JSON, CUDA and ROCm.

``ts``/``dur`` are microseconds.  GPU events (``cat: kernel``) join their launch call
(``cuda_runtime``/``cuda_driver`` events whose name contains ``LaunchKernel``) on
``args.correlation``; launch delay and queue length are computed as in Holistic Trace Analysis.
``cuda_profiler_range`` events (CUPTI range profiler) carry ncu metric values in ``args``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .model import (
    KernelRecord,
    Profile,
    ProfileRejected,
    Range,
    clean_kernel_name,
    parse_number,
    queue_length_max,
)

_GPU_RANGE_CATS = ("user_annotation", "gpu_user_annotation")


def _num(v: Any) -> float | None:
    return parse_number(v) if not isinstance(v, bool) else None


def parse(path: str, data: Any, max_events: int | None = None) -> Profile:
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ProfileRejected("json: no traceEvents list (not a Kineto / chrome trace)")
    if max_events is not None and len(data["traceEvents"]) > max_events:
        raise ProfileRejected(f"json: {len(data['traceEvents'])} trace events, above max_events_per_import "
                              f"({max_events})", "events")
    events = [e for e in data["traceEvents"] if isinstance(e, dict)]
    props = data.get("deviceProperties") if isinstance(data.get("deviceProperties"), list) else []
    names = " ".join(str(e.get("name", "")) for e in events if e.get("cat") == "cuda_runtime")
    model0 = str(props[0].get("name", "")) if props and isinstance(props[0], dict) else ""
    vendor = "amd" if model0.upper().startswith("AMD") or "hipLaunch" in names or "hipMemcpy" in names else "nvidia"
    prof = Profile(tool="kineto", variant=f"kineto json ({'ROCm' if vendor == 'amd' else 'CUDA'})", path=path)
    for p in props:
        if isinstance(p, dict) and "id" in p:
            prof.device(str(p["id"]), vendor).model = str(p.get("name", ""))
    launches: dict[Any, tuple[float, float]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver") \
                and "LaunchKernel" in str(e.get("name", "")):
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            ts, dur = _num(e.get("ts")), _num(e.get("dur"))
            if args.get("correlation") is not None and ts is not None:
                launches[args["correlation"]] = (ts * 1e3, (ts + (dur or 0.0)) * 1e3)
    queues: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
    ranges_kernels = []
    for e in events:
        cat, ph = e.get("cat"), e.get("ph")
        if ph != "X":
            continue
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        ts, dur = _num(e.get("ts")), _num(e.get("dur"))
        if ts is None:
            continue
        if cat == "kernel":
            dev = str(args.get("device", e.get("pid", "0")))
            stream = str(args.get("stream", e.get("tid", "")))
            rec = KernelRecord(name=clean_kernel_name(str(e.get("name", ""))), device=dev, start_ns=ts * 1e3,
                               duration_ns=dur * 1e3 if dur is not None else None, stream=stream)
            occ = _num(args.get("est. achieved occupancy %"))
            if occ is not None:
                rec.counters["est_achieved_occupancy_pct"] = occ
            call = launches.get(args.get("correlation"))
            if call is not None:
                rec.launch_delay_ns = max(0.0, ts * 1e3 - call[1])
                queues[(dev, stream)] += [(call[0], 1), (ts * 1e3, -1)]
            prof.device(dev, vendor)
            prof.kernels.append(rec)
        elif cat == "cuda_profiler_range":
            dev = str(args.get("device", e.get("pid", "0")))
            counters = {k: v for k, v in ((k, _num(v)) for k, v in args.items()) if v is not None and "__" in k}
            ranges_kernels.append(KernelRecord(
                name=clean_kernel_name(str(e.get("name", ""))), device=dev, start_ns=ts * 1e3,
                duration_ns=dur * 1e3 if dur is not None else None, counters=counters,
                counters_only=True))  # replayed ranges: durations are not kernel times
            prof.device(dev, vendor)
        elif cat in _GPU_RANGE_CATS:
            prof.ranges.append(Range(str(e.get("name", "")), ts * 1e3, (dur or 0.0) * 1e3))
    prof.kernels.extend(ranges_kernels)
    if not prof.kernels:
        raise ProfileRejected(f"{prof.variant}: no kernel or cuda_profiler_range events")
    for (dev, _), ev in queues.items():
        prof.queue_length_max[dev] = max(prof.queue_length_max.get(dev, 0), queue_length_max(ev))
    base = _num(data.get("baseTimeNanoseconds"))
    t0 = prof.t0_ns
    if t0 is not None:
        if base is not None:
            prof.wall_zero_ns = int(base)  # unix_ns = ts*1e3 + baseTimeNanoseconds (HTA)
        elif t0 > 1e18:  # older traces: ts is already epoch microseconds
            prof.wall_zero_ns = 0
    return prof
