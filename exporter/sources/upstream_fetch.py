"""Fetching and reading one upstream exporter: targets, HTTP with bounds, parsing, identity.

Every limit here fails the target, never the process: bodies are capped on the wire and after
decompression, and series, label values and label lengths are bounded per target.
"""

from __future__ import annotations

import base64
import http.client
import io
import logging
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.openmetrics.parser import text_fd_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_fd_to_metric_families as parse_prometheus_text

from .. import safefile
from ..http_deadline import BodyTooLarge, Deadline, DeadlinePassed, inflate, opener, read_body
from .base import PollFailed
from .upstream_identity import (
    EXPORTERS,
    ExporterSpec,
    SeriesIdentity,
    dimension_labels,
    field_name,
)

log = logging.getLogger("exporter.sources.upstream")

MAX_BODY_BYTES = 32 * 1024 * 1024       # on the wire, and again after decompression
# per target and poll (max_series, max_label_values: the target's options); past a limit the
# target fails this poll (kind limit_exceeded), as a Prometheus scrape past sample_limit fails
MAX_LABEL_VALUE_LENGTH = 1_024
MAX_SECRET_FILE_BYTES = 1 << 20  # a password file, a certificate chain, a key, a CA bundle
MAX_ERROR_TEXT = 300                       # characters of an error (a malformed line) kept/logged
_ACCEPT = "text/plain;version=0.0.4;q=1.0, */*;q=0.1"


class FetchError(Exception):
    """A target could not be read; ``kind`` is the error kind counted in ``PollResult.errors``."""

    def __init__(self, kind: str, message: str) -> None:
        # a malformed 30 MiB line must not end up whole in every log line and error
        if len(message) > MAX_ERROR_TEXT:
            message = message[:MAX_ERROR_TEXT] + f"... ({len(message)} characters)"
        super().__init__(message)
        self.kind = kind


class UpstreamDown(PollFailed):
    """Every configured target failed this poll: the source is down (``up`` = 0).

    ``errors`` holds the error kinds of the failed targets (as ``PollResult.errors`` would).
    """

    def __init__(self, errors: Counter[str], message: str) -> None:
        super().__init__(errors, message)
        self.kind = errors.most_common(1)[0][0] if errors else "read_error"


class UpstreamTimeout(UpstreamDown, TimeoutError):
    """Every target failed and all of them by timing out."""


@dataclass(frozen=True, slots=True)
class Target:
    """A resolved target (``parse_targets``); every value comes from ``UpstreamTarget``."""

    name: str
    url: str
    spec: ExporterSpec
    timeout: float
    metric_prefix: str
    ssl_context: ssl.SSLContext | None
    authorization: str
    max_series: int
    max_label_values: int
    schema: str  # the operator's pin (a schema of the mapping file), "" = recognised per scrape


# --- configuration -------------------------------------------------------------------------


def parse_targets(options: Any) -> list[Target]:
    """Targets of the typed ``upstream`` options (``options.UpstreamOptions``: the only defaults;
    read by attribute, as options.py imports this module to run it at load).

    What the model only types is resolved here: the TLS context (files read), the basic-auth
    header (password file read); raises ``ValueError``/``OSError`` naming the bad entry."""
    targets: list[Target] = []
    for i, (entry, name) in enumerate(zip(options.targets, options.target_names(), strict=True)):
        where = f"upstream.targets[{i}]"
        targets.append(Target(
            name=name,
            url=entry.url,
            spec=EXPORTERS[entry.exporter],
            timeout=entry.timeout,
            metric_prefix=entry.metric_prefix,
            ssl_context=_ssl_context(entry.tls) if entry.url.startswith("https://") else None,
            authorization=_authorization(entry.basic_auth, where),
            max_series=entry.max_series,
            max_label_values=entry.max_label_values,
            schema=entry.schema_pin or "",
        ))
    return targets


def _ssl_context(tls: Any) -> ssl.SSLContext:  # options.UpstreamTls | None
    """The files read as regular files only, bounded, never blocking (``safefile.read_named``)."""
    def read(path: Any) -> bytes:
        return safefile.read_named(path, MAX_SECRET_FILE_BYTES)
    ca = read(tls.ca_file).decode("ascii", "replace") if tls and tls.ca_file else None
    ctx = ssl.create_default_context(cadata=ca)
    if tls is None:
        return ctx
    if tls.cert_file:
        safefile.load_pem_chain(ctx, read(tls.cert_file), read(tls.key_file) if tls.key_file else None)
    if tls.insecure_skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _authorization(auth: Any, where: str) -> str:  # options.UpstreamBasicAuth | None
    if auth is None:
        return ""
    if not auth.username:
        raise ValueError(f"{where}.basic_auth needs a username")
    password = auth.password
    if auth.password_file:  # a regular file only, bounded, never blocking (a FIFO in its place)
        password = safefile.read_named(auth.password_file, MAX_SECRET_FILE_BYTES).decode().rstrip("\n")
    token = base64.b64encode(f"{auth.username}:{password}".encode()).decode("ascii")
    return f"Basic {token}"


# --- reading one target ----------------------------------------------------------------------


def _refuse_redirect(code: int, newurl: str) -> FetchError:
    return FetchError("read_error", f"HTTP {code} redirect to {newurl!r} refused (redirects "
                                    "are not followed; configure the final URL)")


def _opener(target: Target, deadline: Deadline) -> urllib.request.OpenerDirector:
    # no proxy from the environment (a node-local exporter), no redirects, http(s) only
    return opener(deadline, target.ssl_context, _refuse_redirect)


def fetch(target: Target) -> tuple[str, str]:
    """GET the target; returns (body text, content type).  Raises ``FetchError``.

    The timeout bounds the whole request (connect, status line, headers and body), not only
    each socket operation, so an exporter that trickles any part of its answer cannot hold the
    poll.
    """
    deadline = Deadline(target.timeout)
    try:
        return _fetch(target, deadline)
    except FetchError as e:
        if deadline.expired and e.kind != "timeout":
            raise FetchError("timeout", f"no complete answer within {target.timeout} s") from e
        raise
    finally:
        deadline.cancel()


def _fetch(target: Target, deadline: Deadline) -> tuple[str, str]:
    request = urllib.request.Request(target.url, headers={"Accept": _ACCEPT})
    if target.authorization:
        request.add_header("Authorization", target.authorization)
    try:
        with _opener(target, deadline).open(request, timeout=target.timeout) as resp:
            # counted while reading, the deadline checked between reads (read1: what arrived)
            body = read_body(resp.read1, deadline, MAX_BODY_BYTES, "upstream")
            if resp.headers.get("Content-Encoding", "").lower() == "gzip":
                body = inflate(body, "gzip", MAX_BODY_BYTES, "upstream")
            content_type = resp.headers.get("Content-Type", "")
    except FetchError:
        raise
    except DeadlinePassed as e:
        raise FetchError("timeout", f"no complete answer within {target.timeout} s") from e
    except BodyTooLarge as e:
        raise FetchError("read_error", str(e).removeprefix("upstream: ")) from e
    except urllib.error.HTTPError as e:
        raise FetchError("read_error", f"HTTP {e.code} {e.reason}") from e
    except urllib.error.URLError as e:
        kind = "timeout" if isinstance(e.reason, TimeoutError) else "read_error"
        raise FetchError(kind, str(e.reason)) from e
    except TimeoutError as e:
        raise FetchError("timeout", f"no complete answer within {target.timeout} s") from e
    except (OSError, EOFError, ValueError, zlib.error, http.client.HTTPException) as e:  # reset, bad gzip
        raise FetchError("read_error", f"{type(e).__name__}: {e}") from e
    try:
        return body.decode("utf-8"), content_type
    except UnicodeDecodeError as e:
        raise FetchError("parse_error", f"body is not UTF-8: {e}") from e


MAX_HELP_TEXT = 512  # characters of a HELP text kept (the unit evidence of upstream_schema)


def parse_exposition(text: str, content_type: str = "",
                     helps: dict[str, str] | None = None,
                     max_series: int | None = None) -> list[tuple[str, dict[str, str], float]]:
    """All samples of a Prometheus text (or OpenMetrics) body as (name, labels, value); with
    ``helps``, the HELP text of each sample name is stored there.

    Raises ``FetchError("parse_error")`` when any line is malformed: a half-understood body is
    not trusted at all.  ``X_created`` samples of counters ``X_total`` are dropped.

    ``max_series`` is enforced while parsing, as Prometheus enforces ``sample_limit``: the
    parser is fed line by line and the line past the limit raises ``FetchError
    ("limit_exceeded")`` before it is parsed, so a body of millions of one-sample lines never
    becomes millions of parsed samples (issue 37: 30 MiB of ``a 1`` took 2 GiB).
    """
    openmetrics = "openmetrics" in content_type.lower()
    parser = parse_openmetrics if openmetrics else parse_prometheus_text
    # prometheus_client's text parser appends "_total" to every sample of a family declared
    # `# TYPE x counter` (dcgm-exporter does this: DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION); undo
    # it so that raw fields are the names on the wire.
    munged = set() if openmetrics else {
        m[1] for m in _COUNTER_TYPE_RE.finditer(text) if not m[1].endswith("_total")
    }
    samples = []
    try:
        for family in parser(_counted_lines(text, max_series)):
            doc = family.documentation
            for s in family.samples:
                name = _wire_name(s.name, family, munged)
                samples.append((name, dict(s.labels), s.value))
                if helps is not None and doc and name not in helps:
                    helps[name] = doc[:MAX_HELP_TEXT]
    except FetchError:
        raise
    except Exception as e:  # the parsers raise ValueError, but also TypeError/IndexError on junk
        raise FetchError("parse_error", f"malformed exposition: {e}") from e
    names = {name for name, _, _ in samples}
    return [
        s for s in samples
        if not (s[0].endswith("_created") and f"{s[0][: -len('_created')]}_total" in names)
    ]


def _counted_lines(text: str, max_series: int | None) -> Iterable[str]:
    """The body's lines for the parser, counting sample lines (one sample each: neither blank nor
    a comment) and failing on the first past ``max_series``."""
    if max_series is None:
        yield from io.StringIO(text)
        return
    n = 0
    for line in io.StringIO(text):
        stripped = line.lstrip()
        if stripped and not stripped.startswith("#"):
            n += 1
            if n > max_series:
                raise FetchError("limit_exceeded", f"more than {max_series} series, above max_series {max_series} "
                                                   f"(counted while parsing)")
        yield line


_COUNTER_TYPE_RE = re.compile(r"^[ \t]*#[ \t]*TYPE[ \t]+(\S+)[ \t]+counter[ \t]*$", re.MULTILINE)


def _wire_name(name: str, family: Any, munged: set[str]) -> str:
    if family.type == "counter" and family.name in munged and name.endswith("_total"):
        return name[: -len("_total")]
    return name


@dataclass(slots=True)
class TargetReadings:
    """What one target yielded in one poll, devices keyed by their identity ``ref``."""

    identities: dict[str, SeriesIdentity]
    readings: list[tuple[str, str, float, tuple[tuple[str, str], ...]]]  # (ref, field, value, labels)
    # schema marker label names seen on the series of each host (identity ``host``)
    label_names: dict[str, set[str]] = field(default_factory=dict)


def read_series(
    target: Target, samples: Iterable[tuple[str, dict[str, str], float]],
    markers: frozenset[str] = frozenset(),
) -> TargetReadings:
    """Group samples by GPU, derive each GPU's identity and the raw readings (and, per host, which
    of the schema ``markers`` label its series).

    Duplicate series (same GPU, field and labels; seen with XPU Manager, issue #112) keep the
    first value.
    """
    spec = target.spec
    samples = list(samples)
    if len(samples) > target.max_series:
        raise FetchError("limit_exceeded", f"{len(samples)} series, above max_series "
                                           f"{target.max_series}")
    values: dict[str, set[str]] = {}
    for _, labels, _ in samples:
        for k, v in labels.items():
            if len(v) > MAX_LABEL_VALUE_LENGTH:
                raise FetchError("limit_exceeded", f"label {k} has a value of {len(v)} characters, "
                                                   f"above {MAX_LABEL_VALUE_LENGTH}")
            seen_values = values.setdefault(k, set())
            seen_values.add(v)
            if len(seen_values) > target.max_label_values:
                raise FetchError("limit_exceeded", f"label {k} has more than "
                                                   f"{target.max_label_values} distinct values "
                                                   f"(max_label_values)")
    identities: dict[str, SeriesIdentity] = {}
    label_names: dict[str, set[str]] = {}
    readings: list[tuple[str, str, float, tuple[tuple[str, str], ...]]] = []
    seen: set[tuple[str, str, tuple[tuple[str, str], ...]]] = set()
    prefix = target.metric_prefix
    for name, labels, value in samples:
        ident = spec.identify(labels)
        if ident is None:
            continue
        known = identities.get(ident.ref)
        identities[ident.ref] = ident if known is None else known.merged(ident)
        host_labels = label_names.get(ident.host)
        if host_labels is None:
            host_labels = label_names[ident.host] = set()
        if markers:
            host_labels.update(markers.intersection(labels))
        name = name.removeprefix(prefix)
        fld = field_name(name, labels, spec.selector_labels)
        dims = dimension_labels(labels, spec)
        key = (ident.ref, fld, dims)
        if key in seen:
            continue
        seen.add(key)
        readings.append((ident.ref, fld, value, dims))
    return TargetReadings(identities, readings, label_names)


def scrape_target(target: Target) -> TargetReadings:
    text, content_type = fetch(target)
    return read_series(target, parse_exposition(text, content_type, max_series=target.max_series))
