#!/usr/bin/env python3
"""Probe a real NVIDIA GPU through the exporter's NVML source; write what the hardware said.

Only imports ``exporter.sources.nvml`` (and ``base``) from the project, so it runs without the
core.  Needs ``pynvml`` (nvidia-ml-py) importable.  Writes under $OUT (or ./nvml-check-out):
  raw_readings.json   every raw reading of 3 polls 1 s apart, errors, device_up, poll durations
  gpm_support.json    per GPU: nvmlGpmQueryDeviceSupport and, for every NVML_GPM_METRIC_* id,
                      the metric's own return code and value over a ~1 s window
  memory_identity.json  per GPU: memory info v2 total vs used + free + reserved (and v1 used)
  summary.txt         a short human summary
Every NVML call is guarded; total runtime stays well under 60 s.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

OUT = Path(os.environ.get("OUT") or "nvml-check-out")
OUT.mkdir(parents=True, exist_ok=True)
summary: list[str] = []


def note(line: str) -> None:
    print(line, flush=True)
    summary.append(line)


def dump(name: str, data: object) -> None:
    (OUT / name).write_text(json.dumps(data, indent=2, sort_keys=True, default=str))


def probe_source() -> None:
    from exporter.sources.base import SourceUnavailable
    from exporter.sources.context import SourceContext
    from exporter.sources.nvml import NvmlSource

    src = NvmlSource(SourceContext(options={"processes": "series", "processes_top_n": 5, "xid_timeout_ms": 200,
                                            "nvlink_per_link": False}))
    try:
        t0 = time.perf_counter()
        src.open()
        note(f"source open: {time.perf_counter() - t0:.3f} s, driver {src.driver}, "
             f"{len(src.gpus)} GPU(s)")
    except SourceUnavailable as exc:
        note(f"source unavailable: {exc}")
        dump("raw_readings.json", {"unavailable": str(exc)})
        return
    polls = []
    try:
        for i in range(3):
            t0 = time.perf_counter()
            s = src.poll()
            dt = time.perf_counter() - t0
            polls.append({
                "poll": i, "duration_s": dt,
                "devices": [d.__dict__ if hasattr(d, "__dict__") else
                            {f: getattr(d, f) for f in d.__slots__} for d in s.devices],
                "device_up": s.device_up, "errors": dict(s.errors),
                "readings": [{"device": r.device, "field": r.field, "value": r.value,
                              "labels": dict(r.labels)} for r in s.readings],
            })
            fields = sorted({r.field for r in s.readings})
            note(f"poll {i}: {dt * 1000:.1f} ms, {len(s.readings)} readings, {len(fields)} fields, "
                 f"errors {dict(s.errors)}, up {s.device_up}")
            if i < 2:
                time.sleep(1.0)
        last = polls[-1]["readings"]
        gpm = sorted({r["field"] for r in last if r["field"].startswith("gpm.")})
        note(f"GPM fields in poll 2: {gpm}")
        skipped = sorted(f"{k}:{f}" for k, f in src.guard.skipped) if src.guard else []
        note(f"not supported (remembered): {skipped}")
    finally:
        src.close()
    dump("raw_readings.json", {"polls": polls, "skipped": skipped})


def probe_gpm_and_memory() -> None:
    import pynvml as nv

    nv.nvmlInit()
    gpm_out: dict[str, object] = {}
    mem_out: dict[str, object] = {}
    try:
        ids = sorted({v for k, v in vars(nv).items()
                      if k.startswith("NVML_GPM_METRIC_") and k != "NVML_GPM_METRIC_MAX" and isinstance(v, int)})
        names = {v: k[len("NVML_GPM_METRIC_"):] for k, v in vars(nv).items()
                 if k.startswith("NVML_GPM_METRIC_") and k != "NVML_GPM_METRIC_MAX"}
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            key = f"gpu{i}"
            # -- memory identity
            m: dict[str, object] = {}
            try:
                v2 = nv.nvmlDeviceGetMemoryInfo(h, nv.nvmlMemory_v2)
                m.update(total=v2.total, used=v2.used, free=v2.free, reserved=v2.reserved,
                         sum_used_free_reserved=v2.used + v2.free + v2.reserved,
                         diff=v2.total - (v2.used + v2.free + v2.reserved))
            except Exception as exc:  # noqa: BLE001
                m["v2_error"] = repr(exc)
            try:
                v1 = nv.nvmlDeviceGetMemoryInfo(h)
                m.update(v1_total=v1.total, v1_used=v1.used, v1_free=v1.free)
            except Exception as exc:  # noqa: BLE001
                m["v1_error"] = repr(exc)
            mem_out[key] = m
            note(f"{key} memory: {m}")
            # -- GPM support per metric
            g: dict[str, object] = {}
            try:
                sup = nv.nvmlGpmQueryDeviceSupport(h)
                g["isSupportedDevice"] = int(sup.isSupportedDevice)
            except Exception as exc:  # noqa: BLE001
                g["support_error"] = repr(exc)
            if g.get("isSupportedDevice"):
                s1 = s2 = None
                try:
                    s1, s2 = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
                    nv.nvmlGpmSampleGet(h, s1)
                    time.sleep(1.0)
                    nv.nvmlGpmSampleGet(h, s2)
                    per: dict[str, object] = {}
                    for start in range(0, len(ids), 64):
                        chunk = ids[start:start + 64]
                        mg = nv.c_nvmlGpmMetricsGet_t()
                        mg.version = nv.NVML_GPM_METRICS_GET_VERSION
                        mg.numMetrics = len(chunk)
                        mg.sample1, mg.sample2 = s1, s2
                        for j, mid in enumerate(chunk):
                            mg.metrics[j].metricId = mid
                        try:
                            nv.nvmlGpmMetricsGet(mg)
                        except Exception as exc:  # noqa: BLE001
                            for mid in chunk:
                                per[f"{mid}:{names.get(mid)}"] = {"call_error": repr(exc)}
                            continue
                        for j, mid in enumerate(chunk):
                            met = mg.metrics[j]
                            per[f"{mid}:{names.get(mid)}"] = {"rc": int(met.nvmlReturn), "value": float(met.value)}
                    g["metrics"] = per
                    ok = sorted(int(k.split(":")[0]) for k, v in per.items() if v.get("rc") == 0)
                    g["supported_ids"] = ok
                    note(f"{key} GPM: {len(ok)} of {len(ids)} metric ids supported: {ok}")
                except Exception as exc:  # noqa: BLE001
                    g["sample_error"] = repr(exc)
                    note(f"{key} GPM sampling failed: {exc!r}")
                finally:
                    for s in (s1, s2):
                        if s is not None:
                            try:
                                nv.nvmlGpmSampleFree(s)
                            except Exception:  # noqa: BLE001
                                pass
            else:
                note(f"{key} GPM: not supported ({g})")
            gpm_out[key] = g
    finally:
        nv.nvmlShutdown()
    dump("gpm_support.json", gpm_out)
    dump("memory_identity.json", mem_out)


def main() -> int:
    t0 = time.time()
    for step in (probe_source, probe_gpm_and_memory):
        try:
            step()
        except Exception:  # noqa: BLE001 - report and continue with the next step
            note(f"{step.__name__} failed:\n{traceback.format_exc()}")
    note(f"probe total {time.time() - t0:.1f} s")
    (OUT / "summary.txt").write_text("\n".join(summary) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
