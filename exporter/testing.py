"""Helpers for tests: run one source through its mapping without starting the daemon."""

from __future__ import annotations

from pathlib import Path

from .mapper import Mapper
from .mapping import MappingSet
from .pipeline import poll_and_map
from .schema import default_mappings_dir, load_schema
from .sources.base import Source, abilities_of
from .store import SourceState, Store

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def load_mappings(directory: Path | None = None) -> MappingSet:
    directory = directory or default_mappings_dir()
    return MappingSet.load_dir(directory, load_schema(directory / "canonical.yaml"))


class FakeClock:
    def __init__(self, start: float = 1000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now


def map_source_once(source: Source, cycles: int = 2, interval: float = 1.0,
                    mappings: MappingSet | None = None, opened: bool = False) -> Series:
    """Open ``source``, poll it ``cycles`` times ``interval`` fake seconds apart, map the last poll.

    Returns {(sample name, frozenset of all label pairs incl. vendor/gpu/uuid): value}.
    """
    mappings = mappings or load_mappings()
    mapper = Mapper(mappings)
    store = Store()
    state = SourceState(getattr(source, "name", "test"))
    state.provides_identity = abilities_of(source).provides_identity
    store.add(state)
    if not opened:
        source.open()
    result = None
    try:
        t = 1000.0
        for i in range(cycles):
            cycle = poll_and_map(source.poll, store, state, mapper, now=t + i * interval)
            state.devices = cycle.devices
            result = cycle.result
    finally:
        if not opened:
            source.close()
    assert result is not None
    return {(name, frozenset(labels)): v for (name, labels), v in result.series.items()}


def values_of(series: Series, metric: str, **labels: str) -> list[float]:
    """Values of every series of ``metric`` whose labels include ``labels``."""
    want = set(labels.items())
    return [v for (name, lbls), v in series.items() if name == metric and want <= lbls]
