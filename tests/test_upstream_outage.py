"""A throughput gauge integrated into a byte counter (``transform: integrate``: dcgm-exporter's
NVLink throughput -> ``gpu_interconnect_bytes_total``) adds nothing for time it did not read.

Each case runs the daemon's own cycle (``poll_and_map``) over the upstream source and a local
HTTP server, on a fake clock: a poll that raises (the target answers HTTP 500, so the source
raises UpstreamDown and map() never runs) must not let the next successful poll multiply the
throughput by the whole outage, and a junk reading must not inflate the counter for good.
"""

from __future__ import annotations

import pytest

from exporter.map.mapper import Mapper
from exporter.map.store import SourceState, Store
from exporter.run.pipeline import Cycle, poll_and_map
from exporter.sources.upstream import UpstreamDown
from exporter.testing import flat
from tests.test_upstream_http import Route
from tests.test_upstream_samples import canon, m
from tests.test_upstream_versions import DATA, OLDEST, source

NVLINK = m("gpu_interconnect_bytes_total", interconnect="nvlink", direction="total")
RATE = 12500 * 1024000  # the oldest format's NVLINK_BANDWIDTH_TOTAL 12500, in B/s
INTERVAL = 1.0


class Cycles:
    """The runner's cycle for one upstream target, one call per fake second given."""

    def __init__(self, server, mappings, path: str, body: str) -> None:
        self.server, self.path = server, path
        self.src = source(server, path, body)
        self.src.open()
        self.store, self.state = Store(), SourceState("upstream")
        self.store.add(self.state)
        self.mapper = Mapper(mappings, interval=INTERVAL)  # as build_runner makes it

    def serve(self, body: str | None = None, status: int = 200) -> None:
        self.server.routes[self.path] = Route(body=(body or "").encode(), status=status)

    def cycle(self, t: float) -> Cycle:
        cycle = poll_and_map(self.src.poll, self.store, self.state, self.mapper, now=t)
        self.state.devices = cycle.devices
        return cycle

    def at(self, t: float) -> dict:
        return series(self.cycle(t))

    def close(self) -> None:
        self.src.close()


def series(cycle: Cycle) -> dict:
    return canon(flat(cycle.result.frames))


@pytest.fixture
def cycles(server, mappings):
    made: list[Cycles] = []

    def make(path: str) -> Cycles:
        c = Cycles(server, mappings, path, (DATA / OLDEST).read_text())
        made.append(c)
        return c
    yield make
    for c in made:
        c.close()


def test_a_failed_poll_in_the_middle_adds_no_bytes_for_the_outage(cycles) -> None:
    """10 minutes of target outage (every poll raises UpstreamDown): the counter resumes where it
    stopped; the first poll after it restarts the window, the next one adds one interval."""
    c = cycles("/outage")
    body = (DATA / OLDEST).read_text()
    assert c.at(1000.0)[NVLINK] == 0                      # first sight: from 0
    assert c.at(1001.0)[NVLINK] == RATE                   # one second at 12.8 GB/s
    c.serve(status=500)
    for t in (1002.0, 1003.0, 1300.0, 1600.0):
        with pytest.raises(UpstreamDown):
            c.at(t)
    c.serve(body)
    assert c.at(1601.0)[NVLINK] == RATE                   # not RATE + 600 s x RATE
    assert c.at(1602.0)[NVLINK] == 2 * RATE               # consecutive again: one interval
    # a slow poll within 2 intervals still counts (the runner's ticks are not exact)
    assert c.at(1603.8)[NVLINK] == pytest.approx(2 * RATE + 1.8 * RATE)


def test_a_junk_throughput_reading_is_malformed_not_added(cycles) -> None:
    """One reading of 10^10 units (10^16 B/s, far above any NVLink) is skipped and counted; it
    neither jumps the counter nor poisons the next window."""
    c = cycles("/junk")
    body = (DATA / OLDEST).read_text()
    assert "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{" in body and "} 12500\n" in body
    assert c.at(1000.0)[NVLINK] == 0
    assert c.at(1001.0)[NVLINK] == RATE
    c.serve(body.replace("} 12500\n", "} 10000000000\n"))
    cycle = c.cycle(1002.0)
    assert cycle.result.malformed == 1
    assert series(cycle).get(NVLINK, RATE) == RATE        # unchanged (or absent this poll)
    c.serve(body)
    assert c.at(1003.0)[NVLINK] == RATE                   # the junk poll had no value: window restarts
    assert c.at(1004.0)[NVLINK] == 2 * RATE
