"""What survives a reload: mapper counter state and what the indicators learned."""

from __future__ import annotations

from .indicator_feed import IndicatorFeed
from .mapping import MappingSet
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
        if prev is None:
            continue
        rt.mapper._poll = prev.mapper._poll
        rt.mapper._totals = dict(prev.mapper._totals)
        if same_rules:
            rt.mapper._raw = dict(prev.mapper._raw)


def carry_indicator_state(old: IndicatorFeed | None, new: IndicatorFeed | None) -> None:
    """A reload keeps what the indicators learned: baselines (newer in memory than in any state
    file, and the only copy without --state.dir) and the per-device counters, which must never
    go back (gpu_memory_contention_seconds_total, the cost counter)."""
    if old is None or new is None or old is new:
        return
    src, dst = old.engine, new.engine
    dst.baselines._data = src.baselines._data
    dst.baselines._restored = src.baselines._restored
    dst.baselines.flagged = src.baselines.flagged
    for device_id, st in src._devices.items():
        fresh = dst._state(device_id)
        fresh.contention_seconds = dict(st.contention_seconds)
        fresh.cost_dollars = st.cost_dollars
        # how long a deviation or drop has been held: a reload neither resets nor re-raises it
        fresh.flagged_seconds = dict(st.flagged_seconds)
        fresh.idle_seconds, fresh.drop_seconds, fresh.state = st.idle_seconds, st.drop_seconds, st.state
