#!/usr/bin/env python3
"""Fault measurements on the reference fleet: samples lost around a fault, pages a restart should
never cause, and the sizing of the fleet's series, samples, storage and traffic.  Used by
tests/test_fleet_faults.py; run on its own it prints the fault table and the sizing table of
docs/fleet.md at the demo's timing (5 s scrapes, 15 s evaluations, 60 s outages):

    python deploy/fleet/fleet_faults.py [--edge prometheus] [--outage 60] [--json out.json]
    python deploy/fleet/fleet_faults.py --scrape-interval 15s --sizing-only 5   # the sizing alone
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet as fleetmod  # noqa: E402

# every scraped series of a cluster's exporters (recorded series keep job and cluster: left out)
SCRAPED = '{{cluster="{cluster}", job="unified-gpu-exporter", __name__!~".*:.*"}}'
RECORDED = '{{cluster="{cluster}", __name__=~".+:.+"}}'


def samples_lost(fleet, match: str, start: float, end: float, interval: float) -> tuple[int, int, int]:
    """(lost, delivered, series): scrape intervals without a sample in the store, per series that
    is continuous over [start, end] (a series starting or ending inside the window is left out)."""
    lost = delivered = series = 0
    for row in fleet.export(match, start - 3 * interval, end + 3 * interval):
        ts = sorted(t / 1000 for t in row["timestamps"])
        if not ts or ts[0] > start or ts[-1] < end:
            continue
        inside = [t for t in ts if start - interval <= t <= end + interval]
        series += 1
        delivered += len(inside)
        lost += sum(max(0, round((b - a) / interval) - 1) for a, b in zip(inside, inside[1:], strict=False) if b - a > 1.5 * interval)
    return lost, delivered, series


def _key(labels: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in labels.items()))


def notified_firing(fleet) -> dict[tuple, str]:
    """Alerts whose last notification so far says firing."""
    state: dict[tuple, str] = {}
    for e in fleet.sink.events():
        state[_key(e["labels"])] = e["status"]
    return {k: v for k, v in state.items() if v == "firing"}


def spurious_pages(fleet, since: float, before: dict[tuple, str], allowed: frozenset[str] = frozenset()) -> list[str]:
    """Notifications since ``since`` that a restart should never cause: a resolve of an alert that
    was firing before, a second firing notification of an alert already notified, or any new page
    not in ``allowed`` (alertnames).  The dead man's switch heartbeat is not a page."""
    out = []
    for e in fleet.sink.events(since):
        if e["receiver"] == "deadmans-switch":
            continue
        key, name = _key(e["labels"]), e["labels"].get("alertname")
        if e["status"] == "resolved" and key in before:
            out.append(f"resolved {name} {e['labels']}")
        elif e["status"] == "firing" and key in before:
            out.append(f"re-notified {name} {e['labels']}")
        elif e["status"] == "firing" and name not in allowed:
            out.append(f"new page {name} {e['labels']}")
    return out


def wait_delivered(fleet, cluster: str, until: float, timeout: float = 120) -> None:
    """Until the store holds the cluster's scrapes up to ``until`` (queues drained after a fault)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = fleet.export(f'up{{cluster="{cluster}", job="unified-gpu-exporter"}}', until - 30, time.time() + 1)
        if rows and all(max(r["timestamps"]) / 1000 >= until for r in rows):
            return
        time.sleep(1)
    raise AssertionError(f"{cluster}'s samples up to {until:.0f} did not arrive within {timeout:.0f}s")


# what the demo's degraded cluster pages for once its baselines have filled
EXPECTED_PAGES = ("GPUPcieLinkDegraded", "GPUCrossCloudPerformanceVariance")


def settle(fleet, expected=EXPECTED_PAGES, quiet: float = 20, timeout: float = 300) -> dict[tuple, str]:
    """Wait until the ``expected`` alerts are notified and no page arrives for ``quiet`` s; the
    alerts notified firing then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not set(expected) <= {
            e["labels"].get("alertname") for e in fleet.sink.events() if e["status"] == "firing"}:
        time.sleep(2)
    missing = set(expected) - {e["labels"].get("alertname") for e in fleet.sink.events()}
    if missing:
        raise AssertionError(f"not paged within {timeout:.0f}s: {sorted(missing)}")
    quiet_since = time.time()
    while time.monotonic() < deadline and time.time() - quiet_since < quiet:
        time.sleep(2)
        if [e for e in fleet.sink.events(quiet_since) if e["receiver"] != "deadmans-switch"]:
            quiet_since = time.time()
    return notified_firing(fleet)


def active_alerts(fleet) -> int:
    """Alerts Alertmanager holds active (either peer that answers; Watchdog left out)."""
    counts = [len([a for a in fleet.alertmanager_alerts(peer) if a["labels"].get("alertname") != "Watchdog"])
              for peer in ("alertmanager-0", "alertmanager-1") if fleet.sup.running(peer)]
    return max(counts, default=0)


def sleep_watching(fleet, seconds: float, seen: list[int]) -> None:
    """Sleep, recording the number of active alerts in Alertmanager every second."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        seen.append(active_alerts(fleet))
        time.sleep(min(1.0, max(0.0, end - time.monotonic())))


def store_outage(fleet, cluster: str, outage: float, interval: float, restart: tuple[str, ...] = ("0",)) -> dict:
    """The raw store stops (SIGTERM) for ``outage`` s; meanwhile the cluster's agents named in
    ``restart`` restart one after the other (a rollout: SIGTERM, start, ready, then the next; never
    two down at once).  Samples lost and pages caused; ``agents_restarted_at_s``: when each restart
    ended, seconds into the outage (what was scraped before lived only in a restarted queue)."""
    before = notified_firing(fleet)
    active_before, seen, restarted = active_alerts(fleet), [], []
    t0 = time.time()
    fleet.kill("vm-raw", signal.SIGTERM)
    for replica in restart:
        sleep_watching(fleet, outage / (len(restart) + 1), seen)
        fleet.restart(f"agent-{cluster}-{replica}")
        restarted.append(round(time.time() - t0, 1))
    sleep_watching(fleet, max(0.0, t0 + outage - time.time()), seen)
    fleet.restart("vm-raw")
    t1 = time.time()
    wait_delivered(fleet, cluster, t1 + 2 * interval)
    time.sleep(max(15.0, 3 * interval))
    lost, delivered, series = samples_lost(fleet, SCRAPED.format(cluster=cluster), t0 - 5, t1 + 5, interval)
    rec = samples_lost(fleet, RECORDED.format(cluster=cluster), t0 - 5, t1 + 5,
                       fleetmod.duration_seconds(fleet.eval_interval))
    return {"seconds": round(t1 - t0), "agents_restarted_at_s": restarted,
            "lost": lost, "delivered": delivered, "series": series,
            "recorded_lost": rec[0], "recorded_series": rec[2], "spurious_pages": spurious_pages(fleet, t0, before),
            "active_alerts_before": active_before, "active_alerts_min_during": min(seen, default=active_before)}


def sizing(fleet, minutes: float = 5.0) -> dict:
    """Series per GPU by profile, samples/s, bytes on disk and remote-write bytes, from the running
    fleet over the last ``minutes``."""
    def one(expr: str) -> float:
        rows = fleet.query(expr)
        return float(rows[0]["value"][1]) if rows else 0.0
    window = f"{int(minutes * 60)}s"
    per_profile = {}
    for c in fleet.clusters:
        gpus = one(f'count(gpu_info{{cluster="{c.name}"}})')
        series = one(f'count({{cluster="{c.name}", job="unified-gpu-exporter", __name__!~".*:.*"}})')
        per_profile.setdefault(c.profile, []).append(series / max(gpus, 1))
    return {
        "series_per_gpu": {p: round(sum(v) / len(v), 1) for p, v in per_profile.items()},
        "gpus": one("count(gpu_info)"),
        "nodes": len(fleet.nodes),
        "scrape_interval_s": fleetmod.duration_seconds(fleet.scrape_interval),
        "store_rows_per_s": one(f'sum(rate(vm_rows_inserted_total{{job="fleet-central", instance="{fleet.urls["vm-raw"][7:]}"}}[{window}]))'),
        "store_bytes": one(f'sum(vm_data_size_bytes{{instance="{fleet.urls["vm-raw"][7:]}"}})'),
        "store_rss_bytes": one(f'process_resident_memory_bytes{{instance="{fleet.urls["vm-raw"][7:]}"}}'),
        "edge_rss_bytes": one('avg(process_resident_memory_bytes{job="fleet-agent"})'),
        "edge_bytes_sent_per_s": one(f'sum(rate(vmagent_remotewrite_bytes_sent_total{{job="fleet-agent"}}[{window}]))'),
        "edge_rows_per_s": one(f'sum(rate(vmagent_remotewrite_rows_pushed_after_relabel_total{{job="fleet-agent"}}[{window}]))'),
        "scraped_series": one('count({job="unified-gpu-exporter", __name__!~".*:.*"})'),
        "recorded_series": one('count({__name__=~".+:.+"})'),
        "edge_conn_bytes_per_s": one(f'sum(rate(vmagent_remotewrite_conn_bytes_written_total{{job="fleet-agent"}}[{window}]))'),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--edge", choices=["vmagent", "prometheus"], default="vmagent")
    p.add_argument("--outage", type=float, default=60.0)
    p.add_argument("--scrape-interval", default="5s")
    p.add_argument("--json", type=Path)
    p.add_argument("--sizing-only", type=float, metavar="MINUTES",
                   help="no faults: let the fleet run one minute plus MINUTES, then measure over the last MINUTES")
    args = p.parse_args(argv)
    clusters = [fleetmod.Cluster("c1", "aws", "us-east-1", 2, "fleet"),
                fleetmod.Cluster("c2", "azure", "eastus", 1, "fleet-degraded"),
                fleetmod.Cluster("c3", "gcp", "us-central1", 1, "fleet", profile="minimal")]
    interval = fleetmod.duration_seconds(args.scrape_interval)
    out: dict = {"edge": args.edge, "outage_s": args.outage}
    with tempfile.TemporaryDirectory(prefix="ugpu-fleet-faults-") as tmp:
        fleet = fleetmod.Fleet(Path(tmp), clusters, scrape_interval=args.scrape_interval, eval_interval="15s",
                               max_for="30s", latency_offset="5s", resend_delay="1m")
        fleet.edge = args.edge
        with fleet:
            if args.sizing_only:
                time.sleep(60 * (args.sizing_only + 1))
                out["sizing"] = sizing(fleet, args.sizing_only)
            else:
                settle(fleet)
                out["store_down_agent_restarted"] = store_outage(fleet, "c1", args.outage, interval)
                out["store_down_both_agents_restarted"] = store_outage(fleet, "c1", args.outage, interval,
                                                                       restart=("0", "1"))
                if args.edge == "vmagent":
                    t0 = time.time()
                    fleet.kill("agent-c1-1")
                    time.sleep(args.outage)
                    fleet.restart("agent-c1-1")
                    t1 = time.time()
                    wait_delivered(fleet, "c1", t1 + 2 * interval)
                    lost = samples_lost(fleet, SCRAPED.format(cluster="c1"), t0 - 5, t1 + 5, interval)
                    out["agent_killed"] = {"seconds": round(t1 - t0), "lost": lost[0], "delivered": lost[1], "series": lost[2]}
                    before = notified_firing(fleet)
                    t0 = time.time()
                    fleet.kill("vmalert-0")
                    time.sleep(args.outage)
                    fleet.restart("vmalert-0")
                    time.sleep(60)
                    out["vmalert_killed"] = {"seconds": args.outage, "spurious_pages": spurious_pages(fleet, t0, before)}
                    out["sizing"] = sizing(fleet)
    text = json.dumps(out, indent=1)
    if args.json:
        args.json.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
