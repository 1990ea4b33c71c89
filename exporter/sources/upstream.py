"""Upstream source: scrape vendor exporters that already run on the node and re-read their series.

Options (the ``upstream`` section of the config)::

    targets:
      - name: dcgm                      # unique; used in logs and in fallback device keys
        url: http://127.0.0.1:9400/metrics
        exporter: dcgm-exporter         # | amd-device-metrics-exporter | xpumanager | nvidia_gpu_exporter
        timeout: 5.0                    # seconds for the whole request (connect + body), default 5
        metric_prefix: ""               # stripped from metric names (DME's MetricsFieldPrefix "amd_")
        tls: {ca_file: ..., cert_file: ..., key_file: ..., insecure_skip_verify: false}
        basic_auth: {username: ..., password: ... | password_file: ...}
        max_series: 20000               # per poll; above it the target fails (limit_exceeded)
        max_label_values: 1000          # distinct values of one label name, likewise
        schema: dcgm-4.7                # optional: the naming generation, when known

The model (``options.UpstreamTarget``) holds the only defaults; ``parse_targets`` resolves it.

Only http:// and https:// URLs with a host and no credentials (``user:password@``: give them as
``basic_auth``) are accepted (checked at config load; a password is logged as ``xxxxx``), redirects are
refused, proxies from the environment are not used, and a body is limited to MAX_BODY_BYTES both
on the wire and after gzip decompression.

Each series becomes a raw reading: field = the upstream metric name (qualified by the exporter's
selector labels, see ``upstream_identity``), value = the sample value, labels = the remaining
dimension labels.  The device's mapping file is ``mappings/upstream/<exporter>.yaml``.

Per scrape and host behind the target, the naming generation is recognised from the mapping
file's ``schemas`` (``upstream_schema``): a raw field whose unit depends on it is qualified with
the schema whose unit the names and values (of this scrape and, remembered, earlier ones; a HELP
text breaks a tie) prove (``DCGM_FI_DEV_GPU_UTIL_RATIO{schema="dcgm-4.7"}``), or, unproven,
dropped and counted (error kind ``unit_ambiguous``); the poll reports the self-metrics
``upstream_schema_info{target, exporter, schema}`` (one series per distinct host result) and
``upstream_unknown_fields{target, exporter}`` (metric names no mapping knows; a new set is
logged at most once per ``UNKNOWN_LOG_INTERVAL_S`` per target, the first names, each cut).  The schema memory of a target is forgotten when it fails.

A target that fails in a poll (refused, timeout, HTTP error, unparsable body) contributes no
readings at all in that poll; its error kind is counted (read_error, timeout, parse_error) and
its devices seen before are reported with ``device_up=False``.  When every target fails, ``poll``
raises ``UpstreamDown`` (``UpstreamTimeout``, a ``TimeoutError``, when all of them timed out) so
that the daemon reports the source down; the exception carries the error kinds in ``errors``.
No value is cached between polls, so a stale value is never served again.

``secondary = True``: the store drops an upstream GPU that a native source also reads (same
normalized PCI bus id key, or same uuid).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, ClassVar, NamedTuple

from ..http_deadline import redact_url
from .base import Abilities, Device, PollResult, SourceBase, SourceUnavailable
from .context import DEFAULT_CONTEXT, SourceContext
from .options import UpstreamOptions
from .upstream_events import EventFields
from .upstream_fetch import (  # noqa: F401 - FetchError, MAX_BODY_BYTES: importable from here
    MAX_BODY_BYTES,
    FetchError,
    Target,
    TargetReadings,
    UpstreamDown,
    UpstreamTimeout,
    fetch,
    parse_exposition,
    parse_targets,
    read_series,
    scrape_target,
)
from .upstream_identity import (
    SeriesIdentity,
)
from .upstream_schema import Group, Memory, dropped, group_by_host, qualify, resolve_target, unknown

log = logging.getLogger(__name__)
# after a target's own deadline, how long its parse may take before the poll stops waiting
RESULT_GRACE_S = 5.0
UNKNOWN_LOG_INTERVAL_S = 600.0  # a target's unknown metric names: at most one line per this
UNKNOWN_SHOWN = 20  # names shown in that line
UNKNOWN_NAME_CHARS = 120  # characters of each
_AMBIGUOUS = ("upstream target %s (%s): %s not mapped: the names and values of its scrapes do not prove "
              "one unit, or contradict each other (counted as unit_ambiguous; set the target's schema "
              "option if you know the exporter's version)")
_HELP_CONFLICT = ("upstream target %s (%s): the HELP text of %s names a unit that the names and values "
                  "rule out (a text carried over from an older collector CSV?): ignored")


_DROPPED = ("upstream target %s (%s): not converted, on purpose: %s (the reason per name: "
            "docs/dcgm-migration.md \"Dropped\"; counted in upstream_dropped_fields)")


class _Scraped(NamedTuple):
    """One target's answer, parsed on its thread."""

    result: TargetReadings
    extra: list  # self-metric samples
    ambiguous: int  # readings skipped for want of a proven unit
    memory: Memory  # the schema memory to keep when the poll takes this answer

# --- the source ------------------------------------------------------------------------------


class UpstreamSource(SourceBase):
    """Re-reads vendor exporters (dcgm-exporter, AMD DME, XPU Manager, nvidia_gpu_exporter)."""

    name: ClassVar[str] = "upstream"
    # native sources win for a GPU they also read (compared by PCI key or uuid in the store)
    abilities = Abilities(secondary=True)
    secondary: ClassVar[bool] = abilities.secondary  # the flag's older spelling

    def __init__(self, context: SourceContext = DEFAULT_CONTEXT) -> None:
        # the typed options (validated with the configuration file; a dict from a tool or test is
        # validated here); parse_targets resolves what the model only types (TLS, password files)
        self._targets = parse_targets(context.typed(UpstreamOptions))
        # the daemon's loaded mapping set: schemas and known names come from it; without one (a
        # bare test source) no schema is recognised and nothing counted unknown
        self._mappings = context.mappings
        self._unknown_logged: dict[str, frozenset[str]] = {}  # target name -> names last seen
        self._unknown_at: dict[str, float] = {}  # target name -> when its unknown names were logged
        self._unknown_quiet: dict[str, int] = {}  # target name -> new sets not logged since
        self._ambiguous_logged: dict[str, frozenset[str]] = {}  # target name -> fields last logged
        self._help_logged: dict[str, frozenset[str]] = {}  # likewise, fields whose HELP conflicts
        self._dropped_logged: dict[str, frozenset[str]] = {}  # likewise, names dropped on purpose
        self._memory: dict[str, Memory] = {}  # target name -> what its hosts' evidence ruled out
        self._pool: _DaemonThreads | None = None
        # target name -> devices (by key) it produced last time it answered
        self._known: dict[str, dict[str, Device]] = {}
        self._failing: dict[str, str] = {}  # target name -> error kind it is failing with
        self._inflight: dict[str, Future] = {}  # target name -> its last scrape
        self._events = EventFields()  # XID codes and throttle bitmasks as countable readings

    def open(self) -> None:
        if not self._targets:
            raise SourceUnavailable("no upstream targets configured (upstream.targets is empty)")
        self._pool = _DaemonThreads()

    def close(self) -> None:
        self._pool = None

    def poll(self) -> PollResult:
        sample = PollResult()
        if self._pool is None:
            self.open()
        assert self._pool is not None
        started = time.monotonic()
        futures = [(t, self._submit(t)) for t in self._targets]
        keys_taken: set[str] = set()
        failures: list[str] = []
        for target, future in futures:
            try:
                # each target has its own deadline (fetch() enforces it on the socket); this
                # bound only keeps one stuck thread from holding the others' results
                wait = started + target.timeout + RESULT_GRACE_S - time.monotonic()
                try:
                    scraped: _Scraped = future.result(timeout=max(0.0, wait))
                except FutureTimeout:
                    raise FetchError("timeout", f"no answer within {target.timeout} s") from None
            except FetchError as e:
                self._target_failed(target, e.kind, str(e), sample, keys_taken)
                failures.append(f"{target.name}: {e.kind}: {e}")
                continue
            except Exception as e:  # a bug must not take the other targets down
                log.exception("upstream target %s: unexpected error", target.name)
                self._target_failed(target, "read_error", repr(e), sample, keys_taken)
                failures.append(f"{target.name}: {e!r}")
                continue
            if target.name in self._failing:
                del self._failing[target.name]
                log.info("upstream target %s (%s) answers again", target.name, redact_url(target.url))
            self._memory[target.name] = scraped.memory
            self._add_target(target, scraped.result, sample, keys_taken)
            sample.self_samples.extend(scraped.extra)
            if scraped.ambiguous:
                sample.errors["unit_ambiguous"] += scraped.ambiguous
        if failures and len(failures) == len(self._targets):
            errors = Counter(sample.errors)
            cls = UpstreamTimeout if set(errors) == {"timeout"} else UpstreamDown
            raise cls(errors, "; ".join(failures))
        return sample

    def _submit(self, target: Target) -> Future:
        """One scrape (read and parse) per target at a time: a thread the poll gave up waiting
        for still holds its body; while it runs, the target fails with ``timeout`` instead of
        starting another one beside it (issue 37: each poll started another parse)."""
        assert self._pool is not None
        running = self._inflight.get(target.name)
        if running is not None and not running.done():
            failed: Future = Future()
            failed.set_exception(FetchError("timeout", "its previous scrape is still being read or "
                                                       "parsed; no second one is started beside it"))
            return failed
        fut = self._pool.submit(self._scrape, target)
        self._inflight[target.name] = fut
        return fut

    def _scrape(self, target: Target) -> _Scraped:
        """``scrape_target`` plus the schema (run on the target's thread): schema-dependent raw
        fields qualified with the schema ``resolve_target`` proved for their host, or dropped
        (counted), the schemas and the unknown names as self-metric samples, and the schema
        memory to keep (the poll keeps it only from a result it takes)."""
        text, content_type = fetch(target)
        cm = self._mappings.get(target.spec.mapping) if self._mappings is not None else None
        dependent: frozenset[str] = cm.schema_dependent if cm is not None else frozenset()
        markers: frozenset[str] = cm.schema_markers if cm is not None else frozenset()
        # the HELP texts: evidence only for the schema-dependent fields (most files have none)
        helps: dict[str, str] | None = {} if dependent else None
        samples = parse_exposition(text, content_type, helps, target.max_series)
        result = read_series(target, samples, markers)
        prefix = target.metric_prefix
        hosts = {ref: ident.host for ref, ident in result.identities.items()}
        groups = group_by_host(hosts, result.readings, result.label_names, dependent)
        if not groups:  # no GPU series: the target's names still say which generation it is
            groups = {"": Group({n.removeprefix(prefix) for n, _, _ in samples},
                                {k for _, lb, _ in samples for k in markers.intersection(lb)})}
        bases = {fld.partition("{")[0] for fld in dependent}
        res = resolve_target(cm, groups, {b: h for n, h in (helps or {}).items()
                                          if (b := n.removeprefix(prefix)) in bases},
                             target.schema, self._memory.get(target.name, {}))
        skipped = 0
        if dependent:
            kept = []
            for ref, fld, value, dims in result.readings:
                if fld in dependent:
                    schema = res.chosen.get((hosts.get(ref, ""), fld))
                    if schema is None:
                        skipped += 1
                        continue
                    fld = qualify(fld, schema)
                kept.append((ref, fld, value, dims))
            result.readings = kept
        result.readings = self._events.expand(target.name, result.readings)
        self._say(self._ambiguous_logged, target, res.skipped, _AMBIGUOUS)
        self._say(self._help_logged, target, res.help_conflicts, _HELP_CONFLICT)
        labels = (("target", target.name), ("exporter", target.spec.name))
        extra = []
        if cm is not None:
            names = {fld for _, fld, _, _ in result.readings}
            unknown_names = self._unknown(target, cm, names)
            extra.append(("upstream_unknown_fields", labels, float(len(unknown_names))))
            gone = frozenset(dropped(cm, names))
            self._say(self._dropped_logged, target, gone, _DROPPED, logging.INFO)
            extra.append(("upstream_dropped_fields", labels, float(len(gone))))
        extra.extend(("upstream_schema_info", (*labels, ("schema", schema)), 1.0) for schema in res.schemas)
        return _Scraped(result, extra, skipped, res.memory)

    @staticmethod
    def _say(logged: dict[str, frozenset[str]], target: Target, fields: frozenset[str], message: str,
             level: int = logging.WARNING) -> None:
        """Log once per target and change of the set of ``fields`` (skipped, or with a HELP text
        that conflicts)."""
        if logged.get(target.name, frozenset()) == fields:
            return
        if len(logged) < 1024:  # bounded: target names come from the config
            logged[target.name] = fields
        if fields:
            log.log(level, message, target.name, target.spec.name, ", ".join(sorted(fields)[:20]))

    def _unknown(self, target: Target, cm: Any, fields: set[str]) -> set[str]:
        """The names no mapping knows; a new set is logged, summarized: at most once per
        ``UNKNOWN_LOG_INTERVAL_S`` per target (changes between are counted in the next line),
        the first ``UNKNOWN_SHOWN`` names each cut to ``UNKNOWN_NAME_CHARS`` (issue 37: a target
        changing its names each poll wrote 18 MB of log in 15 s, lines of 1.2 MB)."""
        names = unknown(cm, fields)
        key = frozenset(names)
        if not names or self._unknown_logged.get(target.name) == key:
            return names
        now = time.monotonic()
        last = self._unknown_at.get(target.name)
        if len(self._unknown_logged) < 1024 or target.name in self._unknown_logged:  # config names
            self._unknown_logged[target.name] = key
            if last is not None and now - last < UNKNOWN_LOG_INTERVAL_S:
                self._unknown_quiet[target.name] = self._unknown_quiet.get(target.name, 0) + 1
                return names
            self._unknown_at[target.name] = now
        quiet = self._unknown_quiet.pop(target.name, 0)
        shown = [n if len(n) <= UNKNOWN_NAME_CHARS else f"{n[:UNKNOWN_NAME_CHARS]}...({len(n)} characters)"
                 for n in sorted(names)[:UNKNOWN_SHOWN]]
        log.info("upstream target %s (%s): %d metric names no mapping knows: %s%s%s", target.name,
                 target.spec.name, len(names), ", ".join(shown), " ..." if len(names) > UNKNOWN_SHOWN else "",
                 f" ({quiet} other sets since the last line, not logged)" if quiet else "")
        return names

    def _target_failed(
        self, target: Target, kind: str, message: str, sample: PollResult, keys_taken: set[str]
    ) -> None:
        sample.errors[kind] += 1
        self._memory.pop(target.name, None)  # what answers next may be another exporter version
        if self._failing.get(target.name) != kind:  # once per target and state change
            self._failing[target.name] = kind
            log.warning("upstream target %s (%s) failed: %s: %s", target.name, redact_url(target.url), kind, message)
        for key, device in self._known.get(target.name, {}).items():
            if key not in keys_taken:
                keys_taken.add(key)
                sample.devices.append(device)
                sample.device_up[key] = False

    def _add_target(
        self, target: Target, result: TargetReadings, sample: PollResult, keys_taken: set[str]
    ) -> None:
        devices: dict[str, Device] = {}
        key_of_ref: dict[str, str] = {}
        for position, (ref, ident) in enumerate(result.identities.items()):
            device = _device(target, ident, position)
            if device.key in keys_taken:
                log.debug("upstream target %s: GPU %s already read from another target",
                          target.name, device.key)
                continue
            keys_taken.add(device.key)
            key_of_ref[ref] = device.key
            devices[device.key] = device
            sample.devices.append(device)
            sample.device_up[device.key] = True
        for key, device in self._known.get(target.name, {}).items():
            if key not in devices and key not in keys_taken:  # vanished from the exporter
                keys_taken.add(key)
                sample.devices.append(device)
                sample.device_up[key] = False
        self._known[target.name] = devices
        for ref, fld, value, dims in result.readings:
            key = key_of_ref.get(ref)
            if key is not None:
                sample.add(key, fld, value, dims)


class _DaemonThreads:
    """Runs each call in its own daemon thread.  concurrent.futures' pool threads are joined at
    interpreter exit, so a target being read or parsed would hold up SIGTERM; these are not."""

    def submit(self, fn: Any, *args: Any) -> Future:
        fut: Future = Future()

        def run() -> None:
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - handed to the poll
                fut.set_exception(e)
        threading.Thread(target=run, name="upstream", daemon=True).start()
        return fut


def _device(target: Target, ident: SeriesIdentity, position: int) -> Device:
    """Device key: normalized PCI bus id, else UUID, else a key scoped to the target."""
    index = ident.index or str(position)
    scoped = ":".join(p for p in (target.name, ident.host, f"gpu{index}") if p)
    return Device(
        key=ident.pci_bus_id or ident.uuid or scoped,
        vendor=target.spec.vendor,
        index=index,
        mapping=target.spec.mapping,
        uuid=ident.uuid,
        model=ident.model,
        pci_bus_id=ident.pci_bus_id,
        driver=ident.driver,
        serial=ident.serial,
    )


__all__ = ["FetchError", "Target", "UpstreamDown", "UpstreamTimeout", "UpstreamSource", "fetch", "parse_exposition",
           "parse_targets", "read_series"]
