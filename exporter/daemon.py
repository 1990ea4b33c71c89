"""The poll loop: every source in its own worker thread, on its own interval, with a timeout.

A source that hangs keeps only its own thread busy: its series are dropped, it is reported
``source_up 0`` with a ``timeout`` error, and no second poll is started until the stuck one
returns.  After sources change, the exposition is rendered once (off the event loop) and cached
for the server.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import math
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from queue import SimpleQueue
from typing import Any

from .config import Config, load_config
from .enrich.cloud import CloudEnricher
from .enrich.kubernetes import DEFAULT_SOCKET, PodResourcesEnricher
from .exposition import SELF_METRICS, Rendered, Renderer
from .indicator_feed import IndicatorFeed
from .mapping import Labels, Mapper, MappingSet
from .schema import Schema, default_mappings_dir, load_schema
from .seriesfilter import SeriesFilter
from .sources.base import Sample, Source, SourceUnavailable
from .sources.registry import COLLECTORS, Collector, create_source, source_kwargs
from .store import SourceState, Store
from .yamlfile import ConfigError

log = logging.getLogger("unified_gpu_exporter")

REOPEN_INTERVAL = 30.0
STARTUP_WAIT = 2.0
# canonical metrics a fast poll may refresh between full polls: the contention indicators' inputs
FAST_METRICS = frozenset({
    "gpu_compute_utilization_percent", "gpu_compute_occupancy_percent", "gpu_sm_active_percent",
    "gpu_tensor_utilization_percent", "gpu_memory_bandwidth_utilization_percent",
    "gpu_l2_cache_miss_rate_percent",
})  # seconds start() waits for the first poll of every source  # seconds between retries of an explicitly enabled source that is missing


class Worker:
    """One daemon thread running blocking calls in order; a hung call blocks only this worker."""

    def __init__(self, name: str):
        self._queue: SimpleQueue[tuple[Callable[[], Any], asyncio.Future, asyncio.AbstractEventLoop] | None] = SimpleQueue()
        self.busy = False
        self._thread = threading.Thread(target=self._run, name=f"source-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, fut, loop = item
            try:
                result = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
                self._deliver(loop, _set_exc, fut, exc)
            else:
                self._deliver(loop, _set_result, fut, result)
            finally:
                self.busy = False

    @staticmethod
    def _deliver(loop: asyncio.AbstractEventLoop, setter: Callable, fut: asyncio.Future, value: Any) -> None:
        try:
            loop.call_soon_threadsafe(setter, fut, value)
        except RuntimeError:
            pass  # the loop closed while a hung call was running: nobody waits for it any more

    def submit(self, fn: Callable[[], Any]) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        # a result nobody awaits any more (the call timed out) is still retrieved, so asyncio
        # never logs "Future exception was never retrieved" with the whole error in it
        fut.add_done_callback(_retrieve)
        self.busy = True
        self._queue.put((fn, fut, loop))
        return fut

    def stop(self) -> None:
        self._queue.put(None)


def _retrieve(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()


def _set_result(fut: asyncio.Future, value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exc(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


@dataclass
class Settings:
    """Everything the daemon needs, resolved from flags and the config file."""

    config_path: Path | None = None
    sysfs: Path = Path("/sys")
    procfs: Path = Path("/proc")
    poll_interval: float | None = None        # flag wins over config
    fast_interval: float | None = None
    collectors: dict[str, bool] = field(default_factory=dict)  # --[no-]collector.<name>
    simulate: str | None = None               # scenario name or file
    simulate_phase: str | None = None
    state_dir: Path | None = None
    mappings_dir: Path | None = None


@dataclass
class Runtime:
    """One enabled source with its worker and mapping state."""

    collector: Collector
    source: Source | None
    state: SourceState
    mapper: Mapper
    interval: float
    timeout: float
    worker: Worker
    fast_mapper: Mapper | None = None  # set when the source offers poll_fast
    opened: bool = False
    backend_missing: bool = False  # the last open raised SourceUnavailable
    pending: asyncio.Future | None = None       # the last open/poll call
    fast_pending: asyncio.Future | None = None  # the last poll_fast call


class Daemon:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.config: Config = Config()
        self.schema: Schema | None = None
        self.mappings: MappingSet | None = None
        self.renderer: Renderer | None = None
        self.store = Store()
        self.runtimes: list[Runtime] = []
        self.rendered: Rendered | None = None
        self._polled: set[str] = set()
        self._tasks: list[asyncio.Task] = []
        self._stopping = False
        self._rendered_up = False
        self._dirty: asyncio.Event | None = None
        self._render_worker = Worker("render")
        self._static_labels: Labels = ()
        self.feed: IndicatorFeed | None = None
        self.cloud: CloudEnricher | None = None
        self.k8s: PodResourcesEnricher | None = None
        self._enrich_tasks: list[asyncio.Task] = []
        self._state_worker = Worker("state")
        self._fast_fields_for: tuple[MappingSet, dict[str, frozenset[str]]] | None = None
        self._reload_task: asyncio.Task | None = None
        self._reload_again = False
        self._load_worker = Worker("reload")

    # ---------------------------------------------------------------- loading
    def load(self) -> None:
        """Load config, schema and mappings; raise ConfigError without touching running state."""
        self._apply_loaded(self._prepare())

    def _prepare(self) -> tuple:
        """Read and validate everything a load needs; touches no running state (any thread).
        Config and mapping errors are reported together."""
        errors: list[str] = []
        config: Config | None = None
        try:
            config = load_config(self.settings.config_path)
        except ConfigError as exc:
            errors.append(str(exc))
        mdir = self.settings.mappings_dir or (config.mappings_dir if config else None) or default_mappings_dir()
        try:
            schema = load_schema(mdir / "canonical.yaml")
            mappings = MappingSet.load_dir(mdir, schema)
        except ConfigError as exc:
            errors.append(str(exc))
        if errors:
            raise ConfigError("\n".join(errors))
        assert config is not None
        series_filter = self._series_filter(config, schema)
        cloud, k8s = self._enrichers(config)
        if self.settings.simulate is not None:
            self._check_scenario(mappings)
        self._check_upstream(config)
        return config, schema, mappings, cloud, k8s, series_filter

    def _check_upstream(self, config: Config) -> None:
        """Upstream targets are validated at load (--check-config, reload): http(s) URLs only."""
        options = config.collector("upstream").options_dict()
        if not options.get("targets"):
            return
        from .sources.upstream import parse_targets

        try:
            parse_targets(options)
        except (ValueError, TypeError, OSError, ssl.SSLError) as exc:
            where = str(self.settings.config_path or "configuration")
            raise ConfigError(f"{where}: collectors.upstream.options: {exc}") from None

    def _apply_loaded(self, loaded: tuple) -> None:
        config, schema, mappings, cloud, k8s, series_filter = loaded
        self.config, self.schema, self.mappings = config, schema, mappings
        self.cloud, self.k8s = cloud, k8s
        self.renderer = self.renderer or Renderer(schema)
        self.renderer.schema = schema
        self.renderer.series_filter = series_filter
        self._static_labels = tuple(sorted(config.labels.items()))

    def _series_filter(self, config: Config, schema: Schema) -> SeriesFilter | None:
        try:
            filt = SeriesFilter(config.exposition, schema, tuple(SELF_METRICS))
        except ValueError as exc:
            raise ConfigError(f"{self.settings.config_path or 'configuration'}: {exc}") from None
        return filt if filt.active else None

    def _check_scenario(self, mappings: MappingSet) -> None:
        """A bad scenario is a configuration error at start, not a source that stays down."""
        from .sources.simulator import load_scenario

        scenario = load_scenario(self.settings.simulate or "demo")
        if self.settings.simulate_phase:
            scenario.phase_start(self.settings.simulate_phase)
        missing = sorted({m for d in scenario.devices for m in [d.mapping, *d.extra_mappings]
                          if mappings.get(m) is None})
        if missing:
            raise ConfigError(f"scenario {scenario.name}: devices use unknown mappings {missing} "
                              f"(known: {', '.join(sorted(mappings.mappings))})")

    def _enrichers(self, config: Config) -> tuple[CloudEnricher, PodResourcesEnricher]:
        errors = []
        cloud = k8s = None
        for section, opts in config.enrich.items():  # finite, sensible bounds on every period
            for key, low in (("refresh_seconds", 0.1), ("timeout_seconds", 0.01)):
                v = opts.get(key) if isinstance(opts, dict) else None
                if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                      or not math.isfinite(v) or not low <= v <= 86400):
                    errors.append(f"{config.where('enrich', section, key)}: enrich.{section}.{key}: "
                                  f"{v!r} out of range (a number of seconds from {low:g} to 86400)")
        try:
            cloud = CloudEnricher(config.enrich.get("cloud"))
        except (ValueError, TypeError) as exc:
            errors.append(f"{config.where('enrich', 'cloud')}: enrich.cloud: {exc}")
        opts = dict(config.enrich.get("kubernetes") or {})
        # on by default only where the kubelet's pod-resources socket exists (a Kubernetes node)
        opts.setdefault("enabled", Path(opts.get("socket", DEFAULT_SOCKET)).exists())
        try:
            k8s = PodResourcesEnricher(opts, procfs=self.settings.procfs)
        except (ValueError, TypeError) as exc:
            errors.append(f"{config.where('enrich', 'kubernetes')}: enrich.kubernetes: {exc}")
        for name in sorted(set(config.enrich) - {"cloud", "kubernetes"}):
            errors.append(f"{config.where('enrich', name)}: enrich.{name}: unknown section "
                          "(known: cloud, kubernetes)")
        if errors:
            raise ConfigError("\n".join(errors))
        assert cloud is not None and k8s is not None
        return cloud, k8s

    @property
    def poll_interval(self) -> float:
        return self.settings.poll_interval or self.config.poll_interval

    @property
    def fast_interval(self) -> float:
        return min(self.settings.fast_interval or self.config.fast_interval, self.poll_interval)

    def build_feed(self) -> None:
        cloud = str(self.config.enrich.get("cloud", {}).get("name", "")) if isinstance(
            self.config.enrich.get("cloud"), dict) else ""
        self.feed = IndicatorFeed(self.config.indicators, self.settings.state_dir,
                                  self.fast_interval, cloud)

    def extra_series(self, store: Store | None = None) -> list[tuple[str, Labels, float]]:
        """The indicators' latest output, only for devices the store still has (a lost GPU's
        indicators go with its other series)."""
        if self.feed is None:
            return []
        if store is None:
            return self.feed.latest
        present = {(d.vendor, d.index, d.uuid) for st in store.sources.values()
                   for k, d in st.devices.items() if st.device_up.get(k, True)}
        return [s for s in self.feed.latest
                if (s[1][0][1], s[1][1][1], s[1][2][1]) in present]

    def enabled_collectors(self) -> list[tuple[Collector, bool]]:
        """(collector, explicit) for every collector that should run."""
        out = []
        simulate = self.settings.simulate is not None
        for name, col in COLLECTORS.items():
            flag = self.settings.collectors.get(name)
            conf = self.config.collector(name).enabled
            if name == "simulator":
                if simulate:
                    out.append((col, True))
                continue
            if name == "upstream" and flag is None and conf is None:
                conf = bool(self.config.collector(name).options_dict().get("targets"))
            explicit = flag is True or (flag is None and conf is True)
            on = flag if flag is not None else (conf if conf is not None else col.default)
            # with --simulate, hardware collectors run only when asked for explicitly
            if simulate and not explicit:
                on = False
            if on:
                out.append((col, explicit))
        return out

    def build_runtimes(self) -> None:
        assert self.mappings is not None
        self.store = Store()
        self.runtimes = []
        for col, explicit in self.enabled_collectors():
            cconf = self.config.collector(col.name)
            options = cconf.options_dict()
            extra: dict[str, Any] = {"mappings": self.mappings}
            if col.name == "simulator":
                options.setdefault("scenario", self.settings.simulate or "demo")
                if self.settings.simulate_phase:
                    options["phase"] = self.settings.simulate_phase
                options.update({k: v for k, v in self.config.simulate.options_dict().items()
                                if k not in options})
            state = SourceState(col.name, explicit=explicit)
            try:
                source = create_source(col, **source_kwargs(self.settings.sysfs, self.settings.procfs,
                                                            options, **extra))
            except SourceUnavailable as exc:
                source = None
                state.state, state.reason = ("down" if explicit else "absent"), str(exc)
            except Exception as exc:  # bad options reach here: source off, reason visible
                source, state.state, state.reason = None, "down", f"{type(exc).__name__}: {exc}"
                state.errors["exception"] += 1
                log.error("source cannot start", extra={"source": col.name, "reason": state.reason})
            if source is not None:
                state.secondary = bool(getattr(source, "secondary", False))
                state.provides_identity = bool(getattr(source, "provides_identity", True))
            interval = cconf.interval or self.poll_interval
            timeout = cconf.timeout or max(2.0, interval)
            self.store.add(state)
            fast = Mapper(self.mappings) if callable(getattr(source, "poll_fast", None)) else None
            self.runtimes.append(Runtime(col, source, state, Mapper(self.mappings), interval,
                                         timeout, Worker(col.name), fast))

    # ---------------------------------------------------------------- one poll
    def _poll_and_map(self, rt: Runtime) -> tuple[Sample, dict, Any, float]:
        """Runs in the source's worker thread: poll, then map (mapper state is per source)."""
        assert rt.source is not None
        t0 = time.perf_counter()
        sample = rt.source.poll()
        duration = time.perf_counter() - t0
        if not sample.monotonic:
            sample.monotonic = time.monotonic()
        devices = self.store.resolve_devices(rt.state, sample.devices)
        result = rt.mapper.map(sample, devices)
        return sample, devices, result, duration

    def _open(self, rt: Runtime) -> None:
        assert rt.source is not None
        rt.source.open()

    async def poll_once(self, rt: Runtime) -> bool:
        """Open if needed, poll one time; update the store.  True when the poll succeeded."""
        st = rt.state
        if rt.source is None:
            return False
        if rt.fast_pending is not None and not rt.fast_pending.done():
            # a fast poll is using the worker: wait for it instead of queueing behind it
            await asyncio.wait({rt.fast_pending}, timeout=rt.timeout)
        if rt.pending is not None and not rt.pending.done():
            st.errors["timeout"] += 1  # still stuck in the previous call
            st.clear()
            st.state, st.reason = "down", f"previous call still running after {rt.timeout:g}s"
            return False
        if not rt.opened:
            try:
                await self._call(rt, lambda: self._open(rt))
            except SourceUnavailable as exc:
                self._backend_missing(rt, str(exc))
                return False
            except Exception as exc:  # noqa: BLE001
                self._failed(rt, exc, "open")
                return False
            rt.opened = True
            log.info("source opened", extra={"source": st.name})
        try:
            sample, devices, result, duration = await self._call(rt, lambda: self._poll_and_map(rt))
        except Exception as exc:  # noqa: BLE001
            self._failed(rt, exc, "poll")
            return False
        st.devices = devices
        st.device_up = {k: sample.device_up.get(k, True) for k in devices}
        st.series = result.series
        st.errors.update(sample.errors)
        if result.malformed:
            st.errors["malformed_value"] += result.malformed
        st.last_duration = duration
        st.last_success = time.time()
        st.polls += 1
        st.up, st.state, st.reason = True, "up", ""
        st.was_up = True
        rt.backend_missing = False
        self.store.touch()
        return True

    def _backend_missing(self, rt: Runtime, reason: str) -> None:
        """The backend is not there.  A source that is only on by default (not asked for and never
        up) is ``absent``: not an error, no ``source_up``.  One that was asked for, or that was
        up before, is ``down``: enabled and failing."""
        st = rt.state
        rt.backend_missing = True
        new_state = "down" if st.explicit or st.was_up else "absent"
        if st.state != new_state or st.reason != reason:
            if new_state == "down":
                log.error("source down: backend not found", extra={"source": st.name, "reason": reason})
            else:
                log.info("source absent", extra={"source": st.name, "reason": reason})
        st.state, st.reason = new_state, reason
        st.clear()
        self.store.touch()

    async def _call(self, rt: Runtime, fn: Callable[[], Any]) -> Any:
        rt.pending = rt.worker.submit(fn)
        try:
            # asyncio.timeout, not wait_for: wait_for on 3.11 can swallow a cancellation that
            # races with the result, which would keep a stopped source loop running
            async with asyncio.timeout(rt.timeout):
                return await asyncio.shield(rt.pending)
        except TimeoutError:
            raise TimeoutError(f"timed out after {rt.timeout:g}s") from None

    def _failed(self, rt: Runtime, exc: BaseException, what: str) -> None:
        st = rt.state
        kinds = getattr(exc, "errors", None)  # a source may say which errors made the poll fail
        kind = "timeout" if isinstance(exc, TimeoutError) else "exception"
        if isinstance(kinds, dict) and kinds:
            st.errors.update(kinds)
        else:
            st.errors[kind] += 1
        reason = f"{what} {exc}" if kind == "timeout" else f"{what} failed: {type(exc).__name__}: {exc}"
        if st.state != "down" or st.reason != reason:
            log.warning("source down", extra={"source": st.name, "reason": reason})
        st.state, st.reason = "down", reason
        st.clear()
        self.store.touch()

    # ---------------------------------------------------------------- loops
    async def _source_loop(self, rt: Runtime) -> None:
        next_at = time.monotonic()
        while not self._stopping:
            await self.poll_once(rt)
            self._polled.add(rt.state.name)
            if self._dirty is not None:
                self._dirty.set()
            if rt.state.state == "absent":
                return  # on by default, backend not on this node: the source stays off
            if rt.backend_missing:  # asked for (or up before): retry now and then, stay down
                await asyncio.sleep(REOPEN_INTERVAL)
                next_at = time.monotonic()
                continue
            next_at += rt.interval
            now = time.monotonic()
            if next_at < now:  # missed ticks (slow poll, suspended process): skip, don't burst
                next_at = now + rt.interval - ((now - next_at) % rt.interval)
            await asyncio.sleep(next_at - now)

    def _fast_and_map(self, rt: Runtime) -> tuple[dict, Any]:
        assert rt.source is not None
        sample = rt.source.poll_fast()  # type: ignore[attr-defined]
        if not sample.monotonic:
            sample.monotonic = time.monotonic()
        devices = self.store.resolve_devices(rt.state, sample.devices)
        # map only what can end up in the fast overlay
        fields = self._fast_fields()
        sample.readings = [r for r in sample.readings
                           if (d := devices.get(r.device)) is not None and r.field in fields.get(d.mapping, ())]
        return sample.errors, rt.fast_mapper.map(sample, devices)  # type: ignore[union-attr]

    def _fast_fields(self) -> dict[str, frozenset[str]]:
        """Per mapping file, the raw fields that feed a FAST_METRICS series (cached per load)."""
        assert self.mappings is not None
        cached = self._fast_fields_for
        if cached is None or cached[0] is not self.mappings:
            table = {name: frozenset(raw for raw, rules in cm.rules.items()
                                     if any(r.metric in FAST_METRICS for r in rules))
                     for name, cm in self.mappings.mappings.items()}
            cached = (self.mappings, table)
            self._fast_fields_for = cached
        return cached[1]

    async def _fast_loop(self, rt: Runtime) -> None:
        """Cheap signals between full polls; they update the series the indicators read."""
        while not self._stopping:
            await asyncio.sleep(self.fast_interval)
            if not rt.opened or rt.worker.busy or not rt.state.up:
                continue
            try:
                rt.fast_pending = rt.worker.submit(lambda: self._fast_and_map(rt))
                async with asyncio.timeout(rt.timeout):
                    errors, result = await asyncio.shield(rt.fast_pending)
            except Exception as exc:  # noqa: BLE001 - the full poll reports the source's health
                rt.state.errors["fast_poll_" + ("timeout" if isinstance(exc, TimeoutError) else "exception")] += 1
                continue
            if not rt.state.up:
                continue  # the full poll failed meanwhile: its series stay dropped
            rt.state.errors.update(errors)
            # only the indicator inputs: counters and other gauges keep their full-poll values
            # (a second mapper's counter totals must never replace the full poll's)
            fast = {k: v for k, v in result.series.items() if k[0] in FAST_METRICS}
            if fast:
                rt.state.series = {**rt.state.series, **fast}  # replaced, never mutated

    async def _indicator_loop(self) -> None:
        assert self.feed is not None
        next_save = time.monotonic() + 60.0
        watchers = [rt.source for rt in self.runtimes
                    if callable(getattr(rt.source, "observe_indicator_output", None))]
        while not self._stopping:
            # sampled at the fast interval; served with the next render (once per poll cycle)
            out = self.feed.update(time.monotonic(), self.store)
            for source in watchers:  # triggered deep capture (profiles): returns at once
                source.observe_indicator_output(time.monotonic(), out)  # type: ignore[union-attr]
            if time.monotonic() >= next_save and not self._state_worker.busy:
                next_save = time.monotonic() + 60.0
                self._state_worker.submit(self.feed.save)
            await asyncio.sleep(self.fast_interval)

    async def _render_loop(self) -> None:
        assert self._dirty is not None
        last_version = -1
        while not self._stopping:
            await self._dirty.wait()
            self._dirty.clear()
            version = self.store.version
            if version != last_version or self.rendered is None:
                last_version = version
                await self.render()
            # at most one render per quarter poll interval, however fast indicators update
            await asyncio.sleep(min(self.poll_interval, 1.0) / 4)

    async def render(self) -> Rendered:
        assert self.renderer is not None
        snapshot = self._snapshot()
        extra = self.extra_series(snapshot)
        static = self._static_labels
        if self.cloud is not None and self.cloud.labels():
            own = {k for k, _ in static}
            static = static + tuple(sorted((k, v) for k, v in self.cloud.labels().items() if k not in own))

        def build() -> Rendered:  # pod attribution reads only cached dicts; off the event loop
            per_device, pods = self._pod_labels(snapshot)
            return self.renderer.render(snapshot, [*extra, *pods] if pods else extra,  # type: ignore[union-attr]
                                        static, per_device)

        self.rendered = await self._render_worker.submit(build)
        self._rendered_up = any(st.up for st in snapshot.sources.values())
        return self.rendered

    def _start_enrichers(self) -> None:
        for t in self._enrich_tasks:
            t.cancel()
        self._enrich_tasks = [asyncio.create_task(e.run(), name=type(e).__name__)
                              for e in (self.cloud, self.k8s) if e is not None and e.enabled]

    def _pod_labels(self, store: Store) -> tuple[dict, list[tuple[str, Labels, float]]]:
        """Per GPU, what pod attribution adds to its series (by series: its process's pod, its MIG
        instance's pod, or the GPU's one pod), and a gpu_pod_info series per allocation."""
        if self.k8s is None or not self.k8s.enabled:
            return {}, []
        pids: dict[tuple[str, str, str], set[str]] = {}
        for st in store.sources.values():
            for name, labels in st.series:
                if len(labels) > 3 and name.startswith("gpu_process_"):
                    for k, v in labels[3:]:
                        if k == "pid":
                            pids.setdefault((labels[0][1], labels[1][1], labels[2][1]), set()).add(v)
        out: dict = {}
        info: list[tuple[str, Labels, float]] = []
        for _, dev in store.info_devices():
            key = (dev.vendor, dev.index, dev.uuid)
            labeler = self.k8s.labeler(dev, pids.get(key, ()))
            if labeler is not None:
                out[key] = labeler
            head = (("vendor", dev.vendor), ("gpu", dev.index), ("uuid", dev.uuid))
            info.extend(("gpu_pod_info", head + ls, 1.0) for ls in self.k8s.info_series(dev))
        return out, info

    def _snapshot(self) -> Store:
        """A copy of the store the render thread can read while sources keep updating."""
        snap = Store()
        snap.version = self.store.version
        for st in self.store.sources.values():
            c = copy.copy(st)
            c.errors = Counter(st.errors)
            c.series = st.series  # replaced, never mutated, on each poll
            snap.add(c)
        return snap

    @property
    def ready(self) -> bool:
        """The bytes being served come from a completed poll of at least one source that is up."""
        return self.rendered is not None and self._rendered_up and not self.rendered.failed

    async def start(self) -> None:
        self.load()
        self.build_runtimes()
        self.build_feed()
        self._start_enrichers()
        self._dirty = asyncio.Event()
        self._start_tasks()
        # give every source one poll before the server opens, so the first scrape has data;
        # a slow or hung source does not hold the start beyond STARTUP_WAIT
        deadline = time.monotonic() + STARTUP_WAIT
        names = {rt.state.name for rt in self.runtimes}
        while not names <= self._polled and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await self.render()

    def _start_tasks(self) -> None:
        self._stopping = False
        self._tasks = [asyncio.create_task(self._source_loop(rt), name=f"source-{rt.state.name}")
                       for rt in self.runtimes]
        if self.config.indicators.enabled:  # fast polls exist only to feed the indicators
            self._tasks += [asyncio.create_task(self._fast_loop(rt), name=f"fast-{rt.state.name}")
                            for rt in self.runtimes if rt.fast_mapper is not None]
        self._tasks.append(asyncio.create_task(self._render_loop(), name="render"))
        if self.feed is not None:
            self._tasks.append(asyncio.create_task(self._indicator_loop(), name="indicators"))

    async def _stop_tasks(self) -> None:
        self._stopping = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self._close_sources(self.runtimes)

    async def _close_sources(self, runtimes: list[Runtime], timeout: float = 1.0) -> None:
        async def close(rt: Runtime) -> None:
            if rt.source is not None and rt.opened and not rt.worker.busy:
                try:
                    async with asyncio.timeout(timeout):
                        await rt.worker.submit(rt.source.close)
                except Exception as exc:  # noqa: BLE001
                    log.warning("source close failed", extra={"source": rt.state.name,
                                                              "reason": str(exc)})
            rt.worker.stop()
        await asyncio.gather(*(close(rt) for rt in runtimes))

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
        try:
            self._apply_loaded(loaded)
        except Exception as exc:  # noqa: BLE001
            (self.config, self.schema, self.mappings, self.cloud, self.k8s, self._static_labels) = old
            self.renderer.schema = self.schema  # type: ignore[assignment]
            return self._reload_failed(exc)
        await self._stop_tasks()
        old_feed = self.feed
        try:
            if old_feed is not None:
                await self._state_worker.submit(old_feed.save)
            old_store, old_runtimes = self.store, self.runtimes
            self.build_runtimes()
            _carry_mapper_state(old_runtimes, self.runtimes, old[2], self.mappings)
            # keep serving what the sources had (and their error counters) until they poll again
            for name, st in self.store.sources.items():
                prev = old_store.sources.get(name)
                if prev is not None and st.state == "starting":
                    st.devices, st.device_up, st.series = prev.devices, prev.device_up, prev.series
                    st.errors = Counter(prev.errors)
                    st.up, st.state, st.reason = prev.up, prev.state, prev.reason
                    st.was_up = prev.was_up
                    st.polls, st.last_success, st.last_duration = prev.polls, prev.last_success, prev.last_duration
            self.build_feed()  # thresholds may have changed
            _carry_indicator_state(old_feed, self.feed)
            self._start_enrichers()  # the reloaded enrich options, with fresh enrichers
        except Exception as exc:  # noqa: BLE001
            self._start_tasks()
            return self._reload_failed(exc)
        self.renderer.reload_ok = True
        self.renderer.reload_ts = time.time()
        log.info("configuration reloaded")
        self._start_tasks()
        return True

    async def stop(self) -> None:
        if self._reload_task is not None and not self._reload_task.done():
            self._reload_task.cancel()  # no reload restarts the sources after this
            await asyncio.gather(self._reload_task, return_exceptions=True)
        for t in self._enrich_tasks:
            t.cancel()
        await self._stop_tasks()
        if self.feed is not None:
            try:
                async with asyncio.timeout(0.5):
                    await self._state_worker.submit(self.feed.save)
            except TimeoutError:
                log.warning("saving indicator state timed out")
        self._render_worker.stop()
        self._state_worker.stop()
        self._load_worker.stop()

    # ---------------------------------------------------------------- --once
    async def run_once(self, cycles: int = 2) -> tuple[bytes, int]:
        """Poll every source ``cycles`` times (rates need two), render, report failures."""
        self.load()
        self.build_runtimes()
        self.build_feed()
        assert self.feed is not None
        for i in range(cycles):
            if i:
                await asyncio.sleep(self.poll_interval)
            await asyncio.gather(*(self.poll_once(rt) for rt in self.runtimes))
            self.feed.update(time.monotonic(), self.store)
        rendered = await self.render()
        failed = [rt.state for rt in self.runtimes if rt.state.explicit and not rt.state.up]
        for st in failed:
            log.error("explicitly enabled source failed", extra={"source": st.name, "reason": st.reason})
        await self._close_sources(self.runtimes)
        self.feed.save()
        self._render_worker.stop()
        self._state_worker.stop()
        self._load_worker.stop()
        return rendered.text, (1 if failed else 0)


def _carry_mapper_state(old: list[Runtime], new: list[Runtime], old_mappings: MappingSet | None,
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


def _carry_indicator_state(old: IndicatorFeed | None, new: IndicatorFeed | None) -> None:
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
