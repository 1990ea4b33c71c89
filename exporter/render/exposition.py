"""Render the store into exposition bytes once per cycle (text 0.0.4, OpenMetrics, gzip of each).

The one render path: the sources' frames, ``gpu_info`` per GPU and the extra frames (the
indicators', ``gpu_pod_info``) become lines in ``series_lines.SeriesLines`` (which keeps the
lines of unchanged series from the last cycle); the self-metrics are built fresh each cycle.
``textformat.write`` puts the families' headers before their lines.  The scrape path only
sends the cached bytes.
"""

from __future__ import annotations

import gzip
import logging
import platform
import time
from collections.abc import Callable, Iterable, Mapping

from .. import __version__
from ..enrich import hpc_jobs
from ..map.schema import HISTOGRAM_SUFFIXES, Schema
from ..map.store import Store
from ..model import DeviceId, Frames, Labels, Sample
from . import cpustats, otlp_stats, process_metrics, server_stats
from .self_metrics import SELF, SELF_METRICS, SOURCE_COUNTERS, SOURCE_SELF_METRICS
from .series_lines import DeviceLabels, SeriesLines
from .seriesfilter import SeriesFilter
from .textformat import Counts, Family, PrefixCache, body, write

# the classic text format (0.0.4) every Prometheus version parses
# the content types prometheus_client serves the two formats with (tests/test_process_metrics.py
# checks they still agree); literals, so serving does not import the client library
TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
log = logging.getLogger("unified_gpu_exporter")

def _family(name: str, typ: str, doc: str, unit: str) -> Family:
    base = name[:-6] if typ == "counter" and name.endswith("_total") else name
    if unit and not base.endswith("_" + unit):
        unit = ""
    return Family(base, "gauge" if typ == "info" else typ, doc, unit)


def _histogram_order(sample: Sample) -> tuple:
    """Group a histogram's samples per label set: buckets by ascending le, then _sum, _count."""
    name, labels, _ = sample
    rest = tuple(sorted((k, v) for k, v in labels if k != "le"))
    if name.endswith("_bucket"):
        try:
            le = float(dict(labels).get("le", "+Inf"))
        except ValueError:
            le = float("inf")
        return (rest, 0, le)
    return (rest, 1 if name.endswith("_sum") else 2, 0.0)


class Rendered:
    """One cycle's exposition.  The text format is rendered with the cycle; OpenMetrics and the
    gzip of each only when first asked for (most scrapers want one of the four), then kept."""

    __slots__ = ("text", "_om", "_text_gz", "_om_gz", "series", "at", "failed")

    def __init__(self, text: bytes, openmetrics: bytes | Callable[[], bytes], series: int, at: float,
                 failed: bool = False):
        self.text = text
        self._om = openmetrics
        self._text_gz: bytes | None = None
        self._om_gz: bytes | None = None
        self.series = series
        self.at = at
        self.failed = failed  # the full render failed: only self-metrics are in these bytes

    @property
    def openmetrics(self) -> bytes:
        om = self._om
        if callable(om):
            om = self._om = om()
        return om

    @property
    def text_gz(self) -> bytes:
        if self._text_gz is None:
            self._text_gz = gzip.compress(self.text, 1)
        return self._text_gz

    @property
    def openmetrics_gz(self) -> bytes:
        if self._om_gz is None:
            self._om_gz = gzip.compress(self.openmetrics, 1)
        return self._om_gz


class Renderer:
    def __init__(self, schema: Schema):
        self.schema = schema
        self.render_duration = 0.0
        self.reload_ok = True
        self.reload_ts = time.time()
        self.render_errors = 0
        self.last_error = ""
        self._parts: dict[str, str] = {}
        self._parts_for: Schema | None = None
        self._heads: dict[str, Family] = {}
        self._heads_for: Schema | None = None
        self._prefixes = PrefixCache()
        self._lines: SeriesLines | None = None
        # cardinality control (config `exposition`): None serves every series
        self.series_filter: SeriesFilter | None = None
        self.self_metrics = True  # False: the canonical series only (the import command)

    def _histogram_parts(self) -> dict[str, str]:
        """x_bucket / x_sum / x_count -> x for every histogram of the schema."""
        if self._parts_for is not self.schema:
            self._parts = {name + sfx: name for name, m in self.schema.metrics.items()
                           if m.type == "histogram" for sfx in HISTOGRAM_SUFFIXES}
            self._parts_for = self.schema
        return self._parts

    def _self_metrics(self, store: Store) -> list[Family]:
        fams = {n: _family(SELF + n, t, h, "") for n, (t, h) in SELF_METRICS.items()}

        def add(n: str, labels: dict[str, str], value: float) -> None:
            fams[n].samples.append((SELF + n, tuple(labels.items()), value))

        add("build_info", {"version": __version__, "python_version": platform.python_version(),
                           "schema_version": str(self.schema.version)}, 1)
        for st in store.sources.values():
            s = {"source": st.name}
            if st.stats.state != "absent":  # a backend this node does not have is not a failure
                add("source_up", s, 1.0 if st.stats.up else 0.0)
            add("source_enabled", {**s, "state": st.stats.state, "reason": st.stats.reason[:200]}, 1)
            if st.stats.polls:
                add("source_poll_duration_seconds", s, st.stats.last_duration)
            if st.stats.last_success:
                add("source_last_success_timestamp_seconds", s, st.stats.last_success)
            for m in SOURCE_COUNTERS:  # declared: from 0 (the `always` label values), then as counted
                counts = dict.fromkeys(m.always, 0) | dict(st.stats.counts.get(m.name, ()))
                for value, count in sorted(counts.items()):
                    add(m.name, {**s, m.labels[0]: value} if m.labels else s, float(count))
            add("source_series", s, float(st.series_count()))
            for name, labels, value in st.self_samples:
                if name in SOURCE_SELF_METRICS:  # declared ones only: a source cannot invent families
                    add(name, {**s, **dict(labels)}, value)
            up: dict[tuple[str, str, str], bool] = {}
            for key, dev in st.devices.items():  # one per identity (a device may have companions)
                ident = dev.id
                up[ident] = up.get(ident, True) and st.device_up.get(key, True)
            for (vendor, gpu, uuid), ok in up.items():  # a down source's devices are not known up
                add("device_up", {"source": st.name, "vendor": vendor, "gpu": gpu, "uuid": uuid},
                    1.0 if ok and st.stats.up else 0.0)
        add("render_duration_seconds", {}, self.render_duration)
        add("render_errors_total", {}, float(self.render_errors))
        add("invalid_utf8_replaced_total", {}, float(Counts.invalid_utf8))
        add("config_last_reload_successful", {}, 1.0 if self.reload_ok else 0.0)
        add("config_last_reload_success_timestamp_seconds", {}, self.reload_ts)
        for name, labels, value in (*otlp_stats.STATS.samples(), *server_stats.STATS.samples(),
                                     *hpc_jobs.STATS.samples()):
            add(name, labels, value)
        proc = process_metrics.sample()
        for stage, source, seconds in cpustats.snapshot(proc["process_cpu_seconds_total"]):
            add("stage_cpu_seconds_total", {"stage": stage, "source": source} if source else {"stage": stage},
                seconds)
        filt = self.series_filter
        own = [f for n, f in fams.items() if f.samples and (filt is None or filt.family(SELF + n))]
        for name, value in proc.items():
            typ, doc = process_metrics.HELP[name]
            if filt is None or filt.family(name):
                fam = _family(name, typ, doc, "")
                fam.samples.append((name, (), value))
                own.append(fam)
        return own

    def _series_lines(self) -> SeriesLines:
        lines = self._lines
        if lines is None or lines.schema is not self.schema:
            lines = self._lines = SeriesLines(self.schema, self._histogram_parts(), _histogram_order)
        return lines

    def _sections(self, store: Store, extra: Iterable[Frames], static_labels: Labels,
                  per_device: Mapping[DeviceId, DeviceLabels] | None) -> tuple[list[tuple[Family, str]], int]:
        """(family, its sample lines) in exposition order (the schema's, then the self-metrics),
        and how many samples; the lines of unchanged series are reused from the previous cycle."""
        own = self._self_metrics(store) if self.self_metrics else []
        lines, count = self._series_lines().collect(
            gpu_info(store), [st.frames for st in store.sources.values()], extra, static_labels,
            per_device, self.series_filter)
        heads = self._families()
        sections = [(heads[n], "".join(lines[n])) for n in self.schema.metrics if n in lines]
        for fam in own:
            sections.append((fam, body(fam, self._prefixes)))
            count += len(fam.samples)
        return sections, count

    def _families(self) -> dict[str, Family]:
        """An empty family (name, type, help, unit) per canonical metric, for the headers."""
        if self._heads_for is not self.schema:
            self._heads = {n: _family(n, m.type, m.help, m.unit) for n, m in self.schema.metrics.items()}
            self._heads_for = self.schema
        return self._heads

    def render(self, store: Store, extra: Iterable[Frames] = (), static_labels: Labels = (),
               per_device: Mapping[DeviceId, DeviceLabels] | None = None) -> Rendered:
        """The exposition of ``store``'s frames, then each of ``extra``'s (the indicators'
        output, gpu_pod_info), with ``static_labels`` and ``per_device``'s (pod attribution)
        on every GPU series."""
        t0 = time.perf_counter()
        failed = False
        self._prefixes.rotate()  # prefixes of series gone since the last render are dropped
        try:
            sections, count = self._sections(store, extra, static_labels, per_device)
            text = write(sections, openmetrics=False)
            om: bytes | Callable[[], bytes] = _openmetrics_later(sections)
        except Exception as exc:  # noqa: BLE001 - never serve stale bytes silently
            failed = True
            self.render_errors += 1
            error = f"{type(exc).__name__}: {str(exc)[:200]}"
            if error != self.last_error:  # once per distinct error, not once per cycle
                log.error("render failed: serving self-metrics only, not ready",
                          extra={"reason": error})
            self.last_error = error
            self._prefixes = PrefixCache()  # a poisoned cache entry must not survive
            self._lines = None
            families = self._self_metrics(store)
            count = sum(len(f.samples) for f in families)
            own = [(fam, body(fam, self._prefixes)) for fam in families]
            text = write(own, openmetrics=False)
            om = write(own, openmetrics=True)  # small: at once
        else:
            if self.last_error:
                log.info("render recovered")
            self.last_error = ""
        rendered = Rendered(text, om, count, time.time(), failed)
        self.render_duration = time.perf_counter() - t0
        return rendered


def _openmetrics_later(sections: list[tuple[Family, str]]) -> Callable[[], bytes]:
    """OpenMetrics bytes of these families, rendered when first served: the sample lines are the
    text format's, only the headers differ."""
    return lambda: write(sections, openmetrics=True)


def gpu_info(store: Store) -> Frames:
    """One ``gpu_info`` series per GPU identity (the first source that names it)."""
    return {dev.id: {("gpu_info", (("driver", dev.driver), ("model", dev.model),
                                   ("pci_bus_id", dev.pci_bus_id), ("serial", dev.serial),
                                   ("simulated", "true" if dev.simulated else "false"),
                                   ("source", src))): 1.0}
            for src, dev in store.info_devices()}
