"""Profiles -> raw readings for the mapping engine (``mappings/profiles/*.yaml``).

Every artifact GPU becomes a ``Device`` whose mapping is ``profiles/<tool>`` (Kineto ROCm traces:
``profiles/kineto_rocm``).  Readings, with raw labels ``kernel``, ``trace_id``, ``quantile``:

- ``<tool>.<counter>``: a tool counter, duration-weighted mean over the kernel's executions
  (for rates this equals total bytes / total time), once per kernel (label ``kernel``) and once
  over all kernels of the GPU (no ``kernel`` label);
- ``kernel.duration_ms`` (``quantile`` 0.5, 0.95, 0.99, 1), ``kernel.duration_cov``,
  ``kernel.executions`` per kernel;
- ``launch.delay_seconds`` (``quantile``) and ``launch.queue_length_max`` per GPU.

Kernels are bounded: the ``top_n`` kernels by total time on each GPU keep their name, the rest
are pooled as ``other``.  Long names are cut to 120 characters plus a short hash.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict

from ..model import Device, PollResult
from .model import DeviceInfo, KernelRecord, Profile, ProfileRejected, clean_profile, quantile

QUANTILES = (("50", 0.5), ("95", 0.95), ("99", 0.99), ("100", 1.0))  # (percentile label, q)
MAX_NAME = 120
OTHER = "other"


def mapping_name(tool: str, vendor: str) -> str:
    if tool == "kineto" and vendor == "amd":
        return "profiles/kineto_rocm"
    return f"profiles/{tool}"


def device_key(tool: str, uuid: str, pci_bus_id: str, index: str) -> str:
    """An artifact GPU's device key: by its UUID, else its PCI bus id, else its index."""
    return f"profiles:{tool}:{uuid or pci_bus_id or index}"


def device_for(prof: Profile, info: DeviceInfo) -> Device:
    return Device(key=device_key(prof.tool, info.uuid, info.pci_bus_id, info.index), vendor=info.vendor,
                  index=info.index, mapping=mapping_name(prof.tool, info.vendor), uuid=info.uuid,
                  model=info.model, pci_bus_id=info.pci_bus_id)


def kernel_label(name: str) -> str:
    if len(name) <= MAX_NAME:
        return name
    return name[:MAX_NAME] + "~" + hashlib.sha1(name.encode()).hexdigest()[:8]


def _weighted(recs: list[KernelRecord]) -> dict[str, float]:
    sums: dict[str, float] = defaultdict(float)
    weights: dict[str, float] = defaultdict(float)
    for k in recs:
        w = k.duration_ns if k.duration_ns and k.duration_ns > 0 else 1.0
        for name, v in k.counters.items():
            sums[name] += v * w
            weights[name] += w
    return {n: sums[n] / weights[n] for n in sums if weights[n] > 0}


def kernel_stats(durations_ns: list[float]) -> dict[str, float]:
    vals = sorted(d / 1e6 for d in durations_ns)
    out = {f"q{label}": quantile(vals, q) for label, q in QUANTILES}
    out["count"] = float(len(vals))
    mean = sum(vals) / len(vals)
    out["mean"] = mean
    if len(vals) >= 2 and mean > 0:
        out["cov"] = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals)) / mean
    return out


# bucket upper bounds of gpu_kernel_execution_time_milliseconds (as in canonical.yaml)
BUCKETS_MS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100,
              250, 500, 1000, 2500, 10000)


def histogram_readings(durations_ns: list[float]) -> list[tuple[str, float, tuple[tuple[str, str], ...]]]:
    """Cumulative bucket counts, sum and count of kernel durations in milliseconds."""
    ms = sorted(d / 1e6 for d in durations_ns)
    out: list[tuple[str, float, tuple[tuple[str, str], ...]]] = []
    i = 0
    for bound in BUCKETS_MS:
        while i < len(ms) and ms[i] <= bound:
            i += 1
        out.append(("kernel.duration_ms.bucket", float(i), (("le", f"{bound:g}"),)))
    out.append(("kernel.duration_ms.bucket", float(len(ms)), (("le", "+Inf"),)))
    out.append(("kernel.duration_ms.sum", sum(ms), ()))
    out.append(("kernel.duration_ms.count", float(len(ms)), ()))
    return out


def group_kernels(recs: list[KernelRecord], top_n: int) -> dict[str, list[KernelRecord]]:
    total: dict[str, float] = defaultdict(float)
    for k in recs:
        total[k.name] += k.duration_ns if k.duration_ns else 0.0
    ranked = sorted(total, key=lambda n: (-total[n], n))
    keep = set(ranked[:max(top_n, 0)])
    groups: dict[str, list[KernelRecord]] = defaultdict(list)
    for k in recs:
        groups[kernel_label(k.name) if k.name in keep else OTHER].append(k)
    return groups


def add_profile(sample: PollResult, prof: Profile, top_n: int = 10,
                allowed: dict[str, set[str]] | None = None) -> list[Device]:
    """Append one profile's readings to ``sample``; returns the devices it used.

    ``allowed``: mapping name -> raw fields its file maps; other fields are not emitted.
    """
    used = []
    base: tuple[tuple[str, str], ...] = (("trace_id", prof.trace_id),) if prof.trace_id else ()
    for info in prof.devices.values():
        recs = [k for k in prof.kernels if k.device == info.index]
        if not recs:
            continue
        dev = device_for(prof, info)
        used.append(dev)
        fields = allowed.get(dev.mapping) if allowed is not None else None

        def add(field: str, value: float, labels: tuple[tuple[str, str], ...], _d=dev, _f=fields) -> None:
            if _f is None or field in _f:
                sample.add(_d.key, field, value, base + labels)

        for name, value in _weighted(recs).items():
            add(f"{prof.tool}.{name}", value, ())
        for label, group in group_kernels(recs, top_n).items():
            kl = (("kernel", label),)
            for name, value in _weighted(group).items():
                add(f"{prof.tool}.{name}", value, kl)
            durs = [k.duration_ns for k in group if k.duration_ns and not k.counters_only]
            if durs:
                for field, value, extra in histogram_readings(durs):
                    add(field, value, kl + extra)
                st = kernel_stats(durs)
                for ql, _ in QUANTILES:
                    add("kernel.duration_ms", st[f"q{ql}"], kl + (("quantile", ql),))
                add("kernel.executions", st["count"], kl)
                if "cov" in st:
                    add("kernel.duration_cov", st["cov"], kl)
        delays = sorted(k.launch_delay_ns / 1e9 for k in recs if k.launch_delay_ns is not None)
        for ql, q in QUANTILES if delays else ():
            add("launch.delay_seconds", quantile(delays, q), (("quantile", ql),))
        if info.index in prof.queue_length_max:
            add("launch.queue_length_max", float(prof.queue_length_max[info.index]), ())
    return used


def checked_sample(prof: Profile, top_n: int, allowed: dict[str, set[str]] | None, max_devices: int,
                   max_series: int) -> tuple[list[Device], PollResult]:
    """One profile's devices and readings, or ProfileRejected above the per-import caps."""
    sample = PollResult()
    devices = add_profile(sample, prof, top_n, allowed)
    if len(devices) > max_devices:
        raise ProfileRejected(f"has kernels on {len(devices)} GPUs, above max_devices_per_import "
                              f"({max_devices})", "devices")
    if len(sample.readings) > max_series:
        raise ProfileRejected(f"gives {len(sample.readings)} series, above max_series_per_import "
                              f"({max_series})", "series")
    sample.devices = devices
    return devices, sample


def converted(prof: Profile, top_n: int, allowed: dict[str, set[str]] | None, max_devices: int, max_series: int,
              with_summary: bool) -> tuple[Profile, list[Device], PollResult, dict | None]:
    """What a parsed profile gives: the profile made clean (``clean_profile``), its devices and
    readings under the per-import caps (``checked_sample``) and, ``with_summary``, its summary."""
    prof = clean_profile(prof)
    devices, sample = checked_sample(prof, top_n, allowed, max_devices, max_series)
    return prof, devices, sample, summary(prof, top_n) if with_summary else None


def summary(prof: Profile, top_n: int = 10) -> dict:
    """A JSON-friendly view of one profile for the CLI: kernels, delays, timeline aligned to zero."""
    t0 = prof.t0_ns
    devices = []
    for info in prof.devices.values():
        recs = [k for k in prof.kernels if k.device == info.index]
        if not recs:
            continue
        kernels = []
        for label, group in sorted(group_kernels(recs, top_n).items()):
            durs = [k.duration_ns for k in group if k.duration_ns and not k.counters_only]
            entry = {"kernel": label, "counters": _rounded(_weighted(group))}
            if durs:
                st = kernel_stats(durs)
                entry.update({"executions": int(st["count"]), "total_ms": round(sum(durs) / 1e6, 6),
                              "mean_ms": round(st["mean"], 6), "p50_ms": round(st["q50"], 6),
                              "p95_ms": round(st["q95"], 6), "p99_ms": round(st["q99"], 6),
                              "max_ms": round(st["q100"], 6)})
                if "cov" in st:
                    entry["cov"] = round(st["cov"], 6)
            kernels.append(entry)
        kernels.sort(key=lambda e: -e.get("total_ms", 0.0))
        delays = sorted(k.launch_delay_ns / 1e3 for k in recs if k.launch_delay_ns is not None)
        dev = {"index": info.index, "vendor": info.vendor, "model": info.model, "uuid": info.uuid,
               "pci_bus_id": info.pci_bus_id, "kernel_executions": len([k for k in recs if not k.counters_only]),
               "kernels": kernels}
        if delays:
            dev["launch_delay_us"] = {"count": len(delays), "mean": round(sum(delays) / len(delays), 3),
                                      **{f"p{ql}": round(quantile(delays, q), 3) for ql, q in QUANTILES}}
        if info.index in prof.queue_length_max:
            dev["queue_length_max"] = prof.queue_length_max[info.index]
        devices.append(dev)
    timeline = {"zero_ns": t0, "wall_zero_unix_ns": (prof.wall_zero_ns + round(t0)
                                                      if prof.wall_zero_ns is not None and t0 is not None else None),
                "ranges": [{"name": r.name, "start_ms": round((r.start_ns - t0) / 1e6, 6),
                            "duration_ms": round(r.duration_ns / 1e6, 6)}
                           for r in prof.ranges[:200]] if t0 is not None else []}
    return {"path": prof.path, "tool": prof.tool, "variant": prof.variant, "trace_id": prof.trace_id,
            "trace_id_from": prof.trace_id_from, "devices": devices, "timeline": timeline,
            "warnings": prof.warnings}


def _rounded(d: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 6) for k, v in sorted(d.items()) if not k.startswith("label:")}
