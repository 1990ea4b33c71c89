"""The daemon: loads the configuration once, starts one runner per enabled source, renders.

Its jobs live in their own modules: ``loading`` (read and validate config, mappings,
enrichers), ``collector_policy`` (which collectors run and what a missing backend means),
``runner`` (one source: poll, timeout, failure, the fast loop), ``pipeline`` (poll -> resolve ->
map), ``render_cycle`` (what the render thread is handed), ``worker`` (why a thread, not an
executor) and ``periodic`` (the loops' sleep arithmetic).  What is left here is the wiring: start,
the indicator and render loops, reload and ``--once``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from ..config import Config
from ..enrich.cloud import CloudEnricher
from ..map.mapping import MappingSet
from ..map.schema import Schema
from ..map.store import Store
from ..model import Frames, Labels
from ..otlp.hook import OtlpOutput
from ..render import cpustats
from ..render.exposition import Rendered, Renderer
from ..render.render_cycle import present_only, snapshot
from ..sources.base import abilities_of
from ..sources.context import SourceContext
from ..sources.registry import Collector
from ..yamlfile import ConfigError
from . import gctune
from .collector_policy import (
    collector_options,
    counts_fdinfo,
    enabled_collectors,
    interval_and_timeout,
    none_up_message,
)
from .enrichers import Enrichers
from .feed import IndicatorFeed
from .loading import Loaded, prepare
from .periodic import StepClock
from .reload_carry import carry_indicator_state, carry_mapper_state, carry_source_state
from .runner import REOPEN_INTERVAL, SourceRunner, build_runner, polls_settled
from .settings import Settings
from .worker import Worker

if TYPE_CHECKING:  # loaded only where pod attribution runs (loading._enrichers)
    from ..enrich.kubernetes import PodResourcesEnricher

__all__ = ["REOPEN_INTERVAL", "Daemon", "Settings", "Worker"]  # older import paths

log = logging.getLogger("unified_gpu_exporter")

STARTUP_WAIT = 2.0  # seconds start() waits for the first poll of every source
STATE_SAVE_INTERVAL = 60.0  # seconds between saves of the indicators' learned state
WARM_RENDERS = 3  # renders (every source polled twice or more) before the warm-up GC freeze

class Daemon:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.config: Config = Config()
        self.schema: Schema | None = None
        self.mappings: MappingSet | None = None
        self.renderer: Renderer | None = None
        self.store = Store()
        self.runtimes: list[SourceRunner] = []
        self.rendered: Rendered | None = None
        self._loaded: Loaded | None = None  # the running configuration, as read (a failed reload restores it)
        self._polled: set[str] = set()
        self._tasks: list[asyncio.Task] = []
        self._stopping = False
        self._dirty: asyncio.Event | None = None
        self._steps = StepClock(1.0)  # the indicator loop's and the fast polls' wake-ups (_start_tasks)
        self._first_polls: asyncio.Event | None = None  # set once every source polled (start)
        self._render_worker = Worker("render")
        self._static_labels: Labels = ()
        self.feed: IndicatorFeed | None = None
        self.cloud: CloudEnricher | None = None
        self.k8s: PodResourcesEnricher | None = None
        self.enrichers = Enrichers()  # cloud and kubelet tasks, the HPC job reader's thread
        self._state_worker = Worker("state")
        self._reload_task: asyncio.Task | None = None
        self._reload_again = False
        self._load_worker = Worker("reload")
        self.otlp = OtlpOutput(gctune.after_warmup)  # exporters.otlp: pushes the rendered cycles (exporter/otlp/)

    # ---------------------------------------------------------------- loading
    def load(self, loaded: Loaded | None = None) -> None:
        """Load config, schema and mappings (or apply ``loaded``, read by ``loading.prepare``
        already); raise ConfigError without touching running state."""
        self._apply_loaded(loaded or self._prepare())

    def _load_once(self) -> None:
        """start() and run_once() load unless the caller already did (the CLI loads first to
        report configuration errors before any source starts)."""
        if self._loaded is None:
            self.load()

    def _prepare(self) -> Loaded:
        """Read and validate everything a load needs; touches no running state (any thread)."""
        return prepare(self.settings)

    def _apply_loaded(self, loaded: Loaded) -> None:
        config, schema, mappings, cloud, k8s, series_filter, otel = loaded
        self.otlp.configure(config, schema, otel, cloud)
        self.config, self.schema, self.mappings = config, schema, mappings
        self.cloud, self.k8s = cloud, k8s
        self.renderer = self.renderer or Renderer(schema)
        self.renderer.schema = schema
        self.renderer.series_filter = series_filter
        self._static_labels = tuple(sorted(config.labels.items()))
        self._loaded = loaded

    @property
    def poll_interval(self) -> float:
        return self.settings.poll_interval or self.config.poll_interval

    @property
    def fast_interval(self) -> float:
        return min(self.settings.fast_interval or self.config.fast_interval, self.poll_interval)

    def build_feed(self) -> None:
        # the price table's cloud is indicators.cost.cloud (the detected cloud is a label only)
        self.feed = IndicatorFeed(self.config.indicators, self.settings.state_dir, self.fast_interval,
                                  full_interval=self.poll_interval)

    def extra_series(self, store: Store | None = None) -> Frames:
        """The indicators' latest output, only for devices ``store`` still has."""
        if self.feed is None:
            return {}
        return self.feed.latest if store is None else present_only(self.feed.latest, store)

    def enabled_collectors(self) -> list[tuple[Collector, bool]]:
        """(collector, explicit) for every collector that should run (``collector_policy``)."""
        return enabled_collectors(self.settings, self.config)

    def build_runtimes(self) -> None:
        """A fresh store and one runner per enabled collector (``runner.build_runner``)."""
        assert self.mappings is not None
        self.store = Store()
        self.runtimes = []
        for col, explicit in self.enabled_collectors():
            context = SourceContext.from_mappings(  # wanted and fast: the raw fields the mappings read
                self.mappings, sysfs=self.settings.sysfs, procfs=self.settings.procfs,
                options=collector_options(col, self.settings, self.config))
            interval, timeout = interval_and_timeout(self.config.collector(col.name), self.poll_interval)
            self.runtimes.append(build_runner(col, explicit, context, self.mappings, interval, timeout,
                                              self.store))

    async def poll_once(self, rt: SourceRunner) -> bool:
        return await rt.poll_once()  # True when the poll succeeded

    # ---------------------------------------------------------------- loops
    def _polled_one(self, name: str) -> None:
        self._polled.add(name)
        if self._dirty is not None:
            self._dirty.set()
        self._steps.polled()
        first = self._first_polls
        if first is not None and not first.is_set() and {rt.state.name for rt in self.runtimes} <= self._polled:
            first.set()  # every source has polled once: start() opens the server

    async def _indicator_loop(self) -> None:
        assert self.feed is not None
        next_save = time.monotonic() + STATE_SAVE_INTERVAL
        # the one edge back from the indicators to a source: the profiles source arms triggered
        # captures from the indicators' output (Abilities.observes_indicators)
        watchers = [rt.source for rt in self.runtimes
                    if rt.source is not None and abilities_of(rt.source).observes_indicators]
        steps, store = self._steps, self.store
        while not self._stopping:
            # sampled at the fast interval, on a calm node once per round of full polls (the render
            # loop's rule; IndicatorFeed.due); served with the next render (once per poll cycle)
            if not steps.fast.is_set():
                await polls_settled(self.runtimes, min(self.poll_interval, 1.0) / 4)
            if not self.feed.due(time.monotonic(), (store.version, store.fast_version)):
                await steps.until_step((store.version, store.fast_version))
                continue
            c0 = cpustats.clock()
            self.feed.advance(time.monotonic(), self.store)
            cpustats.add("indicators", "", cpustats.clock() - c0)
            steps.sampled()
            if watchers:
                out = self.feed.latest
                for source in watchers:  # returns at once
                    source.observe_indicator_output(time.monotonic(), out)  # type: ignore[union-attr]
            if time.monotonic() >= next_save and not self._state_worker.busy:
                next_save = time.monotonic() + STATE_SAVE_INTERVAL
                self._state_worker.submit(self.feed.save)
            await steps.until_step((store.version, store.fast_version))

    async def _render_loop(self) -> None:
        assert self._dirty is not None
        last_version, renders = -1, 0
        while not self._stopping:
            await self._dirty.wait()
            await polls_settled(self.runtimes, min(self.poll_interval, 1.0) / 4)  # one render a round
            self._dirty.clear()
            version = self.store.version
            if version != last_version or self.rendered is None:
                last_version = version
                await self.render()
                renders += 1
                if renders == WARM_RENDERS:  # per-device state is built: out of the GC's way
                    gctune.after_warmup()
            # at most one render per quarter poll interval, however fast indicators update
            await asyncio.sleep(min(self.poll_interval, 1.0) / 4)

    async def render(self) -> Rendered:
        assert self.renderer is not None
        snap = snapshot(self.store)
        c0 = cpustats.clock()
        extra = self.extra_series(snap)  # the indicators' output for the GPUs still there
        cpustats.add("indicators", "", cpustats.clock() - c0)
        static = self.enrichers.static_labels(self.cloud, self._static_labels)

        def build() -> Rendered:  # pod attribution reads only cached dicts; off the event loop
            c0 = cpustats.clock()
            per_device, pods = self._pod_labels(snap)
            try:
                return self.renderer.render(snap, (extra, pods), static, per_device)  # type: ignore[union-attr]
            finally:
                cpustats.add("render", "", cpustats.clock() - c0)

        self.rendered = await self._render_worker.submit(build)
        self.otlp.offer(self.rendered, static)  # returns at once; pushes on its own thread
        return self.rendered

    def _pod_labels(self, store: Store) -> tuple[dict, Frames]:  # + gpu_job_info, hpc_job
        return self.enrichers.labels(self.k8s, store)

    @property
    def ready(self) -> bool:
        """A render completed (after the first polls or their wait) and did not fail.  Down sources
        do not make it unready: their state (source_up 0, device_up 0) is what it serves then, and
        a Service dropping the pod would hide that very incident (README, "Probes")."""
        return self.rendered is not None and not self.rendered.failed

    async def start(self) -> None:
        self._load_once()
        self.build_runtimes()
        self.build_feed()
        self._dirty = asyncio.Event()
        self._first_polls = asyncio.Event()
        if not self.runtimes:
            self._first_polls.set()  # no source: nothing to wait for
        self._start_tasks()
        # give every source one poll before the server opens, so the first scrape has data; the
        # wait ends with the last first poll (no timer granularity), and a slow or hung source
        # does not hold the start beyond STARTUP_WAIT
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STARTUP_WAIT):
                await self._first_polls.wait()
        self.enrichers.read_jobs(self.config.enrich.hpc_jobs)  # read at once: the first render has the jobs
        await self.render()
        if not any(st.stats.up for st in self.store.sources.values()):  # issue 38: say why, as a warning
            log.warning(none_up_message(self.store.sources.values()))
        # after the first render: the metadata probes (cloud) and the kubelet connection do not
        # compete with the first polls for the CPU; their labels arrive with a later render
        self.enrichers.start_tasks(self.cloud, self.k8s)

    def _start_tasks(self) -> None:
        self._stopping = False
        for rt in self.runtimes:
            rt.stopped = False
        self._steps = StepClock(self.fast_interval, self.feed)  # a reload may change both
        self._tasks = [asyncio.create_task(rt.loop(self._polled_one), name=f"source-{rt.state.name}")
                       for rt in self.runtimes]
        if self.config.indicators.enabled and self.mappings is not None:
            # fast polls exist only to feed the indicators
            self._tasks += [asyncio.create_task(rt.fast_loop(self.fast_interval, self.mappings, self._steps),
                                                name=f"fast-{rt.state.name}")
                            for rt in self.runtimes if rt.fast_mapper is not None]
        self._tasks.append(asyncio.create_task(self._render_loop(), name="render"))
        if self.feed is not None and self.config.indicators.enabled:  # nothing to step otherwise
            self._tasks.append(asyncio.create_task(self._indicator_loop(), name="indicators"))

    async def _stop_tasks(self) -> None:
        self._stopping = True
        for rt in self.runtimes:
            rt.stopped = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self._close_sources(self.runtimes)

    async def _close_sources(self, runtimes: list[SourceRunner], timeout: float = 1.0) -> None:
        await asyncio.gather(*(rt.close(timeout) for rt in runtimes))

    def request_reload(self) -> asyncio.Task:
        """SIGHUP: one reload at a time.  Signals that arrive during a reload are coalesced into
        one more reload after it (the file may have changed again), never run in parallel."""
        task = self._reload_task
        if task is not None and not task.done():
            self._reload_again = True
            return task
        self._reload_again = False
        self._reload_task = asyncio.get_running_loop().create_task(self._reload_serially(),
                                                                   name="reload")
        return self._reload_task

    async def _reload_serially(self) -> None:
        while True:
            await self.reload()
            if not self._reload_again:
                return
            self._reload_again = False

    def _reload_failed(self, exc: BaseException) -> bool:
        assert self.renderer is not None
        self.renderer.reload_ok = False
        reason = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
        log.error("reload failed, keeping the running configuration", extra={"reason": reason[:2000]})
        if self._dirty:
            self._dirty.set()
        return False

    def _rebuild(self, store: Store, runtimes: list[SourceRunner], mappings: MappingSet | None,
                 feed: IndicatorFeed | None) -> None:
        """Sources, indicators and enrichers from the applied configuration, carrying over the
        series, counters and learned state of the ones they replace."""
        self.build_runtimes()
        carry_mapper_state(runtimes, self.runtimes, mappings, self.mappings)
        carry_source_state(store, self.store)  # served until they poll again; counters kept
        self.build_feed()  # thresholds may have changed
        carry_indicator_state(feed, self.feed)
        self.enrichers.start_tasks(self.cloud, self.k8s)  # the applied enrich options, fresh enrichers
        self.enrichers.read_jobs(self.config.enrich.hpc_jobs)

    async def reload(self) -> bool:
        """Apply a new config + mappings, or keep the running ones if they are invalid.

        The files are read and validated in a thread (a large file never blocks scrapes); every
        failure, whatever its kind, sets config_last_reload_successful to 0.  Learned baselines
        and the indicators' counters carry over, with or without --state.dir."""
        assert self.renderer is not None
        try:
            # a daemon thread (not the default executor, which is joined at exit): a large file
            # neither blocks scrapes nor holds up SIGTERM
            loaded = await self._load_worker.submit(lambda: self._prepare())
        except Exception as exc:  # noqa: BLE001 - ConfigError, MemoryError, anything: reported
            return self._reload_failed(exc)
        old = (self.config, self.schema, self.mappings, self.cloud, self.k8s, self._static_labels)
        previous = self._loaded
        assert previous is not None  # reload() runs in a started daemon
        try:
            self._apply_loaded(loaded)
        except Exception as exc:  # noqa: BLE001
            (self.config, self.schema, self.mappings, self.cloud, self.k8s, self._static_labels) = old
            self.renderer.schema = self.schema  # type: ignore[assignment]
            return self._reload_failed(exc)
        await self._stop_tasks()
        running = (self.store, self.runtimes, old[2], self.feed)
        try:
            if self.feed is not None:
                await self._state_worker.submit(self.feed.save)
            self._rebuild(*running)
        except Exception as exc:  # noqa: BLE001 - the running configuration comes back whole
            await self._close_sources([rt for rt in self.runtimes if rt not in running[1]])
            self._apply_loaded(previous)
            try:
                self._rebuild(*running)
            except Exception as again:  # noqa: BLE001
                log.error("the running configuration could not be rebuilt", extra={"reason": repr(again)[:2000]})
            self._start_tasks()
            return self._reload_failed(exc)
        self.renderer.reload_ok = True
        self.renderer.reload_ts = time.time()
        log.info("configuration reloaded")
        if counts_fdinfo(self.settings, self.config):  # off at start: its capabilities are gone
            from ..privsep.counter import warn_if_count_unprivileged
            warn_if_count_unprivileged()
        self._start_tasks()
        return True

    async def stop(self) -> None:
        if self._reload_task is not None and not self._reload_task.done():
            self._reload_task.cancel()  # no reload restarts the sources after this
            await asyncio.gather(self._reload_task, return_exceptions=True)
        self.enrichers.stop()
        self.otlp.close()
        await self._stop_tasks()
        if self.feed is not None:
            try:
                async with asyncio.timeout(0.5):
                    await self._state_worker.submit(self.feed.save)
            except TimeoutError:
                log.warning("saving indicator state timed out")
        self.stop_workers()

    def stop_workers(self) -> None:
        """The render, state and reload threads end (a hung call's thread is left behind)."""
        self._render_worker.stop()
        self._state_worker.stop()
        self._load_worker.stop()
