"""A default install on a busy node, side by side with node_exporter (issue 35's table).

The same amdgpu sysfs trees as the ``peer`` section (8 and 32 cards) and a server whose only DRM
card is the BMC's VGA (``ast``), each served by ours with the DRM fdinfo client count on (the
default) over two procfs roots given with ``--path.procfs``:

  empty   a procfs with kthreadd only (what the ``peer`` section's node has);
  busy    a fixture procfs of PROCS processes holding FDS fds in all (sockets, pipes, files,
          /dev/null), built by ``bench_fdinfo.build``: the scan's cost, without other work.  Each
          process has a Linux ``stat`` file; a driver thread in this process rewrites the stat of a
          fixed quarter of them once a second (``bench_fdinfo.Activity``: their utime and minflt
          grow), so their re-verifications stay real while the idle ones' are vouched for
          (sources/fdinfo_activity.py).  A quarter is pessimistic: on the machine this was written
          on 6 of 66 processes changed their stat over 50 s; on a GPU node the data loaders and
          trainers change, most daemons, shims and sidecars do not;
  busy_list  the same busy procfs over a copy of the sysfs tree that also has DRM core's debugfs
          client list (``kernel/debug/dri/<N>/clients``, ``bench_fdinfo.clients_lists``: where
          debugfs is mounted and readable, as under the shipped systemd unit): the blind
          re-verification stops (docs/detection.md).  Not for the BMC-only server (no counted card).

All servers run at once and are scraped once a second over the same window; node_exporter
(drm + hwmon collectors) on the same sysfs tree is the peer.  Reported: CPU % of one core, the
ratio to node_exporter, RSS.  The fixture procfs is a directory tree of symlinks: a readlink
there costs about what one on /proc does (a path walk and a copy), the magic links' d_path aside.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.bench_fdinfo import Activity, build, clients_lists, fixture_dir, sysfs  # noqa: E402
from bench.common import Proc, exporter_cmd, free_port, paced_scrapes  # noqa: E402
from bench.node_exporter_peer import KEEP_OPEN, _ratio, node, node_exporter_binary  # noqa: E402

OTHER_COLLECTORS = ("nvml", "dcgm", "amdsmi", "intel", "levelzero", "upstream")


def ours(name: str, tree: Path, procfs: Path, tmp: Path) -> Proc:
    """amdgpu and fdinfo at their defaults (on where their hardware is: neither on a BMC-only
    server), the other collectors off."""
    port = free_port()
    conf = tmp / "busy.yaml"
    conf.write_text(KEEP_OPEN)
    return Proc(name, [*exporter_cmd(), "--web.listen-address", f"127.0.0.1:{port}", "--path.sysfs", str(tree),
                       "--path.procfs", str(procfs), "--poll.interval", "1s", "--state.dir",
                       str(tmp / f"state-{name}"), "--log.level", "warn", "--config.file", str(conf),
                       *[f"--no-collector.{c}" for c in OTHER_COLLECTORS]], port, ready_path="/metrics")


def run(tmp: Path, trees: dict[int, Path], fds: int, procs: int, seconds: float, settle_s: float) -> dict:
    binary = node_exporter_binary()
    if binary is None:
        return {"skipped": "prometheus-node-exporter not installed"}
    with tempfile.TemporaryDirectory(prefix="ugx-busy-", dir=fixture_dir()) as d:
        empty = Path(d) / "proc-empty"
        (empty / "2").mkdir(parents=True)
        (empty / "2" / "comm").write_text("kthreadd\n")
        busy = Path(d) / "proc-busy"
        t0 = time.monotonic()
        build(busy, fds, procs, 0)
        built = time.monotonic() - t0
        stop = threading.Event()
        driver = threading.Thread(target=_drive, args=(Activity(busy, procs), stop), daemon=True)
        driver.start()
        try:
            return _measure(tmp, trees, empty, busy, binary, seconds, settle_s) | {
                "fds": fds, "processes": procs, "build_s": round(built, 1), "seconds": seconds,
                "active_processes": len(range(0, procs, 4))}
        finally:
            stop.set()
            driver.join()


def _drive(activity: Activity, stop: threading.Event) -> None:
    """A quarter of the busy procfs's processes run: their stat changes once a second."""
    while not stop.wait(1.0):
        activity.step()


def _measure(tmp: Path, trees: dict[int, Path], empty: Path, busy: Path, binary: str, seconds: float,
             settle_s: float) -> dict:
    trees = {**{f"{n} cards": t for n, t in trees.items()}, "bmc only": sysfs(tmp / "sys-bmc", "ast")}
    servers: dict[str, dict[str, Proc]] = {}
    try:
        for label, tree in trees.items():
            key = label.replace(" ", "_")
            servers[label] = {"empty": ours(f"busy_{key}_empty", tree, empty, tmp),
                              "busy": ours(f"busy_{key}_busy", tree, busy, tmp),
                              "node": node(f"busy_{key}_node", tree, binary)}
            if label != "bmc only":  # the same tree with the debugfs client list (no DRM client)
                listed = tmp / f"sys-list-{key}"
                if not listed.exists():
                    shutil.copytree(tree, listed, symlinks=True)
                    clients_lists(listed, [])
                servers[label]["busy_list"] = ours(f"busy_{key}_busy_list", listed, busy, tmp)
            for p in servers[label].values():
                p.start(tmp)
        for group in servers.values():
            for p in group.values():
                p.wait_ready()
        time.sleep(settle_s)  # the busy procfs's first examination is spread over the first polls
        everyone = [p for g in servers.values() for p in g.values()]
        paced = paced_scrapes(everyone, seconds, 1.0)
        out: dict = {"cases": {}}
        for label, group in servers.items():
            pct = {k: paced[p.name]["cpu_s"] / paced[p.name]["seconds"] * 100 for k, p in group.items()}
            out["cases"][label] = {
                "cpu_percent": pct, "rss_bytes": {k: paced[p.name]["rss_bytes"] for k, p in group.items()},
                "ratio_empty": _ratio(pct["empty"], pct["node"]), "ratio_busy": _ratio(pct["busy"], pct["node"]),
                "ratio_busy_list": _ratio(pct["busy_list"], pct["node"]) if "busy_list" in pct else None,
                "busy_minus_empty_points": pct["busy"] - pct["empty"],
                "errors": {k: paced[p.name]["errors"] for k, p in group.items()}}
        return out
    finally:
        for group in servers.values():
            for p in group.values():
                p.stop()
