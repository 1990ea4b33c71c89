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
from bench.common import (  # noqa: E402
    REPO, Proc, exporter_cmd, free_port, idle_cpu, metric_value, scrape_load)

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


def start(devices: int, tmp: Path, interval: str = "1s") -> Proc:
    scenario = write_scenario(tmp, devices)
    port = free_port()
    proc = Proc(f"sim{devices}", [*exporter_cmd(), "--web.listen-address", f"127.0.0.1:{port}",
                                  "--simulate", str(scenario), "--poll.interval", interval,
                                  "--state.dir", str(tmp / f"state{devices}"), "--log.level", "warn"],
                port)
    return proc.start(tmp)


def run_one(devices: int, tmp: Path, idle_s: float, load_s: float,
            clients: tuple[int, ...] = (1, 50)) -> dict:
    proc = start(devices, tmp)
    try:
        ready_s = proc.wait_ready()
        time.sleep(2.5)  # let rates (second poll) and the first renders settle
        body = proc.get()
        gz = proc.get(gzip_ok=True)
        series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
        gpu_series = sum(1 for line in body.splitlines() if line.startswith(b"gpu_"))
        # CPU per poll cycle: nobody scrapes; each cycle = poll + map + render (text, OM, 2x gzip)
        cpu = idle_cpu(proc, idle_s)
        cycles = idle_s / 1.0
        after = proc.get()
        render_s = metric_value(after, "unified_gpu_exporter_render_duration_seconds")
        poll_s = metric_value(after, "unified_gpu_exporter_source_poll_duration_seconds")
        loads = {}
        for c in clients:
            for gz_ok in (False, True):
                r = scrape_load(proc, c, load_s, gzip_ok=gz_ok)
                loads[f"c{c}{'_gzip' if gz_ok else ''}"] = r.as_dict()
        rss = proc.rss()
        return {
            "devices": devices, "ready_s": round(ready_s, 2), "series": series,
            "gpu_series": gpu_series, "exposition_bytes": len(body), "exposition_gzip_bytes": len(gz),
            "idle_seconds": idle_s, "cpu_s_per_cycle": cpu / cycles,
            "cpu_ms_per_cycle_per_device": cpu / cycles / devices * 1000,
            "render_ms": None if render_s is None else render_s * 1000,
            "poll_ms": None if poll_s is None else poll_s * 1000,
            "rss_bytes": rss, "load": loads,
        }
    finally:
        proc.stop()


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
