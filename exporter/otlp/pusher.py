"""The push thread: at most one cycle waiting, never a wait on the scrape path.

``offer`` is called on the event loop after every render and returns at once: when a push is
due (one per ``interval``) it puts the rendered cycle in the one pending slot, replacing (and
counting) a cycle the thread had not taken yet.  The thread converts the cycle's exposition,
exports it with the SDK's OTLP exporter (retries bounded by ``timeout``) and counts the result.
A failure is logged when the push starts failing and when it recovers, not at every push.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable

from ..http_deadline import redact_url
from ..map.schema import Schema
from ..render.otlp_stats import STATS, PushStats
from .config import OtlpConfig
from .convert import Converter
from .naming import OtelMapping

log = logging.getLogger("unified_gpu_exporter")
SDK_LOGGERS = ("opentelemetry.exporter", "opentelemetry.sdk")


# the SDK's closing summaries, which say that a push failed but not why
GENERIC = re.compile(r"due to timeout, max retries or shutdown|Shutdown in progress|already shutdown")
MAX_REASON = 600


class _Reasons(logging.Handler):
    """The SDK exporters' warnings and errors of the push under way (at most ``keep``), for the
    one log line of a failing push: the most specific of them, not the summary that ends it."""

    def __init__(self, keep: int = 16) -> None:
        super().__init__(logging.WARNING)
        self.keep = keep
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string in a library message
            text = str(record.msg)
        if len(self.messages) < self.keep:
            self.messages.append(text[:MAX_REASON])
        else:
            self.messages[-1] = text[:MAX_REASON]  # the closing message still replaces the last

    def reason(self, transport: str = "") -> str:
        """``transport``: the transport's own record of the failure (the TLS error, the HTTP
        status), preferred to any message; then the last message that is not a summary; the
        summary that closed the push follows in parentheses."""
        last = self.messages[-1] if self.messages else ""
        specific = transport or next((m for m in reversed(self.messages) if not GENERIC.search(m)), "")
        if not specific:
            return last or "the receiver did not accept the push"
        return specific if not last or last == specific else f"{specific} ({last})"[:MAX_REASON]


class Pusher:
    def __init__(self, cfg: OtlpConfig, mapping: OtelMapping, schema: Schema,
                 resource: Callable[[tuple], dict[str, str]], stats: PushStats = STATS,
                 after_warmup: Callable[[], None] | None = None):
        self.cfg, self.mapping, self.schema, self.stats = cfg, mapping, schema, stats
        self._resource = resource
        # called once after the first push (the daemon's gc tuning: the SDK's modules and the
        # first push's caches, built for good, leave the collector's generations)
        self._after_warmup = after_warmup
        self._converter = Converter(mapping, schema)
        self._encoder = None  # encode.Encoder, made by the thread (it imports the protobuf modules)
        self._sdk = None  # the sdk module, imported by the thread
        self._lock = threading.Lock()
        self._pending: tuple | None = None
        self._wake = threading.Event()
        self._closing = False
        self._next_due = 0.0
        self._thread: threading.Thread | None = None
        self._state: bool | None = None  # the last push's outcome (for logging changes)
        self._why = _Reasons()
        self.pushed = threading.Event()  # set after every completed push (tests wait on it)

    # ------------------------------------------------------------------ event loop side
    def keeps(self, cfg: OtlpConfig, mapping: OtelMapping, schema: Schema) -> bool:
        """Whether a reload to these can keep this pusher, with its start times, its exporter's
        connection and its logged state: the section, its headers file and TLS files, the names and
        the schema are unchanged, and the pusher still runs (not closing, its thread not started
        yet or alive: a thread that died is replaced)."""
        alive = self._thread is None or self._thread.is_alive()
        return (not self._closing and alive and cfg.identity() == self.cfg.identity()
                and _same(mapping, self.mapping) and _same(schema, self.schema))

    def set_resource(self, resource: Callable[[tuple], dict[str, str]]) -> None:
        """The resource of the reloaded config (cloud, node name): taken by the next push."""
        self._resource = resource

    def offer(self, rendered, static_labels: tuple) -> bool:  # noqa: ANN001 - exposition.Rendered
        """Hand over a freshly rendered cycle if a push is due; True when it was taken."""
        now = time.monotonic()
        if self._closing or now < self._next_due or rendered is None or rendered.failed:
            return False
        self._next_due = now + self.cfg.interval
        with self._lock:
            if self._pending is not None:
                self.stats.dropped += 1
            self._pending = (rendered, static_labels)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="otlp-push", daemon=True)
            self._thread.start()
        self._wake.set()
        return True

    def close(self, wait: float = 0.0) -> None:
        """Stop taking cycles; the thread pushes what is pending and ends.  ``wait``: seconds to
        wait for that (0 on the event loop: a slow receiver never holds up a reload or a stop)."""
        self._closing = True
        self._wake.set()
        if wait > 0 and self._thread is not None:
            self._thread.join(wait)

    # ------------------------------------------------------------------ push thread
    def _run(self) -> None:
        exporter = None
        frozen = False
        try:
            while True:
                self._wake.wait()
                self._wake.clear()
                with self._lock:
                    job, self._pending = self._pending, None
                if job is not None:
                    if exporter is None:
                        exporter = self._start()
                    if exporter is not None:
                        self._push(exporter, *job)
                        if not frozen:
                            if self._after_warmup is not None:
                                self._after_warmup()
                            frozen = True
                    self.pushed.set()
                if self._closing:
                    return
        finally:
            if exporter is not None:
                for name in SDK_LOGGERS:
                    logging.getLogger(name).removeHandler(self._why)
                try:
                    exporter.shutdown()
                except Exception:  # noqa: BLE001
                    pass

    def _start(self):  # noqa: ANN202 - transport.Exporter, or None
        """The exporter, or None where it cannot be made (unreadable or bad TLS material, a broken
        install): counted as a failed push and tried again with the next cycle, one interval on,
        so the failure keeps counting (and GPUExporterOtlpPushFailing keeps firing) until it is
        fixed, on disk or by a reload; logged once, like a failing push."""
        try:
            from . import sdk
            from .encode import Encoder
            from .transport import make_exporter

            self._encoder = Encoder()
            exporter = make_exporter(self.cfg)
        except Exception as exc:  # noqa: BLE001 - counted and logged, never the thread's end
            self.stats.failure += 1
            self._log_outcome(False, f"cannot start: {type(exc).__name__}: {exc}"[:MAX_REASON])
            return None
        self._sdk = sdk
        for name in SDK_LOGGERS:
            lg = logging.getLogger(name)
            lg.addHandler(self._why)
            lg.propagate = False  # their per-attempt messages are summarised by _log_outcome
        return exporter

    def _push(self, exporter, rendered, static_labels: tuple) -> None:  # noqa: ANN001
        t0 = time.perf_counter()
        self._why.messages = []
        exporter.take_failure()
        try:
            strip = frozenset(k for k, _ in static_labels)
            conv = self._converter.convert(rendered.text, rendered.at, strip)
            ok = self._sdk.send(exporter.sdk, self._encoder, conv, self._resource(static_labels),
                                self.mapping.schema_url, self.cfg.timeout)
            why = "" if ok else self._why.reason(exporter.take_failure())
            self.stats.points = conv.exported
        except Exception as exc:  # noqa: BLE001 - never let the thread die
            ok, why = False, f"{type(exc).__name__}: {exc}"[:MAX_REASON]
        self.stats.duration = time.perf_counter() - t0
        if ok:
            self.stats.success += 1
            self.stats.last_success = time.time()
        else:
            self.stats.failure += 1
        self._log_outcome(ok, why)

    def _log_outcome(self, ok: bool, why: str) -> None:
        if ok == self._state:
            return
        if ok:
            log.info("OTLP push succeeded" if self._state is None else "OTLP push recovered",
                     extra={"endpoint": redact_url(self.cfg.url)})
        else:
            log.warning("OTLP push failing (counted in unified_gpu_exporter_otlp_exports_total; "
                        "logged again when it recovers)", extra={"endpoint": redact_url(self.cfg.url), "reason": why})
        self._state = ok


def _same(a, b) -> bool:  # noqa: ANN001 - two pydantic models of one kind
    return a is b or a.model_dump() == b.model_dump()
