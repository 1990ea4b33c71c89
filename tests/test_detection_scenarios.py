"""The detection suite through the real daemon: one simulated GPU per case
(mappings/scenarios/detection.yaml), each with its expected memory state over time.

The exporter runs as a process (``--simulate detection``, 1 s full polls, 250 ms fast polls) and
is scraped every 0.5 s for about 100 s.  For every GPU, every scrape inside an expected window
must show the expected ``gpu_memory_state``, and ``gpu_memory_contention_seconds_total`` at the
end must lie within the case's bounds.  With ``DETECTION_TABLE=<file>`` the case / expected /
got table of docs/detection.md is written there.
"""

from __future__ import annotations

import os
import time
from collections import Counter, defaultdict

from prometheus_client.parser import text_string_to_metric_families

from exporter.simulate import load_scenario
from tests.e2e_util import ProcessSet, http_get, start_exporter

RUN_SECONDS = 100.0
SCRAPE_EVERY = 0.5


def _scrape(url: str) -> tuple[dict[str, str], dict[str, float], dict[str, bool | None]]:
    text = http_get(url + "/metrics").body.decode()
    states: dict[str, str] = {}
    seconds: dict[str, float] = defaultdict(float)
    bw: dict[str, float] = {}
    occ: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            dev = f"{s.labels.get('vendor')}:{s.labels.get('gpu')}"
            if s.name == "gpu_memory_state" and s.value == 1.0:
                states[dev] = s.labels["state"]
            elif s.name == "gpu_memory_contention_seconds_total":
                seconds[dev] += s.value
            elif s.name == "gpu_memory_bandwidth_utilization_percent":
                bw[dev] = s.value
            elif s.name == "gpu_compute_occupancy_percent":
                occ[dev] = s.value
    # the seed's literal GPUMemoryContention condition (None: no occupancy reported)
    seed = {dev: (bw[dev] > 85 and occ[dev] < 50) if dev in occ else None for dev in bw}
    return states, dict(seconds), seed


def test_every_case_reads_its_expected_state_over_time(tmp_path):
    scenario = load_scenario("detection")
    with ProcessSet() as procs:
        exp = start_exporter(procs, tmp_path, ["--simulate", "detection", "--poll.interval", "1s",
                                               "--poll.fast-interval", "250ms"])
        url = f"http://{exp.address}"
        t0 = time.monotonic()
        timeline: list[tuple[float, dict[str, str]]] = []
        seconds: dict[str, float] = {}
        seed_hits: dict[str, Counter] = defaultdict(Counter)
        while time.monotonic() - t0 < RUN_SECONDS:
            states, seconds, seed = _scrape(url)
            timeline.append((time.monotonic() - t0, states))
            for dev, hit in seed.items():
                seed_hits[dev][hit] += 1
            time.sleep(SCRAPE_EVERY)

    failures, rows = [], []
    for dev, exp_ in scenario.expect.items():
        got_windows = []
        for w in exp_.states:
            seen = Counter(st.get(dev, "absent") for t, st in timeline if w.start <= t <= w.end)
            assert seen, (dev, w)
            got_windows.append(", ".join(f"{s} {n}" for s, n in seen.most_common()))
            if set(seen) != {w.state}:
                failures.append(f"{dev} ({exp_.case}) {w.start:.0f}-{w.end:.0f} s: expected {w.state}, got {dict(seen)}")
        got_s = seconds.get(dev, 0.0)
        if exp_.contended_seconds is not None:
            lo, hi = exp_.contended_seconds
            if not lo <= got_s <= hi:
                failures.append(f"{dev} ({exp_.case}): contended {got_s:.2f} s, expected {lo}-{hi}")
        first_contended = next((t for t, st in timeline if st.get(dev) == "contended"), None)
        hits = seed_hits.get(dev, Counter())
        seed_rule = ("no occupancy" if None in hits else
                     f"{100 * hits[True] / max(1, sum(hits.values())):.0f} % of scrapes")
        rows.append((dev, exp_, got_windows, got_s, first_contended, seed_rule))

    table = os.environ.get("DETECTION_TABLE")
    if table:
        lines = ["| GPU | case | expected | got (scrapes per state) | contended s (expected) | first contended "
                 "| seed's rule matched |",
                 "|---|---|---|---|---|---|---|"]
        for dev, e, got_windows, got_s, first, seed_rule in rows:
            expected = "; ".join(f"{w.start:.0f}-{w.end:.0f} s {w.state}" for w in e.states)
            got = "; ".join(got_windows)
            bounds = "-" if e.contended_seconds is None else f"{e.contended_seconds[0]:g}-{e.contended_seconds[1]:g}"
            when = "never" if first is None else f"{first:.1f} s"
            lines.append(f"| {dev} | {e.case} | {expected} | {got} | {got_s:.1f} ({bounds}) | {when} | {seed_rule} |")
        with open(table, "w") as f:
            f.write("\n".join(lines) + "\n")
    assert not failures, "\n".join(failures)
