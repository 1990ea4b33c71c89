"""``SourceContext``: the one thing a source is created with."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from .options import Options

OptionsT = TypeVar("OptionsT", bound=Options)


@dataclass(frozen=True, slots=True)
class SourceContext:
    """What a source is created with (``registry.create_source``; tests build one directly).

    ``options``: the collector's options, typed (``collectors.<name>.options``, validated with
    the configuration file); a plain dict, as tools and tests pass, is validated by the source's
    model in ``typed``.  ``wanted``: per mapping file, the raw fields its rules map
    (``MappingSet.raw_fields``); None, without a mapping set, means read everything.  ``fast``:
    per mapping file, the raw fields feeding a metric declared ``fast: true`` in
    ``mappings/canonical.yaml`` (``MappingSet.raw_fields(schema.fast_metrics)``): what a
    source's ``poll_fast`` reads; the one place "fast" is declared.
    ``mappings``: the loaded mapping set itself, for the sources whose work is the rules
    (the daemon passes it to every source; only upstream's schema detection and the simulator
    read it).
    """

    sysfs: Path = Path("/sys")
    procfs: Path = Path("/proc")
    options: Options | Mapping[str, Any] | None = None
    wanted: Mapping[str, frozenset[str]] | None = None
    mappings: Any = None
    fast: Mapping[str, frozenset[str]] | None = None

    @classmethod
    def from_mappings(cls, mappings: Any, **fields: Any) -> SourceContext:
        """The context the daemon creates sources with: ``wanted`` and ``fast`` from the loaded
        mapping set (``fields``: sysfs, procfs, options)."""
        return cls(wanted=mappings.raw_fields(), mappings=mappings,
                   fast=mappings.raw_fields(mappings.schema.fast_metrics), **fields)

    def typed(self, model: type[OptionsT]) -> OptionsT:
        """The options as ``model`` (the defaults where none were given)."""
        given = self.options
        if isinstance(given, model):
            return given
        if isinstance(given, Options):  # a collector registered without a model of its own
            given = given.options_dict()
        return model.model_validate(dict(given or {}))

    def fields(self, mapping: str) -> frozenset[str] | None:
        """The raw fields mapping file ``mapping`` maps; None (no mapping set, or no such file in
        it): nothing to go by, read everything."""
        return None if self.wanted is None else self.wanted.get(mapping)

    def fast_fields(self, mapping: str) -> frozenset[str] | None:
        """The raw fields of mapping file ``mapping`` that feed a ``fast: true`` metric; None
        without a mapping set (a fast poll then has nothing to go by and reads everything)."""
        return None if self.fast is None else self.fast.get(mapping, frozenset())


DEFAULT_CONTEXT = SourceContext()
