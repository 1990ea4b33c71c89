"""The unit of ``DCGM_FI_DEV_GPU_UTIL_RATIO`` (0-100 % under DCGM 4.6, 0-1 under DCGM 4.7) is
decided from the evidence of every scrape so far, per host behind a target, and only narrows.

Each case runs one upstream source (the daemon's cycle, ``poll_and_map``, over a local HTTP
server and the shipped mapping set) through several scrapes of the same target, changing what
the target serves between them.  The names of every body prove only "DCGM 4.6 or newer"
(``GPU_UTIL_RATIO`` and ``GPU_TEMP_CELSIUS``) unless a case adds a DCGM 4.7 name.
"""

from __future__ import annotations

import logging

import pytest

from exporter.map.mapper import Mapper
from exporter.map.store import SourceState, Store
from exporter.run.pipeline import poll_and_map
from exporter.sources.upstream import UpstreamDown
from exporter.testing import flat
from tests.test_upstream_http import Route
from tests.test_upstream_versions import source

UTIL = "gpu_compute_utilization_percent"
FB_CAPACITY = "DCGM_FI_DEV_FB_CAPACITY_BYTES"  # a DCGM 4.7 name: the target is 4.9 or newer


def body(*gpus: tuple[str, float], help_text: str = "", extra: tuple[str, ...] = ()) -> str:
    """One GPU per (host, value); a GPU's uuid ends in its position.  ``extra``: more metric
    names, each served for every GPU with the value 1."""
    out = [f"# HELP DCGM_FI_DEV_GPU_UTIL_RATIO {help_text}"] if help_text else []
    for i, (host, value) in enumerate(gpus):
        labels = (f'gpu="{i}",UUID="GPU-5b7c3a2e-9d41-4f6a-b8e2-1c0d9e8f7a{i:02d}",'
                  f'pci_bus_id="00000000:{0x10 + i:02X}:00.0",hostname="{host}"')
        out.append(f"DCGM_FI_DEV_GPU_UTIL_RATIO{{{labels}}} {value}")
        out.append(f"DCGM_FI_DEV_GPU_TEMP_CELSIUS{{{labels}}} 50")
        out.extend(f"{name}{{{labels}}} 1" for name in extra)
    return "\n".join(out) + "\n"


class Target:
    """One upstream target scraped again and again by one source (its schema memory kept)."""

    def __init__(self, server, mappings, path: str) -> None:
        self.server, self.path = server, path
        self.src = source(server, path, "")
        self.src.open()
        self.store, self.state, self.mapper = Store(), SourceState("upstream"), Mapper(mappings)
        self.store.add(self.state)
        self.t = 1000.0

    def scrape(self, text: str) -> tuple[list[float | None], tuple[str, ...], int]:
        """(utilization of each GPU in body order, None where not exported; the schemas
        reported; the readings skipped as unit_ambiguous)."""
        self.server.routes[self.path] = Route(body=text.encode())
        self.t += 1.0
        cycle = poll_and_map(self.src.poll, self.store, self.state, self.mapper, now=self.t)
        self.state.devices = cycle.devices
        got = {dict(labels)["gpu"]: v for (name, labels), v in flat(cycle.result.frames).items() if name == UTIL}
        gpus = text.count("DCGM_FI_DEV_GPU_UTIL_RATIO{")
        schemas = tuple(sorted(dict(labels)["schema"] for name, labels, _ in cycle.sample.self_samples
                               if name == "upstream_schema_info"))
        return [got.get(str(i)) for i in range(gpus)], schemas, cycle.sample.errors["unit_ambiguous"]

    def fail(self) -> None:
        self.server.routes[self.path] = Route(status=500)
        with pytest.raises(UpstreamDown):
            self.src.poll()


@pytest.fixture
def target(server, mappings):
    made: list[Target] = []

    def make(path: str) -> Target:
        made.append(Target(server, mappings, path))
        return made[-1]
    yield make
    for t in made:
        t.src.close()


def test_a_saturated_gpu_keeps_the_unit_an_earlier_scrape_proved(target) -> None:
    """Idle (0 proves nothing), then 0.5 (only a ratio): from then on 1.0 is 100 %, not dropped,
    and the schema reported only narrows (4.6 or newer -> 4.7), never churns to ambiguous."""
    t = target("/mem-ratio")
    assert t.scrape(body(("node-a", 0))) == ([0], ("dcgm-4.6",), 0)
    assert t.scrape(body(("node-a", 0.5))) == ([50], ("dcgm-4.7",), 0)
    assert t.scrape(body(("node-a", 1.0))) == ([100], ("dcgm-4.7",), 0)
    assert t.scrape(body(("node-a", 0))) == ([0], ("dcgm-4.7",), 0)


def test_a_percent_proved_once_reads_1_as_1_percent(target) -> None:
    """45 cannot be a ratio: the INT64 percent of field 203; 1 is then 1 %."""
    t = target("/mem-pct")
    assert t.scrape(body(("node-a", 45))) == ([45], ("dcgm-4.6",), 0)
    assert t.scrape(body(("node-a", 1))) == ([1], ("dcgm-4.6",), 0)


def test_the_memory_is_forgotten_when_the_target_fails_or_its_names_change(target) -> None:
    """An upgrade restarts the exporter (the target fails meanwhile) or changes its names: what
    the old version's values proved says nothing about the new one."""
    t = target("/mem-reset")
    assert t.scrape(body(("node-a", 0.5)))[0] == [50]
    t.fail()
    assert t.scrape(body(("node-a", 1.0))) == ([None], ("dcgm-4.6",), 1)
    assert t.scrape(body(("node-a", 0.5)))[0] == [50]
    renamed = body(("node-a", 1.0), extra=("DCGM_FI_DEV_BOARD_POWER_WATTS",))
    assert t.scrape(renamed) == ([None], ("dcgm-4.6",), 1)


def test_contradicting_values_pick_nothing_and_stay_ambiguous_until_reset(target) -> None:
    """45 is only a percent, 0.5 only a ratio: one exporter cannot serve both, so neither is
    read, and later scrapes that fit one unit do not pick it; a failed target resets."""
    t = target("/mem-contra")
    assert t.scrape(body(("node-a", 45), ("node-a", 0.5))) == ([None, None], ("dcgm-ambiguous",), 2)
    assert t.scrape(body(("node-a", 45), ("node-a", 1.0))) == ([None, None], ("dcgm-ambiguous",), 2)
    t.fail()
    assert t.scrape(body(("node-a", 45), ("node-a", 1.0))) == ([45, 1], ("dcgm-4.6",), 0)


def test_a_mixed_fleet_behind_one_target_is_read_per_host(target) -> None:
    """A federating target: node-a runs 4.8.3 (percent), node-b 4.9 with the same custom CSV
    (ratio).  node-b's 1.0 is never 1 %: unproven it is skipped, proven (0.5) it is 100 %."""
    t = target("/mixed")
    assert t.scrape(body(("node-a", 45), ("node-b", 1.0))) == ([45, None], ("dcgm-4.6",), 1)
    assert t.scrape(body(("node-a", 45), ("node-b", 0.5))) == ([45, 50], ("dcgm-4.6", "dcgm-4.7"), 0)
    assert t.scrape(body(("node-a", 1), ("node-b", 1.0))) == ([1, 100], ("dcgm-4.6", "dcgm-4.7"), 0)


def test_a_nan_on_one_gpu_does_not_drop_the_field_of_the_others(target) -> None:
    """NaN is no evidence (the mapper skips and counts it): the other GPUs' values decide."""
    t = target("/nan")
    assert t.scrape(body(("node-a", 45), ("node-a", "NaN"))) == ([45, None], ("dcgm-4.6",), 0)
    t = target("/nan-ratio")
    assert t.scrape(body(("node-a", 0.5), ("node-a", "NaN"))) == ([50, None], ("dcgm-4.7",), 0)


def test_a_carried_over_percent_help_does_not_override_the_names(target, caplog) -> None:
    """A 4.9 target (FB_CAPACITY_BYTES) whose custom CSV kept the old "%" HELP text: the names
    prove the ratio; the text is ignored and logged, the target is not ambiguous."""
    t = target("/help-49")
    with caplog.at_level(logging.WARNING, logger="exporter.sources.upstream"):
        got = t.scrape(body(("node-a", 0.97), help_text="GPU utilization (in %).", extra=(FB_CAPACITY,)))
    assert got == ([97], ("dcgm-4.7",), 0)
    assert "HELP text of DCGM_FI_DEV_GPU_UTIL_RATIO names a unit that the names and values rule out" in caplog.text
    assert t.scrape(body(("node-a", 1.0), help_text="GPU utilization (in %).", extra=(FB_CAPACITY,))) == (
        [100], ("dcgm-4.7",), 0)


def test_a_percent_help_alone_never_reads_1_as_1_percent(target) -> None:
    """Names proving only 4.6+, an old "%" HELP, value 1.0: the 4.9 exporter that kept the CSV
    would mean 100 %; the text cannot tell, so it is skipped, not exported as 1 %.  0 is 0 in
    both units."""
    t = target("/help-pct")
    assert t.scrape(body(("node-a", 1.0), help_text="GPU utilization (in %).")) == ([None], ("dcgm-4.6",), 1)
    assert t.scrape(body(("node-a", 0), help_text="GPU utilization (in %).")) == ([0], ("dcgm-4.6",), 0)
    # a "ratio" text cannot have been carried over from a percent CSV: it breaks the tie
    assert t.scrape(body(("node-a", 1.0), help_text="GPU utilization (ratio 0-1).")) == ([100], ("dcgm-4.7",), 0)
