"""Faults injected into the running reference fleet (deploy/fleet/fleet.py) with the real binaries:
one edge agent of a pair, the central store (with both agents of a pair restarted one after the
other meanwhile), one exporter, one Alertmanager peer and one vmalert replica, in turn.

Time-compressed like tests/test_fleet_e2e.py: 2 s scrapes, 2 s evaluations, every `for:` capped at
40 s, vmalert's resend delay 10 s (alerts stay active in Alertmanager 40 s after the last send),
outages of 20 s; the ratios of the production settings (15 s scrapes, 1 m evaluations, resend 1 m
-> 4 min, `for:` 2-15 min, outages of 60 s) are kept: an outage is shorter than the active time of
an alert in Alertmanager and shorter than every `for:`.  The long run at real timing (the dead
exporter still paged 10 minutes later, GPUClusterNotReporting within 10 minutes) is
test_fleet_faults_soak below (`make soak`).

"Samples lost" counts, per series of the cluster's exporter job, the scrape intervals with no
sample in the central store (gaps longer than 1.5 intervals) between two points around a fault.
Each phase's numbers are written to $FLEET_FAULTS_REPORT (a JSON file) when set.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime

import pytest

from tests.conftest import require_binary
from tests.e2e_util import wait_until
from tests.reliability_util import SOAK
from tests.test_fleet import load_fleet_module

load_fleet_module()
from fleet_faults import (  # noqa: E402  (deploy/fleet, on sys.path now)
    notified_firing,
    samples_lost,
    settle,
    spurious_pages,
    store_outage,
    wait_delivered,
)
from fleet_util import http_get  # noqa: E402

SCRAPE = 2.0
OUTAGE = 20.0
BINARIES = [("victoria-metrics", "victoria-metrics"), ("vmagent", "victoria-metrics"), ("vmalert", "victoria-metrics"),
            ("vmauth", "victoria-metrics"), ("prometheus-alertmanager", "prometheus-alertmanager"),
            ("openssl", "openssl"), ("prometheus-node-exporter", "prometheus-node-exporter")]


def _clusters(mod):
    return [mod.Cluster("c1", "aws", "us-east-1", 2, "fleet"), mod.Cluster("c2", "azure", "eastus", 1, "fleet-degraded")]


def _report(name: str, **values) -> None:
    path = os.environ.get("FLEET_FAULTS_REPORT")
    if path:
        doc = json.loads(open(path).read()) if os.path.exists(path) else {}
        doc[name] = values
        with open(path, "w") as fh:
            json.dump(doc, fh, indent=1)
    print(name, values)


def _vmalert_alerts(fleet, replica: str, name: str) -> list[dict]:
    """The alerts named ``name`` that one vmalert replica holds (pending or firing)."""
    status, body = http_get(f"{fleet.urls[f'vmalert-{replica}']}/api/v1/alerts", timeout=5)
    assert status == 200, body[:300]
    return [a for a in json.loads(body)["data"]["alerts"] or [] if a["name"] == name]


def _active_at(alert: dict) -> float:
    return datetime.fromisoformat(alert["activeAt"]).timestamp()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    for name, package in BINARIES:
        require_binary(name, package)
    mod = load_fleet_module()
    f = mod.Fleet(tmp_path_factory.mktemp("fleet-faults"), _clusters(mod), scrape_interval=f"{SCRAPE:.0f}s",
                  # for: capped at 40 s: the production ratio of a 2 m for: to a 60 s outage (30 s left
                  # a busy box 10 s of margin, and an agent restart took longer once)
                  eval_interval="2s", max_for="40s", latency_offset="1s", resend_delay="10s")
    f.start(timeout=120)
    try:
        yield f
    finally:
        f.stop()


def test_faults_lose_no_sample_and_page_once(fleet):
    before = settle(fleet)
    assert before, "no alert was firing before the faults: nothing to prove about spurious pages"
    # every scraped series of c1's exporters (recorded series keep job and cluster: left out)
    c1_all = '{cluster="c1", job="unified-gpu-exporter", __name__!~".*:.*"}'

    # -- 1. one edge agent of c1 crashes (SIGKILL) for 20 s: its twin keeps scraping --------------
    t0 = time.time()
    fleet.kill("agent-c1-0")
    time.sleep(OUTAGE)
    fleet.restart("agent-c1-0")
    t1 = time.time()
    wait_delivered(fleet, "c1", t1 + 5 + 2 * SCRAPE, timeout=60)
    lost, delivered, series = samples_lost(fleet, c1_all, t0 - 5, t1 + 5, SCRAPE)
    _report("agent_killed", seconds=round(t1 - t0), lost=lost, delivered=delivered, series=series)
    assert series > 100 and lost == 0, (lost, delivered, series)

    # -- 2. the central store stops for 20 s; both agents of c1 restart meanwhile, one after the
    #       other (a rollout: clean stop, start, ready, then the next), never both down at once:
    #       what they scraped before the restarts exists only in the restarted agents' queues ----
    store = store_outage(fleet, "c1", OUTAGE, SCRAPE, restart=("0", "1"))
    _report("store_down_both_agents_restarted", **store)
    assert store["series"] > 100 and store["lost"] == 0, store
    assert store["spurious_pages"] == [], store
    # nothing expired in Alertmanager meanwhile (vmalert sends nothing while its queries fail)
    assert store["active_alerts_before"] > 0, store
    assert store["active_alerts_min_during"] == store["active_alerts_before"], store

    # -- 3. an exporter of c1 dies; Alertmanager peer 0 crashes before the page is due (40 s `for:`):
    #       the page goes out once, through peer 1, and the restarted peer 0 stays quiet ---------------
    node = "c1-node-2"
    t0 = time.time()
    fleet.kill(node)
    time.sleep(15)
    t_am = time.time()
    fleet.kill("alertmanager-0")

    def paged():
        return [e for e in fleet.sink.events(t0) if e["labels"].get("alertname") == "GPUExporterDown"
                and e["status"] == "firing"]
    first = wait_until(paged, timeout=120, interval=1, what="GPUExporterDown paged")
    assert {e["labels"]["node"] for e in first} == {node}
    assert not fleet.sup.running("alertmanager-0")
    paged_after = first[0]["time"] - t0
    time.sleep(max(0.0, OUTAGE - (time.time() - t_am)))
    fleet.restart("alertmanager-0")
    t1 = time.time()
    time.sleep(20)  # the restarted peer receives the alerts again (resend delay 10 s) and must stay quiet
    am_spurious = spurious_pages(fleet, t0, before, allowed={"GPUExporterDown"})
    pages = [e for e in fleet.sink.events(t0) if e["labels"].get("alertname") == "GPUExporterDown"]
    _report("alertmanager_peer_killed_exporter_killed", am_down_s=round(t1 - t_am),
            exporter_paged_after_s=round(paged_after), exporter_notifications=len(pages), spurious_pages=am_spurious)
    assert am_spurious == [] and len(pages) == 1, (am_spurious, pages)

    # -- 4. vmalert replica 0 crashes for 20 s: no missed, resolved or repeated page; the restarted
    #       replica restores its alerts' `for` state from the raw store (-remoteRead.url): the
    #       dead exporter's alert is firing again at once, active since the same moment ----------
    (held,) = wait_until(lambda: [a for a in _vmalert_alerts(fleet, "0", "GPUExporterDown") if a["state"] == "firing"],
                         timeout=30, interval=1, what="GPUExporterDown firing on vmalert-0")
    before = notified_firing(fleet)
    t0 = time.time()
    fleet.kill("vmalert-0")
    time.sleep(OUTAGE)
    fleet.restart("vmalert-0")
    t1 = time.time()
    # vmalert restores after its first evaluation: pending for one evaluation, with the old
    # activeAt, then firing.  Without the restore it would stay pending, active since the
    # restart, for the whole 40 s `for:`
    (back,) = wait_until(lambda: [a for a in _vmalert_alerts(fleet, "0", "GPUExporterDown") if a["state"] == "firing"],
                         timeout=10, interval=0.5, what="GPUExporterDown firing again on the restarted vmalert-0")
    firing_after = time.time() - t1
    time.sleep(20)
    vmalert_spurious = spurious_pages(fleet, t0, before)
    _report("vmalert_killed", seconds=round(t1 - t0), spurious_pages=vmalert_spurious,
            firing_again_after_s=round(firing_after, 1), active_at_shift_s=round(_active_at(back) - _active_at(held), 3))
    assert vmalert_spurious == []
    assert abs(_active_at(back) - _active_at(held)) <= 1.0, (held, back)

    # -- the dead exporter is still paged (firing, never resolved) after all of it -----------------
    still = [a for a in fleet.alertmanager_alerts("alertmanager-1") if a["labels"]["alertname"] == "GPUExporterDown"]
    resolved = [e for e in fleet.sink.events() if e["labels"].get("alertname") == "GPUExporterDown"
                and e["status"] == "resolved"]
    since_page = time.time() - first[0]["time"]
    _report("exporter_still_paged", seconds_after_first_page=round(since_page), firing=len(still), resolved=len(resolved))
    assert [a["labels"]["node"] for a in still] == [node] and resolved == []
    # no process died on its own through all of it (the killed ones were killed on purpose)
    assert fleet.failed() == [], {name: fleet.logs(name, 1500) for name in fleet.failed()}


@pytest.mark.soak
@pytest.mark.optional_in_ci
@pytest.mark.skipif(not SOAK, reason="soak test: run with `make soak` (SOAK=1 pytest -m soak)")
def test_fleet_faults_soak(tmp_path):
    """Real timing (the rules' own `for:` and 1 m group intervals, 15 s scrapes): a dead exporter
    pages within a few minutes and is still paged 10 minutes later; a cluster whose two agents are
    dead is paged within 10 minutes of its last sample and stays paged."""
    for name, package in BINARIES:
        require_binary(name, package)
    mod = load_fleet_module()
    f = mod.Fleet(tmp_path, _clusters(mod), scrape_interval="15s", eval_interval="1m", max_for=None,
                  latency_offset="30s", resend_delay="1m", group_wait="30s")
    f.start(timeout=180)
    try:
        time.sleep(120)  # the agents' first scrapes reach the store, the expected lists fill
        t0 = time.time()
        f.kill("c1-node-2")
        f.kill("agent-c2-0")
        f.kill("agent-c2-1")

        def page(name):
            return [e for e in f.sink.events(t0) if e["labels"].get("alertname") == name and e["status"] == "firing"]
        down = wait_until(lambda: page("GPUExporterDown"), timeout=480, interval=5, what="GPUExporterDown paged")
        cluster = wait_until(lambda: page("GPUClusterNotReporting"), timeout=660, interval=5,
                             what="GPUClusterNotReporting paged")
        time.sleep(max(0.0, down[0]["time"] + 600 - time.time()))
        firing = {a["labels"]["alertname"] for a in f.alertmanager_alerts("alertmanager-1")}
        resolved = [e for e in f.sink.events(t0) if e["status"] == "resolved"
                    and e["labels"].get("alertname") in ("GPUExporterDown", "GPUClusterNotReporting")]
        _report("soak", exporter_paged_after_s=round(down[0]["time"] - t0),
                cluster_paged_after_s=round(cluster[0]["time"] - t0), still_firing=sorted(firing), resolved=len(resolved))
        assert down[0]["time"] - t0 < 360 and cluster[0]["time"] - t0 < 600
        assert {"GPUExporterDown", "GPUClusterNotReporting"} <= firing and resolved == []
    finally:
        f.stop()
