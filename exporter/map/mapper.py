"""``Mapper``: applies compiled mapping files to one source's raw readings, poll after poll.

Mapping a reading is one dict lookup on the raw field name followed by arithmetic.  State that
outlives one poll (counter offsets across resets, the previous value for rates) lives here, one
``Mapper`` per source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..model import Device, DeviceId, Frames, PollResult, SeriesId
from .derive import Deriver
from .profiling_guard import AVAILABLE, Held, apply_guard

if TYPE_CHECKING:
    from .mapping import MappingSet, ProfilingGuard, Rule

# a series while one poll is mapped: (GPU, series within the GPU's frame); grouped per GPU at the end
Key = tuple[DeviceId, SeriesId]


@dataclass(slots=True)
class _RawState:
    """The previous value of one raw counter (per device, rule and raw labels)."""

    last_raw: float
    last_t: float
    seen: int  # poll number when last read


@dataclass
class MapResult:
    frames: Frames = field(default_factory=dict)  # per GPU, its canonical series
    malformed: int = 0
    malformed_fields: list[str] = field(default_factory=list)  # the raw field of each, for the log


# raw counter state and exported totals not seen for this many polls are forgotten (a device or
# link that went away); a shorter gap (one missed poll, a flapping fallback) keeps them
STATE_TTL_POLLS = 120
MAX_STATE = 200_000  # raw + total entries; above it, state of series absent this poll goes
# ``transform: integrate`` adds value x seconds only over a step between two mapped polls no
# longer than this many expected poll intervals: a longer one spans polls that failed outright
# (the source raised, map() never ran), and the throughput during that outage is unknown
INTEGRATE_MAX_STEPS = 2.0


class Mapper:
    """Turns one source's samples into canonical series; keeps counter and rate state.

    Counter metrics are exported as a running total per canonical series: each poll adds the
    delta of the raw counter that feeds the series (a decrease is a reset: the new value is the
    delta), so the total never goes down, even when the feeding raw counter changes (fallback) or
    a poll misses the value.

    Values of ``profiling: true`` rules go through the file's profiling guard
    (``profiling_guard.py``); what it skips is counted in ``sample.errors`` as
    ``profiling_unavailable`` (the runner adds a poll's errors after mapping it).
    """

    def __init__(self, mappings: MappingSet, interval: float | None = None):
        self.mappings = mappings
        # the source's poll interval (seconds; None: learned as the shortest step between two
        # map() calls) and the time of the previous map(): bound what ``integrate`` assumes
        self.interval = interval if interval and interval > 0 else None
        self._last_t: float | None = None
        self._min_step = 0.0
        self._step_ok = False  # this map()'s step is short enough to integrate over
        # (device key, raw field, raw labels) -> (device, plan): the rules with their series keys,
        # value lookups and raw-state keys, built on first sight, so a poll builds no label tuples
        self._plans: dict[tuple, tuple[Device, tuple | None]] = {}
        self._ids: dict[DeviceId, DeviceId] = {}  # one interned id per GPU: frames grouped by identity
        self._lookups: dict[tuple, dict[float, float]] = {}  # a rule's value table -> its lookup dict
        self._raw: dict[tuple, _RawState] = {}
        self._totals: dict[Key, tuple[float, int]] = {}  # (total, poll last seen)
        self._poll = 0
        self._derived = Deriver(mappings.schema)  # derived metrics (canonical.yaml derive:)

    def map(self, sample: PollResult, devices: dict[str, Device]) -> MapResult:
        out = MapResult()
        self._poll += 1
        now = sample.monotonic
        self._step_ok = self._consecutive(now)
        # candidates per series: (order, combine, value) for gauges -- one tuple, or a list once
        # a second entry feeds the same series -- and a list of (order, combine, delta or None,
        # initial total) for counters
        gauges: dict[Key, tuple[int, str, float] | list[tuple[int, str, float]]] = {}
        counters: dict[Key, list[tuple[int, str, float | None, float]]] = {}
        plans = self._plans
        isfinite = math.isfinite
        bad: list[str] = []  # the raw field of each malformed reading (counted, logged by the runner)
        held: dict[str, list[Held]] = {}  # device key -> profiling values, for the guard
        blanks: dict[str, int] = {}  # device key -> blank profiling readings
        divisors: dict[tuple, float] = {}  # (device key, raw field, raw labels) -> value, for divide_by
        dividends: list[tuple] = []  # (device key, raw labels, rule, series key, raw value, raw field)
        for r in sample.readings:
            dev = devices.get(r.device)
            if dev is None:
                bad.append(r.field)
                continue
            hit = plans.get((r.device, r.field, r.labels))
            if hit is not None and (hit[0] is dev or hit[0] == dev):
                plan = hit[1]
            else:
                plan = self._compile(r, dev)
            if plan is None:
                continue  # no rule maps this raw field
            for rule, key, lookup, skey, simple in plan:
                value = r.value
                if simple:  # a plain gauge: scale and offset, nothing else to check
                    value = value * rule.scale + rule.offset
                    if not isfinite(value):
                        bad.append(r.field)
                        continue
                else:
                    if rule is None:  # a divisor (divide_by) of some rule: kept for after the loop
                        divisors[key] = value
                        continue
                    if value in rule.invalid:  # ``blank`` values (a vendor's "no value") are not errors
                        if rule.profiling:
                            blanks[r.device] = blanks.get(r.device, 0) + 1
                        elif value not in rule.blank:
                            bad.append(r.field)
                        break
                    if lookup is not None:
                        looked_up = lookup.get(value)
                        if looked_up is None:
                            bad.append(r.field)
                            continue
                        value = looked_up
                    if rule.divide_by is not None:  # its divisor may come later in the poll
                        dividends.append((r.device, r.labels, rule, key, value, r.field))
                        continue
                    if rule.is_counter:
                        if rule.integrate:  # a throughput gauge: its integral, from 0
                            if not (isfinite(value) and value >= 0) or (
                                    rule.valid and not rule.valid[0] <= value * rule.scale <= rule.valid[1]):
                                bad.append(r.field)  # a junk rate would inflate the counter for good
                                continue
                            delta, initial = self._integral(skey, rule, value, now), 0.0
                        else:
                            delta = self._delta(skey, rule, value, now)
                            initial = value * rule.scale
                        if not isfinite(initial) or (delta is not None and not isfinite(delta)):
                            bad.append(r.field)
                            continue
                        counters.setdefault(key, []).append((rule.order, rule.combine, delta, initial))
                        continue
                    if rule.rate:
                        value = self._rate(skey, rule, value, now)
                        if value is None:
                            continue
                    else:
                        value = value * rule.scale + rule.offset
                    if rule.valid and not rule.valid[0] <= value <= rule.valid[1]:
                        bad.append(r.field)  # e.g. an SM clock of -5 MHz: never exported
                        continue
                    if rule.clamp:
                        value = min(max(value, rule.clamp[0]), rule.clamp[1])
                    if not isfinite(value):  # overflow of a garbage raw value: never exported
                        bad.append(r.field)
                        continue
                    if rule.profiling:
                        held.setdefault(r.device, []).append((key, rule.order, rule.combine, value))
                        continue
                have = gauges.get(key)
                if have is None:
                    gauges[key] = (rule.order, rule.combine, value)
                elif type(have) is tuple:
                    gauges[key] = [have, (rule.order, rule.combine, value)]
                else:
                    have.append((rule.order, rule.combine, value))
        if dividends:
            bad.extend(self._divide(dividends, divisors, gauges))
        out.malformed, out.malformed_fields = len(bad), bad
        available = apply_guard(held, blanks, devices, gauges, self._guard_of,
                                sample.errors, _combine) if held or blanks else None
        frames = out.frames
        frame: dict[SeriesId, float] = {}
        at: DeviceId | None = None
        for (dev_id, sid), cands in gauges.items():
            if dev_id is not at:  # readings come device by device: one frame lookup per run
                at = dev_id
                frame = frames.get(dev_id)  # type: ignore[assignment]
                if frame is None:
                    frame = frames[dev_id] = {}
            frame[sid] = cands[2] if type(cands) is tuple else _combine(cands)  # type: ignore[arg-type]
        if available and AVAILABLE in self.mappings.schema.metrics:
            for dev_id, value in available.items():
                frames.setdefault(dev_id, {})[(AVAILABLE, ())] = value
        for key, cands in counters.items():
            total = self._total(key, cands)
            if total is not None:
                frames.setdefault(key[0], {})[key[1]] = total
        self._expire(devices)
        if self._derived:
            for frame in frames.values():
                self._derived.apply(frame)
        return out

    @staticmethod
    def _divide(dividends: list[tuple], divisors: dict[tuple, float], gauges: dict) -> list[str]:
        """The ``divide_by`` rules of one poll: raw value / divisor, then scale, offset, valid and
        clamp as any gauge; a missing, zero or non-finite result is skipped.  Returns the raw
        field of each skipped one."""
        malformed: list[str] = []
        for device, labels, rule, key, value, raw in dividends:
            div = divisors.get((device, rule.divide_by, labels))
            value = value / div * rule.scale + rule.offset if div else math.nan
            if not math.isfinite(value) or (rule.valid and not rule.valid[0] <= value <= rule.valid[1]):
                malformed.append(raw)
                continue
            if rule.clamp:
                value = min(max(value, rule.clamp[0]), rule.clamp[1])
            cand = (rule.order, rule.combine, value)
            have = gauges.get(key)
            gauges[key] = cand if have is None else [have, cand] if type(have) is tuple else [*have, cand]
        return malformed

    def _compile(self, r, dev: Device) -> tuple | None:
        cm = self.mappings.get(dev.mapping)
        rules = cm.rules.get(r.field) if cm is not None else None
        plan: tuple | None = None
        divisor = cm is not None and r.field in cm.divisors
        if divisor:  # a step that keeps the value for the rules dividing by it
            plan = ((None, (r.device, r.field, r.labels), None, None, False),)
        if rules:
            raw_labels = dict(r.labels) if r.labels else {}
            dev_id = self._ids.setdefault(dev.id, dev.id)
            steps = []
            for rule in rules:
                extra = dict(rule.fixed)
                for raw_name, canon in rule.label_map:
                    if raw_name in raw_labels:
                        extra[canon] = raw_labels[raw_name]
                key: Key = (dev_id, (rule.series, tuple(sorted(extra.items())) if extra else ()))
                simple = not (rule.invalid or rule.values or rule.is_counter or rule.rate
                              or rule.valid or rule.clamp or rule.profiling or rule.divide_by)
                lookup = None
                if rule.values:
                    lookup = self._lookups.get(rule.values)
                    if lookup is None:
                        lookup = self._lookups[rule.values] = dict(rule.values)
                # the raw-state key only where state is kept (counters, rates)
                skey = (r.device, rule.order, r.labels) if rule.is_counter or rule.rate else None
                steps.append((rule, key, lookup, skey, simple))
            plan = (plan or ()) + tuple(steps)
        if len(self._plans) >= MAX_STATE:
            self._plans.clear()  # bounded: a source inventing raw labels cannot grow it forever
            self._ids.clear()
        self._plans[(r.device, r.field, r.labels)] = (dev, plan)
        return plan

    def _guard_of(self, dev: Device) -> ProfilingGuard | None:
        cm = self.mappings.get(dev.mapping)
        return cm.profiling_guard if cm is not None else None

    def _total(self, key: Key, cands: list[tuple[int, str, float | None, float]]) -> float | None:
        cands.sort(key=lambda c: c[0])
        if cands[0][1] == "sum":
            used = cands
        else:
            used = cands[:1]  # the preferred raw counter present this poll
        prev = self._totals.get(key)
        if prev is None:
            total = sum(c[3] for c in used)  # starts at the device's own counter value
        else:
            # a raw counter seen for the first time (fallback switch) adds nothing this poll
            total = prev[0] + sum(c[2] for c in used if c[2] is not None)
        if not math.isfinite(total):
            return None
        self._totals[key] = (total, self._poll)
        return total

    def _step(self, skey: tuple, rule: Rule, raw: float, now: float) -> tuple[float, float] | None:
        """(raw increase, seconds) since the raw counter's last reading; None on first sight.

        A decrease is a wrap (with ``wrap``) or else a reset (driver reload): the increase is then
        the new raw value and the seconds are -1, so a rate skips that poll.
        """
        st = self._raw.get(skey)
        self._raw[skey] = _RawState(raw, now, self._poll)
        if st is None:
            return None
        delta = raw - st.last_raw
        if delta < 0:
            if rule.wrap is not None and st.last_raw < rule.wrap and raw < rule.wrap:
                delta += rule.wrap
            else:
                return raw, -1.0  # reset (driver reload): the counter restarted from zero
        return delta, now - st.last_t

    def _delta(self, skey: tuple, rule: Rule, raw: float, now: float) -> float | None:
        """Scaled increase of a raw counter since its last reading; None on first sight."""
        step = self._step(skey, rule, raw, now)
        return None if step is None else step[0] * rule.scale

    def _consecutive(self, now: float) -> bool:
        """Whether the step since the previous map() is one a run of consecutive polls makes:
        at most INTEGRATE_MAX_STEPS x the expected interval (the source's, or the shortest step
        seen, whichever is longer).  A poll that raised never reaches map(), so the step after an
        outage spans it and is refused here; with no interval known yet the first step is taken."""
        last, self._last_t = self._last_t, now
        if last is None or now <= last:
            return False
        step = now - last
        expected = max(self.interval or 0.0, self._min_step)
        ok = not expected or step <= INTEGRATE_MAX_STEPS * expected
        if ok:  # an outage's step does not teach the interval
            self._min_step = step if self._min_step <= 0 else min(self._min_step, step)
        return ok

    def _integral(self, skey: tuple, rule: Rule, raw: float, now: float) -> float | None:
        """A throughput gauge (the vendor's average over the window ending now) times the seconds
        since its reading in the previous poll; None on first sight, after a poll without a value
        (missed, blank, malformed) or a poll that failed outright (a step longer than
        consecutive polls make), or when no time passed: nothing is assumed for unread time."""
        st = self._raw.get(skey)
        self._raw[skey] = _RawState(raw, now, self._poll)
        if st is None or st.seen != self._poll - 1 or now <= st.last_t or not self._step_ok:
            return None
        return raw * rule.scale * (now - st.last_t)

    def _rate(self, skey: tuple, rule: Rule, raw: float, now: float) -> float | None:
        """Per-second rate of a raw counter between two polls, then scale and offset."""
        step = self._step(skey, rule, raw, now)
        if step is None or step[1] <= 0:
            return None  # first reading, a reset (no rate this poll) or no time elapsed
        return (step[0] / step[1]) * rule.scale + rule.offset

    def _expire(self, devices: dict[str, Device]) -> None:
        """Bounded memory: forget state of series not seen for STATE_TTL_POLLS polls, or, above
        MAX_STATE entries (an identity storm), of every series not seen in this poll; and the
        compiled plans of devices the source no longer lists (rebuilt on sight if they return)."""
        over = len(self._raw) + len(self._totals) > MAX_STATE
        if self._poll % 16 and not over:
            return
        if any(key[0] not in devices for key in self._plans):
            self._plans = {k: v for k, v in self._plans.items() if k[0] in devices}
            live = {dev.id for dev in devices.values()}  # kept plans keep their interned ids
            self._ids = {k: v for k, v in self._ids.items() if k in live}
        horizon = self._poll if over else self._poll - STATE_TTL_POLLS
        stale = [k for k, st in self._raw.items() if st.seen < horizon]
        for k in stale:
            del self._raw[k]
        gone = [k for k, (_, seen) in self._totals.items() if seen < horizon]
        for k in gone:
            del self._totals[k]
        if stale or gone:  # rebuilt: a dict keeps the table it once grew to (identity storms)
            self._raw, self._totals = dict(self._raw), dict(self._totals)

    def state_size(self) -> int:
        return len(self._raw) + len(self._totals)

    def carry_over(self, prev: Mapper, raw: bool) -> None:
        """A reload: continue ``prev``'s counter totals (a counter never goes back) and, with
        ``raw`` (the mapping rules are unchanged: raw keys name rules by position), the readings
        behind its rates and deltas."""
        self._poll = prev._poll
        self._last_t, self._min_step = prev._last_t, prev._min_step
        self._totals = dict(prev._totals)
        if raw:
            self._raw = dict(prev._raw)


def _combine(cands: list[tuple[int, str, float]]) -> float:
    """Several entries feeding one gauge series: first listed wins, or max / sum."""
    if len(cands) == 1:
        return cands[0][2]
    cands.sort(key=lambda c: c[0])
    how = cands[0][1]
    if how == "max":
        return max(c[2] for c in cands)
    if how == "sum":
        return sum(c[2] for c in cands)
    return cands[0][2]
