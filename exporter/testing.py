"""Helpers for tests: run one source through its mapping without starting the daemon."""

from __future__ import annotations

from pathlib import Path

from .map.mapper import Mapper
from .map.mapping import MappingSet
from .map.schema import default_mappings_dir, load_schema
from .map.store import SourceState, Store
from .model import Frames, Labels, Sample, identity_labels
from .run.pipeline import poll_and_map
from .sources.base import Source, abilities_of
from .sources.context import SourceContext

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def load_mappings(directory: Path | None = None) -> MappingSet:
    directory = directory or default_mappings_dir()
    return MappingSet.load_dir(directory, load_schema(directory / "canonical.yaml"))


def shipped_context(mappings: MappingSet | None = None, **fields) -> SourceContext:
    """A ``SourceContext`` as the daemon builds it from the shipped mapping set (``wanted`` and
    ``fast`` included); ``fields`` are the other ``SourceContext`` fields (sysfs, options...)."""
    return SourceContext.from_mappings(mappings or load_mappings(), **fields)


def shipped_fast_fields(mapping: str) -> frozenset[str]:
    """The raw fields of the shipped mapping file ``mapping`` that feed a ``fast: true`` metric."""
    return shipped_context().fast_fields(mapping) or frozenset()


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
    mapper = Mapper(mappings, interval=interval)
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
    return {(name, frozenset(labels)): v for (name, labels), v in flat(result.frames).items()}


def flat(frames: Frames) -> dict[tuple[str, Labels], float]:
    """``frames`` as one dict, keyed by (name, all labels: identity first, then the extra ones),
    the way the exposition names each series (for assertions)."""
    return {(name, identity_labels(dev_id) + extra): v
            for dev_id, frame in frames.items() for (name, extra), v in frame.items()}


def frames_of(series: dict[tuple[str, Labels], float]) -> Frames:
    """The inverse of ``flat``: series keyed by (name, labels with vendor, gpu, uuid first)."""
    out: Frames = {}
    for (name, labels), v in series.items():
        dev_id = (labels[0][1], labels[1][1], labels[2][1])
        out.setdefault(dev_id, {})[(name, tuple(sorted(labels[3:])))] = v
    return out


def values_of(series: Series, metric: str, **labels: str) -> list[float]:
    """Values of every series of ``metric`` whose labels include ``labels``."""
    want = set(labels.items())
    return [v for (name, lbls), v in series.items() if name == metric and want <= lbls]


def samples(frames: Frames) -> list[Sample]:
    """``frames`` as rendered samples (name, all labels: identity first, value), GPU after GPU."""
    return [Sample(name, identity_labels(dev_id) + extra, v)
            for dev_id, frame in frames.items() for (name, extra), v in frame.items()]
