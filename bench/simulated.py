"""The simulated node scaled to N devices: scrape latency, exposition size, CPU per poll cycle.

The scenario is ``mappings/scenarios/demo.yaml`` with its device ``count``s scaled so the total is
N (vendor mix kept: NVIDIA : AMD : Intel ~ 2 : 2 : 1).  The exporter runs as a subprocess with
``--simulate <file> --poll.interval 1s``; nothing else is enabled.

    python bench/simulated.py [--devices 8 64 256] [--idle 10] [--load 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import REPO, Proc, exporter_cmd, free_port, idle_cpu, metric_value, scrape_load  # noqa: E402
from exporter.sources.context import SourceContext

DEMO = REPO / "mappings" / "scenarios" / "demo.yaml"


def split_counts(total: int, weights: list[int]) -> list[int]:
    """Split ``total`` over the weights (largest remainder), every entry at least 1."""
    s = sum(weights)
    raw = [total * w / s for w in weights]
    counts = [max(1, int(r)) for r in raw]
    order = sorted(range(len(weights)), key=lambda i: raw[i] - int(raw[i]), reverse=True)
    i = 0
    while sum(counts) < total:
        counts[order[i % len(order)]] += 1
        i += 1
    while sum(counts) > total:
        j = max(range(len(counts)), key=lambda k: counts[k])
        counts[j] -= 1
    return counts


def write_scenario(directory: Path, devices: int) -> Path:
    data = yaml.safe_load(DEMO.read_text())
    counts = split_counts(devices, [d.get("count", 1) for d in data["devices"]])
    for dev, n in zip(data["devices"], counts, strict=True):
        dev["count"] = n
    data["name"] = f"bench-{devices}"
    data["description"] = f"demo scaled to {devices} devices ({'/'.join(map(str, counts))})"
    path = directory / f"bench-{devices}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def start(devices: int, tmp: Path, interval: str = "1s", name: str = "", extra: tuple[str, ...] = ()) -> Proc:
    scenario = write_scenario(tmp, devices)
    port = free_port()
    name = name or f"sim{devices}"
    proc = Proc(name, [*exporter_cmd(), "--web.listen-address", f"127.0.0.1:{port}",
                       "--simulate", str(scenario), "--poll.interval", interval,
                       "--state.dir", str(tmp / f"state-{name}"), "--log.level", "warn", *extra], port)
    return proc.start(tmp)


def fast_sampling(tmp: Path, devices: int = 8, seconds: float = 20.0, fast: str = "100ms",
                  settle_s: float = 3.0) -> dict:
    """Daemon-level CPU of fast sampling + indicators at ``fast`` for ``devices`` simulated GPUs.

    Two exporters run side by side over the same window: ``fast`` (full poll 1 s, fast sampling
    and indicators every ``fast``) and ``base`` (full poll 1 s, fast interval 1 s, indicators off).
    The difference is what fast sampling plus the indicators cost.  The simulator's own
    ``poll_fast`` is counted (it stands in for the vendor's cheap reads).
    """
    conf = tmp / "no-indicators.yaml"
    conf.write_text("indicators:\n  enabled: false\n")
    a = start(devices, tmp, name=f"fast{devices}", extra=("--poll.fast-interval", fast))
    b = start(devices, tmp, name=f"base{devices}", extra=("--poll.fast-interval", "1s",
                                                            "--config.file", str(conf)))
    try:
        a.wait_ready()
        b.wait_ready()
        time.sleep(settle_s)
        ca, cb = a.cpu(), b.cpu()
        time.sleep(seconds)
        da, db = a.cpu() - ca, b.cpu() - cb
        return {"devices": devices, "fast_interval": fast, "seconds": seconds,
                "fast_percent": da / seconds * 100, "base_percent": db / seconds * 100,
                "fast_sampling_indicators_percent": (da - db) / seconds * 100}
    finally:
        a.stop()
        b.stop()


def run_one(devices: int, tmp: Path, idle_s: float, load_s: float,
            clients: tuple[int, ...] = (1, 50), settle_s: float = 5.0) -> dict:
    proc = start(devices, tmp)
    try:
        ready_s = proc.wait_ready()
        time.sleep(settle_s)  # rates need a second poll; indicator series appear after ~5 s
        # CPU per poll cycle: nobody scrapes; a cycle = full poll + map + render (text, OM, 2x gzip),
        # plus what runs between polls (fast sampling and indicators at the fast interval)
        cpu, window_s = idle_cpu(proc, idle_s)
        cycles = window_s / 1.0
        body = proc.get()
        gz = proc.get(gzip_ok=True)
        series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
        gpu_series = sum(1 for line in body.splitlines() if line.startswith(b"gpu_"))
        render_s = metric_value(body, "unified_gpu_exporter_render_duration_seconds")
        poll_s = metric_value(body, "unified_gpu_exporter_source_poll_duration_seconds")
        loads = {}
        for c in clients:
            for gz_ok in (False, True):
                r = scrape_load(proc, c, load_s, gzip_ok=gz_ok)
                loads[f"c{c}{'_gzip' if gz_ok else ''}"] = r.as_dict()
        rss = proc.rss()
        return {
            "devices": devices, "ready_s": round(ready_s, 2), "series": series,
            "gpu_series": gpu_series, "exposition_bytes": len(body), "exposition_gzip_bytes": len(gz),
            "idle_seconds": round(window_s, 2), "cpu_s_per_cycle": cpu / cycles,
            "cpu_ms_per_cycle_per_device": cpu / cycles / devices * 1000,
            "render_ms": None if render_s is None else render_s * 1000,
            "poll_ms": None if poll_s is None else poll_s * 1000,
            "rss_bytes": rss, "load": loads,
        }
    finally:
        proc.stop()


def render_breakdown(devices: int, tmp: Path, repeat: int = 5) -> dict:
    """In-process CPU of one render at ``devices`` simulated GPUs, by stage (no indicators)."""
    import gzip

    from exporter.map.mapper import Mapper
    from exporter.map.schema import default_mappings_dir, load_schema
    from exporter.map.store import SourceState, Store
    from exporter.model import frame_count
    from exporter.render.exposition import Renderer
    from exporter.run.pipeline import poll_and_map
    from exporter.simulate import SimulatorSource
    from exporter.testing import load_mappings

    mappings = load_mappings()
    src = SimulatorSource(SourceContext(options={"scenario": str(write_scenario(tmp, devices))}, mappings=mappings))
    src.open()
    store, state, mapper = Store(), SourceState("simulator"), Mapper(mappings)
    store.add(state)
    poll_s = map_s = 0.0
    for i in range(2 + repeat):
        cycle = poll_and_map(src.poll, store, state, mapper, now=1000.0 + i, timer=time.process_time)
        state.devices = cycle.devices
        result = cycle.result
        if i >= 2:
            poll_s += cycle.poll_seconds
            map_s += cycle.map_seconds
    state.frames, state.stats.up, state.stats.polls = result.frames, True, 1
    series = frame_count(result.frames)
    renderer = Renderer(load_schema(default_mappings_dir() / "canonical.yaml"))
    # the daemon's render (text), then what a scrape may ask for later: OpenMetrics, the gzips
    t = dict.fromkeys(("render_total", "openmetrics", "gzip"), 0.0)
    renderer.render(store)  # warm the line caches, as every cycle after the first finds them
    for _ in range(repeat):
        c0 = time.process_time()
        rendered = renderer.render(store)
        c1 = time.process_time()
        om = rendered.openmetrics
        c2 = time.process_time()
        gzip.compress(rendered.text, 1)
        gzip.compress(om, 1)
        c3 = time.process_time()
        for k, v in zip(t, (c1 - c0, c2 - c1, c3 - c2), strict=True):
            t[k] += v
    src.close()
    out = {"devices": devices, "series": series,
           "sim_poll_ms": poll_s / repeat * 1000, "map_ms": map_s / repeat * 1000}
    out.update({f"{k}_ms": v / repeat * 1000 for k, v in t.items()})
    out["render_us_per_series"] = out["render_total_ms"] / max(series, 1) * 1000
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, nargs="+", default=[8, 64, 256])
    ap.add_argument("--idle", type=float, default=10.0)
    ap.add_argument("--load", type=float, default=3.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = [run_one(n, Path(tmp), args.idle, args.load) for n in args.devices]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
