"""The contract between a source and the rest of the daemon.

A source only reads hardware (or a file tree, or a library) and returns raw readings in the
vendor's own field names and units.  It knows nothing about canonical names: the mapping file
named by each device (``Device.mapping``) turns raw readings into canonical series.

A source is created with one ``SourceContext`` (``sources/context.py``): the file trees, its
collector's typed options (``sources/options.py``) and, per mapping file, the raw fields its rules
map (``wanted``), so a source may skip reading what no rule maps; the mapping set itself only
for the sources whose work is the rules (upstream's schema detection, the simulator).

Sources are synchronous; the daemon runs each one in its own worker thread with a timeout, so a
source may block (NVML, amdsmi, slow sysfs files) without stalling anything else.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

from ..model import Device, Labels, PollResult, Reading

__all__ = ["Abilities", "Device", "PollFailed", "PollResult", "Reading", "Source", "SourceBase",
           "SourceUnavailable", "abilities_of"]


class SourceUnavailable(Exception):
    """Raised by ``Source.open`` when the backend is absent (library missing, no devices).

    The message is shown once in the log and in ``unified_gpu_exporter_source_info``; it is not an
    error of the exporter.
    """


class PollFailed(Exception):
    """A poll that failed as a whole, saying why in error kinds (as ``PollResult.errors`` would).

    The daemon adds ``errors`` to the source's error counters instead of one ``exception``.
    """

    def __init__(self, errors: Counter[str], message: str) -> None:
        super().__init__(message)
        self.errors = errors


@dataclass(frozen=True, slots=True)
class Abilities:
    """What a source can do beyond ``open``/``poll``/``close``; the daemon reads nothing else.

    ``secondary``: its GPUs give way to a native source reading the same GPU (upstream scrape).
    ``provides_identity``: its devices name GPUs; False for a source that borrows identity from
    others by PCI address or UUID (profiler artefacts).
    ``fast_poll``: ``poll_fast`` returns the fast-changing readings (power, clocks) cheaply and the
    daemon calls it between full polls.
    ``observes_indicators``: ``observe_indicator_output`` is handed the indicators' output each
    fast cycle (the profiles source arms triggered captures from it): the one edge from the
    indicators back to a source.
    """

    secondary: bool = False
    provides_identity: bool = True
    fast_poll: bool = False
    observes_indicators: bool = False


DEFAULT_ABILITIES = Abilities()


def abilities_of(source: object) -> Abilities:
    """The abilities ``source`` declares; a duck-typed source (a test double) has the defaults."""
    declared = getattr(type(source), "abilities", None)
    return declared if isinstance(declared, Abilities) else DEFAULT_ABILITIES


@runtime_checkable
class Source(Protocol):
    """One backend.  ``name`` is the collector name used by ``--collector.<name>``; the class
    is created with one ``SourceContext`` (``registry.create_source``) and opened later."""

    name: ClassVar[str]
    abilities: ClassVar[Abilities]  # optional: a source without it has DEFAULT_ABILITIES

    def open(self) -> None:
        """Initialise the backend; raise ``SourceUnavailable`` with a reason when it is absent."""

    def poll(self) -> PollResult:
        """Read every device once.  Must not raise for a single bad device or value."""

    def close(self) -> None:
        """Release the backend.  Called on shutdown and before a reload re-opens it."""


class SourceBase:
    """Explicit defaults for the optional part of the contract; every built-in source derives
    from it and states what it can do in ``abilities``."""

    name: ClassVar[str]
    abilities: ClassVar[Abilities] = DEFAULT_ABILITIES

    def open(self) -> None:
        pass

    def poll(self) -> PollResult:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def poll_fast(self) -> PollResult:
        """Only the fast-changing readings; called when ``abilities.fast_poll``."""
        raise NotImplementedError(f"{type(self).__name__} does not declare fast_poll")

    def observe_indicator_output(self, now: float, samples: Iterable[tuple[str, Labels, float]]) -> int:
        """Called with the indicators' output when ``abilities.observes_indicators``."""
        return 0
