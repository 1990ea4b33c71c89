"""What survives a reload: each source's series and stats, mapper counter state and what the
indicators learned."""

from __future__ import annotations

from ..map.mapping import MappingSet
from ..map.store import Store
from .feed import IndicatorFeed
from .runner import SourceRunner


def carry_mapper_state(old: list[SourceRunner], new: list[SourceRunner], old_mappings: MappingSet | None,
                       new_mappings: MappingSet | None) -> None:
    """Counter totals survive a reload (a counter never goes back, even after a reset the mapper
    compensated).  The raw readings behind rates and deltas carry over only when the mapping
    rules are unchanged (their keys name rules by position)."""
    def rules(ms: MappingSet | None) -> dict:
        return {n: cm.rules for n, cm in ms.mappings.items()} if ms is not None else {}
    same_rules = rules(old_mappings) == rules(new_mappings)
    by_name = {rt.state.name: rt for rt in old}
    for rt in new:
        prev = by_name.get(rt.state.name)
        if prev is not None:
            rt.mapper.carry_over(prev.mapper, raw=same_rules)


def carry_indicator_state(old: IndicatorFeed | None, new: IndicatorFeed | None) -> None:
    """A reload keeps what the indicators learned (``IndicatorEngine.carry_over``): baselines,
    the only copy without --state.dir, and the counters that must never go back."""
    if old is None or new is None or old is new:
        return
    new.engine.carry_over(old.engine)
    if new.fast_until != float("inf"):  # fast sampling on before the reload stays on for its hold
        new.fast_until = old.fast_until if old.fast_until != float("inf") else 0.0


def carry_source_state(old: Store, new: Store) -> None:
    """Each source that was running before keeps serving what it had until it polls again, and
    keeps its stats (``SourceStats.carry_from``: health and every per-source counter declared in
    render/self_metrics.py, whatever is added there; a counter never goes back on a reload)."""
    for name, st in new.sources.items():
        prev = old.sources.get(name)
        if prev is not None and st.stats.state == "starting":
            st.carry_from(prev)
