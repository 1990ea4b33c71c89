"""Side by side with node_exporter on the same fake amdgpu sysfs tree (8, 32 and 128 cards, each
card with a real v1_3 ``gpu_metrics`` table).

Per tree three servers run at once:
  ours       unified-gpu-exporter --collector.amdgpu only, defaults otherwise (poll 1 s, fast
             sampling + contention indicators on)
  ours_lean  the same with ``indicators: {enabled: false}`` (only the data node_exporter has too)
  node       prometheus-node-exporter --collector.disable-defaults --collector.drm
             --collector.hwmon --web.max-requests=0 (no 503s at 50 clients)

Measured: scrape latency p50/p99 at 1 and 50 concurrent clients (ours and node, one server at a
time), CPU with nobody scraping (ours polls anyway, node does nothing), CPU per 100 scrapes at
1 Hz (every server scraped once a second over the same window: ours = 1 Hz poll + 1 Hz scrape,
node = 1 Hz collect-and-serve), RSS at the end.

Ours runs with ``keep_open: always``: on a real node the tree is a sysfs mount and ``auto`` keeps
the attribute files open; the bench tree is a plain directory, where ``auto`` would open every file
per read.  Spawn to first 200: each server started alone (nothing else of the bench running), the
seconds from exec to the first ``/metrics`` that answers 200.

Caveat printed with the numbers: node_exporter 1.5's drm collector globs ``card[0-9]``, so on the
32-card tree its drm series cover card0..card9 only (hwmon covers all 32); it does less work there.
"""

from __future__ import annotations

import re
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import Proc, exporter_cmd, free_port, memory, paced_scrapes, scrape_load  # noqa: E402
from bench.sysfs_tree import build_tree  # noqa: E402

NODE_EXPORTER = "prometheus-node-exporter"
OTHER_COLLECTORS = ("nvml", "dcgm", "amdsmi", "intel", "levelzero", "fdinfo", "upstream")



def _ratio(ours: float, node: float) -> float | None:
    """ours / node, or None when node_exporter measured 0 (a too-short --quick window)."""
    return ours / node if node else None

def node_exporter_binary() -> str | None:
    return shutil.which(NODE_EXPORTER)


KEEP_OPEN = "collectors:\n  amdgpu:\n    options: {keep_open: always}\n"


def ours(name: str, tree: Path, tmp: Path, lean: bool = False) -> Proc:
    port = free_port()
    cmd = [*exporter_cmd(), "--web.listen-address", f"127.0.0.1:{port}", "--path.sysfs", str(tree),
           "--poll.interval", "1s", "--state.dir", str(tmp / f"state-{name}"), "--log.level", "warn",
           *[f"--no-collector.{c}" for c in OTHER_COLLECTORS], "--collector.amdgpu"]
    conf = tmp / ("lean.yaml" if lean else "ours.yaml")
    conf.write_text(KEEP_OPEN + ("indicators:\n  enabled: false\n" if lean else ""))
    cmd += ["--config.file", str(conf)]
    return Proc(name, cmd, port)


def spawn_to_first_scrape(proc: Proc, tmp: Path, timeout: float = 30.0) -> float:
    """Seconds from exec to the first 200 on /metrics, the server started alone; stopped after."""
    t0 = time.monotonic()
    proc.start(tmp)
    try:
        proc.wait_ready(timeout, path="/metrics", step=0.01)
        return time.monotonic() - t0
    finally:
        proc.stop()


def node(name: str, tree: Path, binary: str) -> Proc:
    port = free_port()
    return Proc(name, [binary, "--collector.disable-defaults", "--collector.drm", "--collector.hwmon",
                       "--path.sysfs", str(tree), "--web.listen-address", f"127.0.0.1:{port}",
                       "--web.max-requests=0", "--log.level=warn"], port, ready_path="/metrics")


_STAGE = re.compile(rb'^unified_gpu_exporter_stage_cpu_seconds_total\{([^}]*)\} (\S+)$', re.M)
_LABEL = re.compile(rb'(\w+)="([^"]*)"')
_PROCESS = re.compile(rb"^process_cpu_seconds_total (\S+)$", re.M)


def stage_cpu(body: bytes) -> dict[str, float]:
    """From one exposition of ours: CPU seconds per pipeline stage (summed over sources) and the
    process total (``process``)."""
    out: dict[str, float] = {}
    for labels, value in _STAGE.findall(body):
        stage = dict(_LABEL.findall(labels)).get(b"stage", b"?").decode()
        out[stage] = out.get(stage, 0.0) + float(value)
    m = _PROCESS.search(body)
    if m:
        out["process"] = float(m.group(1))
    return out


def stage_breakdown(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """ms of CPU per second per stage over a window (``event_loop`` included), and ``other``
    (process minus the rest: helper threads, hand-offs; the exporter's own ``other`` row is
    recomputed over the same window from the process total)."""
    if not seconds or "process" not in after or "process" not in before:
        return {}
    out = {k: (after[k] - before.get(k, 0.0)) / seconds * 1000 for k in after if k not in ("process", "other")}
    total = (after["process"] - before["process"]) / seconds * 1000
    out["other"] = total - sum(out.values())
    out["total"] = total
    return {k: round(v, 2) for k, v in out.items()}


def count_series(body: bytes, prefixes: tuple[bytes, ...]) -> int:
    return sum(1 for line in body.splitlines() if line.startswith(prefixes))


def run(tmp: Path, trees: dict[int, Path], load_s: float = 3.0, idle_s: float = 20.0,
        paced_s: float = 60.0, clients: tuple[int, ...] = (1, 50), settle_s: float = 3.0) -> dict:
    """``trees``: cards -> sysfs root (``sysfs_tree.build_tree``)."""
    binary = node_exporter_binary()
    if binary is None:
        return {"skipped": f"{NODE_EXPORTER} not installed (Debian package prometheus-node-exporter)"}
    procs: dict[int, dict[str, Proc]] = {}
    spawn = {n: {"ours": spawn_to_first_scrape(ours(f"spawn_ours{n}", tree, tmp), tmp),
                 "node": spawn_to_first_scrape(node(f"spawn_node{n}", tree, binary), tmp)}
             for n, tree in trees.items()}
    try:
        for n, tree in trees.items():
            procs[n] = {"ours": ours(f"ours{n}", tree, tmp), "ours_lean": ours(f"ours_lean{n}", tree, tmp, True),
                        "node": node(f"node{n}", tree, binary)}
            for p in procs[n].values():
                p.start(tmp)
        for group in procs.values():
            for p in group.values():
                p.wait_ready()
        time.sleep(settle_s)  # rates need a second poll; indicators their first windows
        out: dict = {"sizes": {}}
        for n, group in procs.items():
            res: dict = {"cards": n, "spawn_to_first_200_s": spawn[n]}
            bodies = {k: p.get() for k, p in group.items()}
            res["series"] = {"ours": count_series(bodies["ours"], (b"gpu_",)),
                             "ours_lean": count_series(bodies["ours_lean"], (b"gpu_",)),
                             "node": count_series(bodies["node"], (b"node_drm_", b"node_hwmon_"))}
            res["exposition_bytes"] = {k: len(b) for k, b in bodies.items()}
            res["drm_cards_node"] = bodies["node"].count(b"node_drm_card_info{")
            res["load"] = {}
            for c in clients:
                for key in ("ours", "node"):
                    res["load"][f"{key}_c{c}"] = scrape_load(group[key], c, load_s).as_dict()
            out["sizes"][n] = res
        everyone = [p for group in procs.values() for p in group.values()]
        # idle: nobody scrapes (ours still polls at 1 Hz; node_exporter does nothing)
        cpu0 = {p.name: p.cpu() for p in everyone}
        time.sleep(idle_s)
        idle = {p.name: p.cpu() - cpu0[p.name] for p in everyone}
        stages0 = {n: stage_cpu(group["ours"].get()) for n, group in procs.items()}
        paced = paced_scrapes(everyone, paced_s, 1.0)
        stages1 = {n: stage_cpu(group["ours"].get()) for n, group in procs.items()}
        for n, group in procs.items():
            res = out["sizes"][n]
            res["idle_cpu_s_per_s"] = {k: idle[p.name] / idle_s for k, p in group.items()}
            res["paced"] = {k: paced[p.name] for k, p in group.items()}
            res["cpu_s_per_100_scrapes"] = {
                k: paced[p.name]["cpu_s"] / max(paced[p.name]["scrapes"], 1) * 100 for k, p in group.items()}
            # read from ours' own self-metrics (rendered once per poll: the window is the paced
            # one give or take a poll interval)
            res["stages_ms_per_s"] = stage_breakdown(stages0[n], stages1[n], paced[group["ours"].name]["seconds"])
            res["memory"] = {k: memory(p.pid) for k, p in group.items()}
            res["rss_bytes"] = {k: m["rss_bytes"] for k, m in res["memory"].items()}
            lo = res["load"]
            res["ratios"] = {
                **{f"p99_c{c}": _ratio(lo[f"ours_c{c}"]["p99_ms"], lo[f"node_c{c}"]["p99_ms"]) for c in clients},
                "cpu": _ratio(res["cpu_s_per_100_scrapes"]["ours"], res["cpu_s_per_100_scrapes"]["node"]),
                "cpu_lean": _ratio(res["cpu_s_per_100_scrapes"]["ours_lean"], res["cpu_s_per_100_scrapes"]["node"]),
                "rss": _ratio(res["rss_bytes"]["ours"], res["rss_bytes"]["node"]),
            }
        out["idle_seconds"], out["paced_seconds"] = idle_s, paced_s
        out["node_exporter_version"] = _version(binary)
        return out
    finally:
        for group in procs.values():
            for p in group.values():
                p.stop()


def _version(binary: str) -> str:
    import subprocess

    try:
        text = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
        return (text.stdout or text.stderr).splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


if __name__ == "__main__":
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        trees = {n: build_tree(Path(d) / f"sys{n}", n) for n in (8, 32)}
        print(json.dumps(run(Path(d), trees, load_s=2, idle_s=5, paced_s=10), indent=1))
