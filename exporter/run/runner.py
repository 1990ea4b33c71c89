"""``SourceRunner``: one enabled source with its worker thread, mapper, timeout and loops.

Every call into the source (open, poll, poll_fast, close) runs on the source's own ``Worker``
under the collector's timeout.  A source that hangs keeps only its own thread busy: its series
are dropped, it is reported ``source_up 0`` with a ``timeout`` error, and no second call is
started until the stuck one returns.  A failed poll drops the source's series and counts the
error kinds; the next poll that succeeds brings them back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..map.mapper import Mapper
from ..map.mapping import MappingSet
from ..map.store import SourceState, Store
from ..model import Frames, SourceStats
from ..render import cpustats
from ..sources.base import PollFailed, Source, SourceUnavailable, abilities_of
from ..sources.context import SourceContext
from ..sources.registry import Collector, create_source
from .collector_policy import missing_backend_state
from .periodic import StepClock, Ticker
from .pipeline import Cycle, poll_and_map
from .worker import Worker

log = logging.getLogger("unified_gpu_exporter")

REOPEN_INTERVAL = 30.0  # seconds between retries of an explicitly enabled source that is missing
MALFORMED_LOG_S = 600.0  # at most one line per source this often naming its malformed fields

def fast_frames(frames: Frames, fast: frozenset[str]) -> Frames:
    """Only the series of ``fast`` metrics, per GPU: counters and other gauges keep their
    full-poll values (a second mapper's counter totals must never replace the full poll's)."""
    out: Frames = {}
    for dev_id, frame in frames.items():
        kept = {sid: v for sid, v in frame.items() if sid[0] in fast}
        if kept:
            out[dev_id] = kept
    return out


def overlay(under: Frames, over: Frames) -> Frames:
    """A new ``Frames``: ``under`` with ``over``'s values on top (neither is changed)."""
    out = dict(under)
    for dev_id, frame in over.items():
        have = out.get(dev_id)
        out[dev_id] = {**have, **frame} if have else frame
    return out


@dataclass
class SourceRunner:
    """One enabled source with its worker and mapping state."""

    collector: Collector
    source: Source | None
    state: SourceState
    mapper: Mapper
    interval: float
    timeout: float
    worker: Worker
    fast_mapper: Mapper | None = None  # set when the source declares fast_poll
    store: Store | None = None         # the store this runner publishes to
    opened: bool = False
    backend_missing: bool = False  # the last open raised SourceUnavailable
    pending: asyncio.Future | None = None       # the last open/poll call
    fast_pending: asyncio.Future | None = None  # the last poll_fast call
    stopped: bool = False
    polling: asyncio.Future | None = None  # a full poll of ``loop`` in flight (done once published)
    polled_at: float = float("-inf")  # monotonic time of the last successful full poll
    fast_at: float = float("-inf")  # monotonic time of the last fast poll started
    malformed_logged: float = float("-inf")  # monotonic time of the last malformed-value line
    malformed_since: int = 0  # malformed readings counted since that line

    @property
    def stats(self) -> SourceStats:
        """This source's health and counters (its self-metrics, render/self_metrics.py)."""
        return self.state.stats

    # ------------------------------------------------------------ one poll
    def _cycle(self) -> Cycle:
        """Runs in the worker thread: poll, then map (mapper state is per source)."""
        assert self.source is not None and self.store is not None
        cycle = poll_and_map(self.source.poll, self.store, self.state, self.mapper)
        cpustats.add("poll", self.state.name, cycle.poll_cpu)
        cpustats.add("map", self.state.name, cycle.map_cpu)
        return cycle

    async def poll_once(self) -> bool:
        """Open if needed, poll one time; update the store.  True when the poll succeeded."""
        st, stats = self.state, self.stats
        if self.source is None:
            return False
        if self.fast_pending is not None and not self.fast_pending.done():
            # a fast poll is using the worker: wait for it instead of queueing behind it
            await asyncio.wait({self.fast_pending}, timeout=self.timeout)
        if self.pending is not None and not self.pending.done():
            stats.errors["timeout"] += 1  # still stuck in the previous call
            st.clear()
            stats.state, stats.reason = "down", f"previous call still running after {self.timeout:g}s"
            return False
        if not self.opened:
            try:
                await self._call(self.source.open)
            except SourceUnavailable as exc:
                self._backend_missing(str(exc))
                return False
            except Exception as exc:  # noqa: BLE001
                self._failed(exc, "open")
                return False
            self.opened = True
            log.info("source opened", extra={"source": st.name})
        try:
            cycle = await self._call(self._cycle)
        except Exception as exc:  # noqa: BLE001
            self._failed(exc, "poll")
            return False
        sample, devices, result = cycle.sample, cycle.devices, cycle.result
        st.devices = devices
        st.device_up = {k: sample.device_up.get(k, True) for k in devices}
        st.frames = result.frames
        st.fast = {}
        st.self_samples = sample.self_samples
        stats.errors.update(sample.errors)
        if result.malformed:
            stats.errors["malformed_value"] += result.malformed
            self._say_malformed(result.malformed_fields)
        stats.last_duration = cycle.poll_seconds
        stats.last_success = time.time()
        self.polled_at = time.monotonic()
        stats.polls += 1
        if stats.state == "down":  # the outage's end, with what it was
            log.info("source up again", extra={"source": st.name, "reason": stats.reason})
        stats.up, stats.state, stats.reason = True, "up", ""
        stats.was_up = True
        self.backend_missing = False
        self._touch()
        return True

    def _say_malformed(self, fields: list[str]) -> None:
        """A warning naming the raw fields whose values were malformed (skipped and counted in
        source_errors_total{kind="malformed_value"}): at once the first time, then at most every
        MALFORMED_LOG_S seconds per source, with the count since the previous line."""
        self.malformed_since += len(fields)
        now = time.monotonic()
        if now - self.malformed_logged < MALFORMED_LOG_S:
            return
        names = sorted(set(fields))
        log.warning("malformed values skipped: %s%s (%d since the last such line; counted as "
                    "source_errors_total{kind=\"malformed_value\"})", ", ".join(names[:5]),
                    " ..." if len(names) > 5 else "", self.malformed_since,
                    extra={"source": self.state.name})
        self.malformed_logged, self.malformed_since = now, 0

    def _touch(self) -> None:
        if self.store is not None:
            self.store.touch()

    def _backend_missing(self, reason: str) -> None:
        """The backend is not there: ``absent`` or ``down`` by ``missing_backend_state``."""
        st, stats = self.state, self.stats
        self.backend_missing = True
        new_state = missing_backend_state(st.explicit, stats.was_up)
        if stats.state != new_state or stats.reason != reason:
            if new_state == "down":
                log.error("source down: backend not found", extra={"source": st.name, "reason": reason})
            else:
                log.info("source absent", extra={"source": st.name, "reason": reason})
        stats.state, stats.reason = new_state, reason
        st.clear()
        self._touch()

    async def _call(self, fn: Callable[[], Any]) -> Any:
        self.pending = self.worker.submit(fn)
        try:
            # asyncio.timeout, not wait_for: wait_for on 3.11 can swallow a cancellation that
            # races with the result, which would keep a stopped source loop running
            async with asyncio.timeout(self.timeout):
                return await asyncio.shield(self.pending)
        except TimeoutError:
            raise TimeoutError(f"timed out after {self.timeout:g}s") from None
        finally:
            if self.pending is not None and self.pending.done():
                self.pending = None  # finished: its readings are not held until the next call

    def _failed(self, exc: BaseException, what: str) -> None:
        st, stats = self.state, self.stats
        kinds = exc.errors if isinstance(exc, PollFailed) else None  # which errors failed the poll
        kind = "timeout" if isinstance(exc, TimeoutError) else "exception"
        if kinds:
            stats.errors.update(kinds)
        else:
            stats.errors[kind] += 1
        reason = f"{what} {exc}" if kind == "timeout" else f"{what} failed: {type(exc).__name__}: {exc}"
        if stats.state != "down" or stats.reason != reason:
            log.warning("source down", extra={"source": st.name, "reason": reason})
        stats.state, stats.reason = "down", reason
        st.clear()
        self._touch()

    # ------------------------------------------------------------ loops
    async def loop(self, polled: Callable[[str], None]) -> None:
        """Poll every ``interval``; ``polled(name)`` after each poll (the render cycle wakes)."""
        tick = Ticker(self.interval)
        while not self.stopped:
            self.polling = asyncio.get_running_loop().create_future()
            try:
                await self.poll_once()
                polled(self.state.name)
            finally:
                self.polling.set_result(None)
            if self.stats.state == "absent":
                return  # on by default, backend not on this node: the source stays off
            if self.backend_missing:  # asked for (or up before): retry now and then, stay down
                await asyncio.sleep(REOPEN_INTERVAL)
                tick.restart()
                continue
            await tick()

    def _fast_cycle(self, mappings: MappingSet) -> Cycle:
        assert self.source is not None and self.store is not None and self.fast_mapper is not None
        fields = mappings.raw_fields(mappings.schema.fast_metrics)  # raw fields feeding a `fast: true` metric

        def keep(r: Any, devices: dict) -> bool:  # map only what can end up in the fast overlay
            d = devices.get(r.device)
            return d is not None and r.field in fields.get(d.mapping, ())

        cycle = poll_and_map(self.source.poll_fast, self.store, self.state, self.fast_mapper, keep=keep)
        cpustats.add("fast_poll", self.state.name, cycle.poll_cpu)
        cpustats.add("fast_map", self.state.name, cycle.map_cpu)
        return cycle

    async def fast_loop(self, interval: float, mappings: MappingSet, steps: StepClock | None = None) -> None:
        """Cheap signals between full polls; they update the series the indicators read.

        A tick that comes less than ``interval`` after a full poll is skipped: the full poll's
        values are that fresh already (with the defaults, one fast poll per full poll).  ``steps.gap()``:
        the indicators' sampling interval now (``IndicatorFeed.sampling_interval``); longer than
        ``interval`` on a calm node, where fast polls come that far apart, and none where the
        full polls come as often: then, with ``steps``, it waits for ``steps.fast`` (a GPU near
        contention) instead of waking at every tick, and tells ``steps`` of each fast poll."""
        tick = Ticker(interval, spacing=True)
        while not self.stopped:
            calm = steps.gap() if steps is not None and not steps.fast.is_set() else interval
            if calm > interval and calm >= self.interval:  # no fast poll could run: until one can
                await steps.fast.wait()  # type: ignore[union-attr]
            await tick()
            if not self.opened or self.worker.busy or not self.stats.up:
                continue
            now, step = time.monotonic(), interval if steps is None else steps.gap()
            if now - self.polled_at < interval or (step > interval and (
                    step >= self.interval or now - max(self.polled_at, self.fast_at) < 0.9 * step)):
                continue
            self.fast_at = now
            try:
                self.fast_pending = self.worker.submit(lambda: self._fast_cycle(mappings))
                async with asyncio.timeout(self.timeout):
                    cycle = await asyncio.shield(self.fast_pending)
            except Exception as exc:  # noqa: BLE001 - the full poll reports the source's health
                self.stats.errors["fast_poll_" + ("timeout" if isinstance(exc, TimeoutError) else "exception")] += 1
                continue
            finally:
                if self.fast_pending is not None and self.fast_pending.done():
                    self.fast_pending = None
            if not self.stats.up:
                continue  # the full poll failed meanwhile: its series stay dropped
            self.stats.errors.update(cycle.sample.errors)
            # only the indicator inputs: counters and other gauges keep their full-poll values
            # (a second mapper's counter totals must never replace the full poll's)
            fast = fast_frames(cycle.result.frames, mappings.schema.fast_metrics)
            st = self.state
            if fast:  # replaced, never mutated
                # the indicator feed reads them on top of the full poll's; the exposition keeps
                # the full poll's values (it is rendered once per full poll)
                st.fast = overlay(st.fast, fast)
                if self.store is not None:
                    self.store.fast_version += 1
                if steps is not None:
                    steps.polled()

    async def close(self, timeout: float = 1.0) -> None:
        """Close the source on its worker (skipped while a call hangs) and end the worker."""
        if self.source is not None and self.opened and not self.worker.busy:
            try:
                async with asyncio.timeout(timeout):
                    await self.worker.submit(self.source.close)
            except Exception as exc:  # noqa: BLE001
                log.warning("source close failed", extra={"source": self.state.name, "reason": str(exc)})
        self.worker.stop()


async def polls_settled(runtimes: list[SourceRunner], limit: float) -> None:
    """Wait, at most ``limit`` seconds, for the full polls in flight to be published: sources
    polling at one interval start together, so the render after the first of them waits for
    the others and a round of polls is rendered once, not once per source."""
    flying = {rt.polling for rt in runtimes if rt.polling is not None and not rt.polling.done()}
    if flying:
        await asyncio.wait(flying, timeout=limit)


def build_runner(col: Collector, explicit: bool, context: SourceContext, mappings: MappingSet,
                 interval: float, timeout: float, store: Store) -> SourceRunner:
    """The runner of one enabled collector, its state added to ``store``.  A source that cannot
    even be created is kept, down or absent, so its reason shows in the self-metrics."""
    stats = SourceStats()  # the runner's: it counts here, the store's state shows it
    state = SourceState(col.name, explicit=explicit, interval=interval, stats=stats)
    source: Source | None
    try:
        source = create_source(col, context)
    except SourceUnavailable as exc:
        source = None
        stats.state, stats.reason = ("down" if explicit else "absent"), str(exc)
    except Exception as exc:  # bad options reach here: source off, reason visible
        source, stats.state, stats.reason = None, "down", f"{type(exc).__name__}: {exc}"
        stats.errors["exception"] += 1
        log.error("source cannot start", extra={"source": col.name, "reason": stats.reason})
    abilities = abilities_of(source)
    if source is not None:
        state.secondary = abilities.secondary
        state.provides_identity = abilities.provides_identity
    store.add(state)
    fast = Mapper(mappings) if source is not None and abilities.fast_poll else None
    mapper = Mapper(mappings, interval=interval)
    return SourceRunner(col, source, state, mapper, interval, timeout, Worker(col.name), fast, store)
