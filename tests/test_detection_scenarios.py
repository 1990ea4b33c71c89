"""The detection suite through the real daemon: one simulated GPU per case
(mappings/scenarios/detection.yaml), each with its expected memory state over time.

Two exporters run side by side as processes (``--simulate detection``, 1 s full polls, 250 ms
fast polls): one with the default co-tenancy evidence (clients counted, as a default install
does), one with ``processes: off`` (no source counts clients).  Both are scraped every 0.5 s for
about 100 s.  For every GPU, every scrape inside an expected window must show the expected
``gpu_memory_state`` (the case's ``without_process_data`` expectation for the second exporter),
and ``gpu_memory_contention_seconds_total`` at the end must lie within the case's bounds.
``drop_confirm_seconds`` is compressed from 900 s to 20 s so a neighbour that outstays it is
inside the run.  With ``DETECTION_TABLE=<file>`` the case / expected / got table of
docs/detection.md is written there.
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
            if "gpu_instance" in s.labels:
                continue  # MIG instances: the GPU's own (derived) state is what a case expects
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


CONFIG = "indicators:\n  state:\n    drop_confirm_seconds: 20\n"
VARIANTS = ("default evidence", "without process data")


def _run(urls: dict[str, str], ready: dict[str, float]) -> dict[str, tuple[list, dict, dict]]:
    """Scrapes every exporter until the last one started has run RUN_SECONDS.  Each timeline counts
    from its own exporter's ready time (its simulator opened just before): a clock shared by both
    would run behind the first exporter's simulator by the second one's whole startup, and on a
    busy machine that is more than the 2 s a window leaves before the next phase."""
    got: dict[str, tuple[list, dict, dict]] = {v: ([], {}, defaultdict(Counter)) for v in urls}
    while time.monotonic() - max(ready.values()) < RUN_SECONDS:
        for variant, url in urls.items():
            states, seconds, seed = _scrape(url)
            timeline, last, seed_hits = got[variant]
            timeline.append((time.monotonic() - ready[variant], states))
            last.clear()
            last.update(seconds)
            for dev, hit in seed.items():
                seed_hits[dev][hit] += 1
        time.sleep(SCRAPE_EVERY)
    return got


def test_every_case_reads_its_expected_state_over_time(tmp_path):
    scenario = load_scenario("detection")
    with ProcessSet() as procs:
        urls: dict[str, str] = {}
        ready: dict[str, float] = {}
        for variant, extra in zip(VARIANTS, ("", "simulate:\n  processes: off\n"), strict=True):
            d = tmp_path / variant.replace(" ", "-")
            d.mkdir()
            (d / "config.yml").write_text(CONFIG + extra)
            exp = start_exporter(procs, d, ["--simulate", "detection", "--poll.interval", "1s",
                                            "--poll.fast-interval", "250ms", "--config.file", str(d / "config.yml")],
                                 name=variant.replace(" ", "-"))
            urls[variant] = f"http://{exp.address}"
            ready[variant] = time.monotonic()  # the first exporter's first scrape waits on the second's
            # startup (at most start_exporter's 15 s): inside the first window (5-25 s), never past it
        got = _run(urls, ready)

    failures, rows = [], []
    for dev, exp_ in scenario.expect.items():
        for variant in VARIANTS:
            timeline, seconds, seed_hits = got[variant]
            e = exp_ if variant == VARIANTS[0] or exp_.without_process_data is None else exp_.without_process_data
            got_windows = []
            for w in e.states:
                seen = Counter(st.get(dev, "absent") for t, st in timeline if w.start <= t <= w.end)
                assert seen, (dev, w)
                got_windows.append(", ".join(f"{s} {n}" for s, n in seen.most_common()))
                if set(seen) != {w.state}:
                    failures.append(f"{dev} ({exp_.case}, {variant}) {w.start:.0f}-{w.end:.0f} s: "
                                    f"expected {w.state}, got {dict(seen)}")
            got_s = seconds.get(dev, 0.0)
            if e.contended_seconds is not None:
                lo, hi = e.contended_seconds
                if not lo <= got_s <= hi:
                    failures.append(f"{dev} ({exp_.case}, {variant}): contended {got_s:.2f} s, expected {lo}-{hi}")
            first_contended = next((t for t, st in timeline if st.get(dev) == "contended"), None)
            hits = seed_hits.get(dev, Counter())
            seed_rule = ("no occupancy" if None in hits else
                         f"{100 * hits[True] / max(1, sum(hits.values())):.0f} % of scrapes")
            rows.append((dev, exp_.case, variant, e, got_windows, got_s, first_contended, seed_rule))

    table = os.environ.get("DETECTION_TABLE")
    if table:
        lines = ["| GPU | case | evidence | expected | got (scrapes per state) | contended s (expected) "
                 "| first contended | seed's rule matched |",
                 "|---|---|---|---|---|---|---|---|"]
        for dev, case, variant, e, got_windows, got_s, first, seed_rule in rows:
            expected = "; ".join(f"{w.start:.0f}-{w.end:.0f} s {w.state}" for w in e.states)
            got = "; ".join(got_windows)
            bounds = "-" if e.contended_seconds is None else f"{e.contended_seconds[0]:g}-{e.contended_seconds[1]:g}"
            when = "never" if first is None else f"{first:.1f} s"
            lines.append(f"| {dev} | {case} | {variant} | {expected} | {got} | {got_s:.1f} ({bounds}) | {when} "
                         f"| {seed_rule} |")
        with open(table, "w") as f:
            f.write("\n".join(lines) + "\n")
    assert not failures, "\n".join(failures)


def test_every_case_with_evidence_says_what_it_reads_without():
    """A case whose GPU has per-process data names its state without that data too."""
    scenario = load_scenario("detection")
    for i, spec in enumerate([d for d in scenario.devices if d.vendor == "nvidia"]):
        has = any("gpu_process_utilization_percent" in k for k in spec.values)
        exp = scenario.expect.get(f"nvidia:{i}")
        if has and exp is not None:
            assert exp.without_process_data is not None, f"nvidia:{i} ({spec.case})"
