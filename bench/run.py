"""`make bench`: every benchmark, one table with ratios and budgets, JSON in bench/results/.

    python bench/run.py            full run (~4 minutes on a 2-core machine)
    python bench/run.py --quick    one small size, ~1 s windows: checks the bench still runs
    python bench/run.py --out FILE write the JSON there instead of bench/results/<timestamp>.json

Sections (see each module's docstring for the method):
  simulated   bench/simulated.py          simulated node at 8/64/256 devices: scrape latency,
                                          exposition size, CPU per poll cycle, render, RSS
  fast        bench/simulated.py          fast sampling + indicators at 100 ms, 8 GPUs (daemon)
  peer        bench/node_exporter_peer.py same amdgpu sysfs tree (8/32/128 cards, real gpu_metrics
                                          tables) vs node_exporter; issue 17's table
  floor       bench/floor.py              reading the same sysfs files in a tight loop
  nvml        bench/nvml_fake.py          NvmlSource over the pynvml fake, per GPU
  fdinfo      bench/bench_fdinfo.py       DRM fdinfo source over 100,000 fds in 1,000 processes at
                                          1 poll/s: busy, a 200,000-fd flood, a BMC-only card (subprocess)
  busy        bench/busy_node.py          daemon, fdinfo on, empty vs busy procfs (8/32 cards, BMC
                                          only) vs node_exporter on the same tree; issue 35's table
  indicators  bench/bench_indicators.py   indicator engine at 100 ms for 8 GPUs (subprocess)
  otlp        bench/bench_otlp.py         OTLP push on vs off, 32 simulated cards, 15 s interval
Numbers are process CPU (utime + stime), not wall time, unless a column says ms latency.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import bench_otlp, busy_node, floor, node_exporter_peer, nvml_fake, simulated  # noqa: E402
from bench.common import REPO, loadavg  # noqa: E402
from bench.sysfs_tree import DUMPS, build_tree  # noqa: E402

RESULTS = REPO / "bench" / "results"
MB = 1e6

FULL = {"sim_sizes": [8, 64, 256], "sim_idle": 10.0, "sim_load": 3.0, "sim_settle": 5.0,
        "clients": [1, 50], "fast_seconds": 20.0, "peer_sizes": [8, 32, 128], "peer_load": 3.0,
        "peer_idle": 20.0, "peer_paced": 60.0, "floor_seconds": 1.0, "nvml_polls": 200,
        "fdinfo_args": [], "indicators_args": [], "settle": 3.0, "otlp_devices": 32, "otlp_seconds": 120.0,
        "otlp_warm_pushes": 2, "busy_sizes": [8, 32], "busy_fds": 100000, "busy_procs": 1000,
        "busy_seconds": 60.0, "busy_settle": 15.0}
QUICK = {"sim_sizes": [8], "sim_idle": 1.0, "sim_load": 0.3, "sim_settle": 1.0,
         "clients": [1, 5], "fast_seconds": 1.0, "peer_sizes": [8], "peer_load": 0.3,
         "peer_idle": 1.0, "peer_paced": 2.0, "floor_seconds": 0.2, "nvml_polls": 10,
         "fdinfo_args": ["--fds", "200", "--procs", "20", "--drm", "4", "--polls", "3", "--flood", "300"],
         "indicators_args": ["--seconds", "2"], "settle": 0.5, "otlp_devices": 8, "otlp_seconds": 2.0,
         "otlp_warm_pushes": 1, "busy_sizes": [8], "busy_fds": 500, "busy_procs": 20, "busy_seconds": 2.0,
         "busy_settle": 0.5}

# budgets: (section, description, target)
BUDGETS = {
    "issue2_scrape64_p99_ms": "scrape of 64 simulated devices, p99 at 1 client < 2 ms",
    "issue6_fast_indicators_percent": "fast sampling + indicators, 8 GPUs at 100 ms < 5 % of one core",
    "issue6_engine_percent": "indicator engine alone (bench_indicators.py), 8 GPUs at 100 ms < 5 %",
    "issue10_p99_vs_node": "scrape p99 <= node_exporter's (every size, 1 and 50 clients)",
    "issue10_cpu_vs_node": "CPU per 100 scrapes at 1 Hz <= 1.5x node_exporter's",
    "issue10_rss_mb": "RSS <= 60 MB",
    "issue10_cycle_vs_floor": "per-cycle CPU <= 3x the floor (reading the same files)",
    "issue17_cpu_vs_node": "CPU at 1 scrape/s, defaults (indicators on) <= 1.0x node_exporter (8/32/128 cards)",
    "issue17_cycle_vs_floor": "full poll + map CPU per cycle <= 5x the floor (open/read/close of the same files)",
    "issue17_rss32_mb": "RSS <= 50 MB at 32 cards",
    "issue17_rss_mb_per_card": "RSS grows <= 0.1 MB per card",
    "issue17_spawn_s": "spawn to first successful scrape <= 0.5 s",
    "issue17_p99_vs_node": "scrape p99 <= 0.2x node_exporter's (sequential and 50 clients)",
    "issue30_otlp_cpu_ratio": "CPU with the OTLP push on / off, 32 cards, 15 s interval <= 1.10",
    "issue35_fdinfo_percent": "fdinfo source at 100,000 fds, 1 poll/s <= 2 % of one core",
    "issue35_cpu_vs_node": "daemon with fdinfo, 1 scrape/s <= 1.0x node_exporter (8/32 cards, empty and busy procfs)",
    "issue35_bmc_points": "BMC-only server: busy procfs within 0.5 points (% of a core) of an empty one",
}


def compile_bytecode() -> None:
    """Bytecode first, whichever way the bench is started (``make bench`` or ``bench/run.py --only
    peer``): an installed wheel and the image carry it (compileall in the Dockerfile), while a
    checkout run with PYTHONDONTWRITEBYTECODE=1 would compile every module of the exporter at each
    start (~0.2-0.4 s of the spawn-to-first-scrape time measured here, none of a real install's)."""
    import compileall

    compileall.compile_dir(str(REPO / "exporter"), quiet=2)


def _section(results: dict, name: str, fn, *args, **kwargs) -> None:
    t0 = time.monotonic()
    print(f"[bench] {name} ...", file=sys.stderr, flush=True)
    try:
        results[name] = fn(*args, **kwargs)
    except Exception as exc:  # one broken benchmark must not hide the others
        results[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    print(f"[bench] {name} done in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)


def _script(path: str, args: list[str]) -> dict:
    proc = subprocess.run([sys.executable, str(REPO / "bench" / path), *args], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"{path} exited {proc.returncode}: {proc.stderr[-1500:]}")
    return {"output": proc.stdout.strip()}


def fdinfo(args: list[str]) -> dict:
    """The ``busy`` case's numbers at the top (the smoke test reads them), every case under ``cases``."""
    out = _script("bench_fdinfo.py", [*args, "--json"])
    cases = {row["case"]: row for row in map(json.loads, out.pop("output").splitlines())}
    return {**cases["busy"], "cases": cases}


def indicators(args: list[str]) -> dict:
    out = _script("bench_indicators.py", args)
    text = out["output"]
    m = re.search(r"indicators: (\d+) GPUs every (\d+) ms, (\d+) series", text)
    if m:
        out.update(gpus=int(m[1]), interval_ms=int(m[2]), series=int(m[3]))
    m = re.search(r"update\(\): (\d+) us per call \((\d+) us per GPU\)", text)
    if m:
        out.update(update_us=int(m[1]), update_us_per_gpu=int(m[2]))
    m = re.search(r"CPU: ([\d.]+) % of one core", text)
    if m:
        out["cpu_percent"] = float(m[1])
    return out


def busy_all(tmp: Path, cfg: dict) -> dict:
    if not DUMPS.is_dir():
        return {"skipped": f"real amdgpu dumps not found at {DUMPS}"}
    trees = {n: build_tree(tmp / f"busy-sys{n}", n) for n in cfg["busy_sizes"]}
    return busy_node.run(tmp, trees, cfg["busy_fds"], cfg["busy_procs"], cfg["busy_seconds"], cfg["busy_settle"])


def simulated_all(tmp: Path, cfg: dict) -> dict:
    sizes = []
    for n in cfg["sim_sizes"]:
        row = simulated.run_one(n, tmp, cfg["sim_idle"], cfg["sim_load"], tuple(cfg["clients"]),
                                cfg["sim_settle"])
        row["render_breakdown"] = simulated.render_breakdown(n, tmp, repeat=2 if n > 64 else 5)
        sizes.append(row)
    return {"sizes": sizes}


def peer_and_floor(tmp: Path, cfg: dict, results: dict) -> None:
    if not DUMPS.is_dir():
        reason = f"real amdgpu dumps not found at {DUMPS}"
        results["peer"] = {"skipped": reason}
        results["floor"] = {"skipped": reason}
        return
    trees = {n: build_tree(tmp / f"sys{n}", n) for n in cfg["peer_sizes"]}
    _section(results, "peer", node_exporter_peer.run, tmp, trees, cfg["peer_load"], cfg["peer_idle"],
             cfg["peer_paced"], tuple(cfg["clients"]), cfg["settle"])
    _section(results, "floor", lambda: {"sizes": {n: floor.run(t, cfg["floor_seconds"])
                                                  for n, t in trees.items()}})


# ------------------------------------------------------------------------------------ budgets
def budgets(r: dict) -> dict:
    out: dict[str, dict] = {}

    def put(key: str, value, target, ok: bool | None) -> None:
        out[key] = {"what": BUDGETS[key], "value": value, "target": target,
                    "status": "n/a" if ok is None else ("PASS" if ok else "FAIL")}

    sim = {row["devices"]: row for row in r.get("simulated", {}).get("sizes", [])}
    if 64 in sim:
        p99 = sim[64]["load"]["c1"]["p99_ms"]
        put("issue2_scrape64_p99_ms", round(p99, 3), 2.0, p99 < 2.0)
    else:
        put("issue2_scrape64_p99_ms", None, 2.0, None)
    fast = r.get("fast", {})
    v = fast.get("fast_sampling_indicators_percent")
    put("issue6_fast_indicators_percent", None if v is None else round(v, 2), 5.0,
        None if v is None else v < 5.0)
    v = r.get("indicators", {}).get("cpu_percent")
    put("issue6_engine_percent", v, 5.0, None if v is None else v < 5.0)
    sizes = r.get("peer", {}).get("sizes", {})
    if sizes:
        # a ratio is None when node_exporter measured 0 in a too-short (--quick) window
        p99 = {n: max((v for k, v in s["ratios"].items() if k.startswith("p99_") and v is not None),
                      default=None) for n, s in sizes.items()}
        p99 = {n: v for n, v in p99.items() if v is not None}
        cpu = {n: s["ratios"]["cpu"] for n, s in sizes.items() if s["ratios"]["cpu"] is not None}
        rss = {n: s["rss_bytes"]["ours"] / MB for n, s in sizes.items()}
        put("issue10_p99_vs_node", {n: round(x, 3) for n, x in p99.items()}, 1.0,
            all(x <= 1.0 for x in p99.values()) if p99 else None)
        put("issue10_cpu_vs_node", {n: round(x, 2) for n, x in cpu.items()}, 1.5,
            all(x <= 1.5 for x in cpu.values()) if cpu else None)
        put("issue10_rss_mb", {n: round(x, 1) for n, x in rss.items()}, 60, all(x <= 60 for x in rss.values()))
        fl = r.get("floor", {}).get("sizes", {})
        if fl:
            mult = {n: sizes[n]["idle_cpu_s_per_s"]["ours"] / fl[n]["floor_cpu_s_per_cycle"]
                    for n in sizes if n in fl and fl[n]["floor_cpu_s_per_cycle"]}
            put("issue10_cycle_vs_floor", {n: round(x, 1) for n, x in mult.items()}, 3.0,
                all(x <= 3.0 for x in mult.values()))
    if sizes:
        put("issue17_cpu_vs_node", {n: round(x, 2) for n, x in cpu.items()}, 1.0,
            all(x <= 1.0 for x in cpu.values()) if cpu else None)
        put("issue17_p99_vs_node", {n: round(x, 3) for n, x in p99.items()}, 0.2,
            all(x <= 0.2 for x in p99.values()) if p99 else None)
        spawn = {n: s["spawn_to_first_200_s"]["ours"] for n, s in sizes.items() if "spawn_to_first_200_s" in s}
        put("issue17_spawn_s", {n: round(x, 2) for n, x in spawn.items()}, 0.5,
            all(x <= 0.5 for x in spawn.values()) if spawn else None)
        rss32 = rss.get(32, rss.get("32"))
        put("issue17_rss32_mb", None if rss32 is None else round(rss32, 1), 50,
            None if rss32 is None else rss32 <= 50)
        slope = _per_card(rss)
        put("issue17_rss_mb_per_card", None if slope is None else round(slope, 3), 0.1,
            None if slope is None else slope <= 0.1)
        fl = r.get("floor", {}).get("sizes", {})
        mult = {n: f["source_poll_map_x_floor"] for n, f in fl.items()}
        put("issue17_cycle_vs_floor", {n: round(x, 1) for n, x in mult.items()}, 5.0,
            all(x <= 5.0 for x in mult.values()) if mult else None)
    fd = r.get("fdinfo", {})
    if "cpu_percent" in fd:
        put("issue35_fdinfo_percent", round(fd["cpu_percent"], 2), 2.0, fd["cpu_percent"] <= 2.0)
    busy = r.get("busy", {}).get("cases", {})
    ratios = {f"{k} {e}": c[f"ratio_{e}"] for k, c in busy.items() if k != "bmc only"
              for e in ("empty", "busy", "busy_list") if c.get(f"ratio_{e}") is not None}
    if ratios:
        put("issue35_cpu_vs_node", {k: round(v, 2) for k, v in ratios.items()}, 1.0,
            all(v <= 1.0 for v in ratios.values()))
    if "bmc only" in busy:
        pts = busy["bmc only"]["busy_minus_empty_points"]
        put("issue35_bmc_points", round(pts, 2), 0.5, pts <= 0.5)
    ot = r.get("otlp", {})
    if ot.get("ratio") is not None and ot.get("devices") == 32:
        put("issue30_otlp_cpu_ratio", round(ot["ratio"], 3), 1.10, ot["ratio"] <= 1.10)
    for key in BUDGETS:
        if key not in out:
            put(key, None, None, None)
    return out


def _per_card(by_size: dict) -> float | None:
    """Slope between the smallest and the largest size (the per-card part, without fixed costs)."""
    pts = sorted((int(n), v) for n, v in by_size.items() if v is not None)
    if len(pts) < 2 or pts[-1][0] == pts[0][0]:
        return None
    return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])


def issue17_table(r: dict) -> str | None:
    """Issue 17's table: ours vs node_exporter per size, as ratios; per-card cost; C-floor ratio."""
    sizes = r.get("peer", {}).get("sizes", {})
    if not sizes:
        return None
    fl = r.get("floor", {}).get("sizes", {})
    cols = list(sizes)
    rows = []

    def row(name, fn, target=""):
        vals = []
        for n in cols:
            try:
                vals.append(fn(sizes[n], fl.get(n, {}), int(n)))
            except (KeyError, TypeError, ZeroDivisionError):
                vals.append("-")
        rows.append([name, *vals, target])

    row("CPU, ours / node_exporter", lambda s, f, n: f"{_f(s['ratios']['cpu'])}x", "<= 1.0x")
    row("CPU, lean / node_exporter", lambda s, f, n: f"{_f(s['ratios']['cpu_lean'])}x", "")
    row("CPU s/100 scrapes ours (node)", lambda s, f, n:
        f"{_f(s['cpu_s_per_100_scrapes']['ours'])} ({_f(s['cpu_s_per_100_scrapes']['node'])})", "")
    row("ms/s per card, ours (node)", lambda s, f, n:
        f"{_f(s['paced']['ours']['cpu_s'] / s['paced']['ours']['seconds'] * 1000 / n)} "
        f"({_f(s['paced']['node']['cpu_s'] / s['paced']['node']['seconds'] * 1000 / n)})", "")
    row("ms/s per card idle, ours", lambda s, f, n: _f(s["idle_cpu_s_per_s"]["ours"] * 1000 / n), "")
    row("RSS MB, ours (node)", lambda s, f, n:
        f"{_f(s['rss_bytes']['ours'] / MB, '.1f')} ({_f(s['rss_bytes']['node'] / MB, '.1f')})", "50 @32")
    row("scrape p99 c1, ours / node", lambda s, f, n: f"{_f(s['ratios']['p99_c1'], '.3f')}x", "<= 0.2x")
    c_hi = max(int(k.split("_c")[1]) for k in next(iter(sizes.values()))["load"])
    row(f"scrape p99 c{c_hi}, ours / node", lambda s, f, n: f"{_f(s['ratios'][f'p99_c{c_hi}'], '.3f')}x",
        "<= 0.2x")
    row("spawn to first 200 s, ours (node)", lambda s, f, n:
        f"{_f(s['spawn_to_first_200_s']['ours'])} ({_f(s['spawn_to_first_200_s']['node'])})", "<= 0.5")
    row("full poll+map / C floor", lambda s, f, n: f"{_f(f['source_poll_map_x_floor'], '.1f')}x", "<= 5x")
    row("full poll+map ms/cycle (floor)", lambda s, f, n:
        f"{_f(f['source_poll_map_s'] * 1000, '.1f')} ({_f(f['floor_cpu_s_per_cycle'] * 1000, '.1f')})", "")
    out = _table("issue 17: same amdgpu tree with real gpu_metrics tables, ours (defaults, indicators on) "
                 "vs node_exporter, one scrape per second", ["", *[f"{n} cards" for n in cols], "target"], rows)
    paced = {n: s["paced"]["ours"]["cpu_s"] / s["paced"]["ours"]["seconds"] for n, s in sizes.items()}
    node_paced = {n: s["paced"]["node"]["cpu_s"] / s["paced"]["node"]["seconds"] for n, s in sizes.items()}
    rss = {n: s["rss_bytes"]["ours"] / MB for n, s in sizes.items()}
    per_card, node_card, rss_card = _per_card(paced), _per_card(node_paced), _per_card(rss)
    stages = [st for st in ("poll", "map", "fast_poll", "fast_map", "indicators", "render", "event_loop", "other",
                                "total")
              if any(st in s.get("stages_ms_per_s", {}) for s in sizes.values())]
    if stages:
        srows = [[st, *[_f(sizes[n].get("stages_ms_per_s", {}).get(st), ".1f") for n in cols]] for st in stages]
        out += "\n" + _table("where ours' CPU goes in the same window, ms per second (its stage_cpu_seconds_total "
                             "self-metrics; event_loop = asyncio and HTTP, other = helper threads and hand-offs)",
                             ["stage", *[f"{n} cards" for n in cols]], srows)
    if per_card is not None:
        out += (f"\nper card per second of sampling (slope smallest->largest size, full poll 1 s + fast polls (default 500 ms) + "
                f"indicators + 1 scrape/s): ours {per_card * 1000:.2f} ms/s, node_exporter "
                f"{_f(None if node_card is None else node_card * 1000)} ms/s; RSS {_f(rss_card, '.3f')} MB/card")
    return out


# ------------------------------------------------------------------------------------ table
def _div(a: float, b: float) -> float | None:
    """a / b, or None ("-" in a table) when b measured 0 (a --quick window below the CPU clock's tick)."""
    return a / b if b else None


def _f(x, spec: str = ".2f") -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and x != x:
        return "nan"
    return format(x, spec)


def _table(title: str, header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
    line = "  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))
    out = [f"\n== {title}", line, "-" * len(line)]
    out += ["  ".join(str(c).rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(out)


def _problem(section: dict) -> str | None:
    if "error" in section:
        return f"ERROR {section['error']}"
    if "skipped" in section:
        return f"skipped: {section['skipped']}"
    return None


def render_table(r: dict) -> str:
    parts = []
    sim = r.get("simulated", {})
    if _problem(sim):
        parts.append(f"\n== simulated node: {_problem(sim)}")
    elif sim.get("sizes"):
        rows = []
        first = sim["sizes"][0]
        base_dev = first["devices"]
        base_cpu = first["cpu_s_per_cycle"] / base_dev
        base_bytes = first["exposition_bytes"] / base_dev
        base_render = first["render_breakdown"]["render_total_ms"] / base_dev
        for s in sim["sizes"]:
            n, rb, lo = s["devices"], s["render_breakdown"], s["load"]
            c_hi = max(int(k[1:].split("_")[0]) for k in lo)
            rows.append([
                n, s["series"], f"{s['exposition_bytes'] / 1024:.0f}K/{s['exposition_gzip_bytes'] / 1024:.0f}K",
                _f(s["cpu_s_per_cycle"] * 1000, ".1f"), _f(s["cpu_s_per_cycle"] / n * 1000, ".2f"),
                _f(_div(s["cpu_s_per_cycle"] / n, base_cpu)), _f(rb["render_total_ms"], ".1f"),
                _f(_div(rb["render_total_ms"] / n, base_render)),
                _f(_div(s["exposition_bytes"] / n, base_bytes)),
                f"{_f(lo['c1']['p50_ms'], '.2f')}/{_f(lo['c1']['p99_ms'], '.2f')}",
                f"{_f(lo['c1_gzip']['p50_ms'], '.2f')}/{_f(lo['c1_gzip']['p99_ms'], '.2f')}",
                f"{_f(lo[f'c{c_hi}']['p50_ms'], '.1f')}/{_f(lo[f'c{c_hi}']['p99_ms'], '.1f')}",
                f"{_f(lo[f'c{c_hi}_gzip']['p50_ms'], '.1f')}/{_f(lo[f'c{c_hi}_gzip']['p99_ms'], '.1f')}",
                _f(lo["c1"]["server_cpu_ms_per_scrape"], ".3f"), _f(s["rss_bytes"] / MB, ".0f"),
            ])
        c_hi = max(int(k[1:].split("_")[0]) for k in first["load"])
        parts.append(_table(
            "simulated node (poll 1 s, defaults): per-device ratios are relative to the first row (1.00 = linear)",
            ["devices", "series", "bytes/gz", "cpu ms/cycle", "ms/dev", "x/dev", "render ms", "x/dev",
             "bytes x/dev", "c1 p50/p99", "c1gz p50/p99", f"c{c_hi} p50/p99", f"c{c_hi}gz p50/p99",
             "srv cpu ms/scrape", "RSS MB"], rows))
        rows = []
        for s in sim["sizes"]:
            rb = s["render_breakdown"]
            rows.append([s["devices"], rb["series"], _f(rb["sim_poll_ms"], ".1f"), _f(rb["map_ms"], ".1f"),
                         _f(rb["render_total_ms"], ".1f"), _f(rb["openmetrics_ms"], ".1f"), _f(rb["gzip_ms"], ".1f"),
                         _f(rb["render_us_per_series"], ".1f"),
                         _f(s["render_ms"], ".1f"), _f(s["poll_ms"], ".1f")])
        parts.append(_table(
            "one cycle in-process, CPU ms by stage (no indicators); last two: the daemon's own self-metrics (wall)",
            ["devices", "series", "sim poll", "map", "render", "openmetrics", "gzip x2",
             "us/series", "render_duration", "poll_duration"], rows))
    fast = r.get("fast", {})
    if fast:
        if _problem(fast):
            parts.append(f"\n== fast sampling: {_problem(fast)}")
        else:
            parts.append(_table(
                "fast sampling + indicators (daemon, simulated GPUs): CPU % of one core",
                ["devices", "fast interval", "fast+indicators on", "base (1 s, indicators off)", "difference"],
                [[fast["devices"], fast["fast_interval"], _f(fast["fast_percent"]), _f(fast["base_percent"]),
                  _f(fast["fast_sampling_indicators_percent"])]]))
    peer = r.get("peer", {})
    if _problem(peer):
        parts.append(f"\n== node_exporter side by side: {_problem(peer)}")
    elif peer.get("sizes"):
        rows = []
        for n, s in peer["sizes"].items():
            lo, cpu100, rss, ratios = s["load"], s["cpu_s_per_100_scrapes"], s["rss_bytes"], s["ratios"]
            for c in sorted({int(k.split("_c")[1]) for k in lo}):
                rows.append([n, f"latency c{c}", f"{_f(lo[f'ours_c{c}']['p50_ms'])}/{_f(lo[f'ours_c{c}']['p99_ms'])} ms",
                             "", f"{_f(lo[f'node_c{c}']['p50_ms'])}/{_f(lo[f'node_c{c}']['p99_ms'])} ms",
                             _f(ratios[f"p99_c{c}"], ".3f"), "<= 1.0"])
            rows.append([n, "CPU s/100 scrapes @1Hz", _f(cpu100["ours"]), _f(cpu100["ours_lean"]),
                         _f(cpu100["node"]), f"{_f(ratios['cpu'])} (lean {_f(ratios['cpu_lean'])})", "<= 1.5"])
            idle = s["idle_cpu_s_per_s"]
            rows.append([n, "CPU % idle (no scrapes)", _f(idle["ours"] * 100), _f(idle["ours_lean"] * 100),
                         _f(idle["node"] * 100), "", ""])
            rows.append([n, "RSS MB", _f(rss["ours"] / MB, ".1f"), _f(rss["ours_lean"] / MB, ".1f"),
                         _f(rss["node"] / MB, ".1f"), _f(ratios["rss"]), "ours <= 60"])
            mem = s.get("memory", {})
            if all("uss_bytes" in mem.get(k, {}) for k in ("ours", "ours_lean", "node")):
                rows.append([n, "private (USS) MB", *(_f(mem[k]["uss_bytes"] / MB, ".1f")
                                                      for k in ("ours", "ours_lean", "node")),
                             _f(mem["ours"]["uss_bytes"] / mem["node"]["uss_bytes"]), ""])
            se = s["series"]
            rows.append([n, "series (gpu_ / node_drm+hwmon)", se["ours"], se["ours_lean"], se["node"],
                         "", f"node drm cards: {s['drm_cards_node']}"])
        parts.append(_table(
            f"same amdgpu sysfs tree vs {peer.get('node_exporter_version', 'node_exporter')} "
            "(latency p50/p99; lean = indicators off)",
            ["cards", "measure", "ours", "ours lean", "node_exporter", "ratio ours/node", "target"], rows))
    fl = r.get("floor", {})
    if _problem(fl):
        parts.append(f"\n== floor: {_problem(fl)}")
    elif fl.get("sizes"):
        rows = []
        for n, f in fl["sizes"].items():
            daemon = peer.get("sizes", {}).get(n, {}).get("idle_cpu_s_per_s", {})
            d_ours, d_lean = daemon.get("ours"), daemon.get("ours_lean")
            fc = f["floor_cpu_s_per_cycle"]
            rows.append([n, f["files_per_cycle"], _f(fc * 1000, ".2f"), _f(f["source_poll_s"] * 1000, ".2f"),
                         _f(f["source_poll_map_s"] * 1000, ".2f"), _f(f["source_poll_map_x_floor"], ".1f"),
                         _f(None if d_ours is None else d_ours * 1000, ".1f"),
                         _f(None if d_ours is None else d_ours / fc, ".1f"),
                         _f(None if d_lean is None else d_lean / fc, ".1f"), "<= 3"])
        parts.append(_table(
            "the floor: read the same sysfs files in a tight loop (CPU ms per cycle)",
            ["cards", "files", "floor", "poll()", "poll+map", "x floor", "daemon ms/cycle", "daemon x floor",
             "lean x floor", "target"], rows))
    nv = r.get("nvml", {})
    if nv:
        if _problem(nv):
            parts.append(f"\n== NVML fake: {_problem(nv)}")
        else:
            parts.append(_table(
                "NVML fake (H100), CPU ms per GPU per poll",
                ["gpus", "series", "nvml calls/gpu", "poll", "map", "total", "inside fake", "ours (total - fake)"],
                [[nv["gpus"], nv["series_per_poll"], _f(nv["nvml_calls_per_gpu_poll"], ".1f"),
                  _f(nv["poll_ms_per_gpu"], ".3f"), _f(nv["map_ms_per_gpu"], ".3f"),
                  _f(nv["total_ms_per_gpu"], ".3f"), _f(nv["inside_fake_ms_per_gpu"], ".3f"),
                  _f(nv["ours_ms_per_gpu"], ".3f")]]))
    rows = []
    fd = r.get("fdinfo", {})
    if _problem(fd):
        rows.append(["fdinfo", _problem(fd), "", ""])
    elif fd:
        for name, c in fd.get("cases", {"busy": fd}).items():
            rows.append([f"fdinfo {name}", f"{c.get('fds')} fds, {c.get('processes')} procs, "
                         f"{c.get('drm_clients')} DRM clients" + (f", +{c['flood_fds']} fds flood" if c.get("flood_fds")
                                                                  else ""),
                         f"CPU {_f(c.get('cpu_percent'))} % of a core at 1 poll/s; median {_f(c.get('median_ms'), '.1f')}"
                         f" ms, max {_f(c.get('max_ms'), '.1f')} ms (wall); "
                         + (f"partial polls {c.get('partial_polls')}, over budget {c.get('budget_exceeded_polls')}, "
                            f"counted {c.get('clients_counted')}, RSS +{_f(c.get('rss_growth_bytes', 0) / MB, '.1f')} MB"
                            if c.get("scanning") else f"not scanning: {c.get('reason', '')[:60]}"),
                         "<= 2 %" if name == "busy" else ""])
    ind = r.get("indicators", {})
    if _problem(ind):
        rows.append(["indicators", _problem(ind), "", ""])
    elif ind:
        rows.append(["indicator engine", f"{ind.get('gpus')} GPUs every {ind.get('interval_ms')} ms, "
                     f"{ind.get('series')} series", f"{ind.get('update_us')} us/update, "
                     f"{_f(ind.get('cpu_percent'))} % of one core", "< 5 %"])
    ot = r.get("otlp", {})
    if _problem(ot):
        rows.append(["otlp push", _problem(ot), "", ""])
    elif ot:
        st = ot["stages"]
        rows.append(["otlp push", f"{ot['devices']} cards, interval {ot['interval']}, {ot['pushes']} pushes "
                     f"in {ot['seconds']:.0f} s, {st['points']} points",
                     f"CPU on {_f(ot['cpu_on_percent'])} % / off {_f(ot['cpu_off_percent'])} %, crossover ratio "
                     f"{_f(ot['ratio'], '.3f')}x (from the push thread's own CPU: {_f(ot['modelled_ratio'], '.3f')}x); "
                     f"per push {_f(st['push_thread_ms'], '.1f')} ms in its thread (convert "
                     f"{_f(st['convert_ms'], '.1f')}, encode {_f(st['encode_ms'], '.1f')}, gzip "
                     f"{_f(st['gzip_ms'], '.1f')}; SDK encoder would be {_f(st['sdk_encoder_ms'], '.1f')})",
                     "<= 1.10x"])
    if rows:
        parts.append(_table("other", ["benchmark", "setup", "result", "budget"], rows))
    busy = r.get("busy", {})
    if _problem(busy):
        parts.append(f"\n== busy node: {_problem(busy)}")
    elif busy.get("cases"):
        rows = [[k, *(_f(c["cpu_percent"].get(e)) for e in ("empty", "busy", "busy_list", "node")),
                 f"{_f(c['ratio_empty'])}x / {_f(c['ratio_busy'])}x / {_f(c.get('ratio_busy_list'))}x",
                 _f(c["busy_minus_empty_points"]),
                 " / ".join(_f(c["rss_bytes"][e] / MB, ".1f") for e in ("empty", "busy", "node"))]
                for k, c in busy["cases"].items()]
        parts.append(_table(
            f"issue 35: daemon with the fdinfo client count (default), empty vs busy procfs ({busy['fds']} fds in "
            f"{busy['processes']} processes), 1 scrape/s over {busy['seconds']:.0f} s, vs node_exporter (drm+hwmon)",
            ["sysfs", "ours empty %", "ours busy %", "ours busy, debugfs list %", "node %",
             "ratio empty / busy / busy+list", "busy - empty pts",
             "RSS MB empty / busy / node"], rows))
    t17 = issue17_table(r)
    if t17:
        parts.append(t17)
    b = r.get("budgets", {})
    if b:
        parts.append(_table("budgets", ["status", "budget", "value"],
                            [[v["status"], v["what"], json.dumps(v["value"])] for v in b.values()]))
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes and windows (smoke test)")
    ap.add_argument("--out", type=Path, help="JSON path (default bench/results/<timestamp>.json)")
    ap.add_argument("--only", nargs="+", choices=["simulated", "fast", "peer", "nvml", "fdinfo", "indicators", "otlp",
                                                  "busy"],
                    help="run only these sections (peer includes the floor)")
    args = ap.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL)
    want = set(args.only or ["simulated", "fast", "peer", "nvml", "fdinfo", "indicators", "otlp", "busy"])
    started = time.time()
    results: dict = {"meta": {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)), "quick": args.quick,
        "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
        "kernel": platform.release(), "loadavg_start": loadavg(), "config": cfg}}
    if results["meta"]["loadavg_start"][0] > 0.5 * (os.cpu_count() or 1):
        print(f"[bench] warning: load average {results['meta']['loadavg_start'][0]:.1f} on "
              f"{os.cpu_count()} CPUs: other work is running, latency numbers will be noisy",
              file=sys.stderr, flush=True)
    compile_bytecode()
    with tempfile.TemporaryDirectory(prefix="ugx-bench-") as d:
        tmp = Path(d)
        if "simulated" in want:
            _section(results, "simulated", simulated_all, tmp, cfg)
        if "fast" in want:
            _section(results, "fast", simulated.fast_sampling, tmp, 8, cfg["fast_seconds"], "100ms", cfg["settle"])
        if "peer" in want:
            peer_and_floor(tmp, cfg, results)
        if "nvml" in want:
            _section(results, "nvml", nvml_fake.run, 8, cfg["nvml_polls"])
        if "fdinfo" in want:
            _section(results, "fdinfo", fdinfo, cfg["fdinfo_args"])
        if "indicators" in want:
            _section(results, "indicators", indicators, cfg["indicators_args"])
        if "busy" in want:
            _section(results, "busy", busy_all, tmp, cfg)
        if "otlp" in want:
            _section(results, "otlp", bench_otlp.run, tmp, cfg["otlp_devices"], cfg["otlp_seconds"], "15s",
                     cfg["settle"], cfg["otlp_warm_pushes"])
    results["budgets"] = budgets(results)
    results["meta"]["seconds"] = round(time.time() - started, 1)
    results["meta"]["loadavg_end"] = loadavg()
    out = args.out or RESULTS / (time.strftime("%Y%m%dT%H%M%S", time.localtime(started)) + ".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str))
    print(render_table(results))
    la0, la1 = results["meta"]["loadavg_start"], results["meta"]["loadavg_end"]
    print(f"\n{results['meta']['seconds']:.0f} s on {os.cpu_count()} CPUs, load average {la0[0]:.2f} at start, "
          f"{la1[0]:.2f} at end (the bench itself adds ~1); results saved to {out}")
    failed = [k for k in ("simulated", "fast", "peer", "floor", "nvml", "fdinfo", "indicators", "otlp", "busy")
              if isinstance(results.get(k), dict) and "error" in results[k]]
    if failed:
        print(f"benchmarks that failed to run: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
