"""Cloud identity labels from the instance metadata services of AWS, Azure and GCP.

Detected once at start and then rarely (default hourly), with short timeouts, off the scrape path.
All three providers answer on the link-local address 169.254.169.254; each is asked with its own
protocol and the answer is only accepted when it carries the provider's own marker:

* AWS (IMDSv2): ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds``, then
  ``GET /latest/dynamic/instance-identity/document`` with ``X-aws-ec2-metadata-token``.  In a
  container the instance's metadata hop limit must be >= 2 for the PUT answer to arrive.
* Azure: ``GET /metadata/instance/compute?api-version=...`` with ``Metadata: true``.
* GCP: ``GET /computeMetadata/v1/instance/{id,zone,machine-type}`` with
  ``Metadata-Flavor: Google``; the response must echo ``Metadata-Flavor: Google``.  Only these
  three items are read (never attributes, which may hold startup scripts or keys).

Which provider is asked is decided locally first (``cloud_dmi.claimed_cloud``): only the provider
the machine's DMI names, and no request at all where DMI names none.  An explicit ``providers:``
or ``endpoints:`` entry in the configuration overrides that (a container without the host's
``/sys/class/dmi``, a provider whose firmware strings changed).  The simulated node never asks a
real service: its labels come from its scenario's ``cloud:`` entry, and only an explicit
``endpoints:`` entry (a fake on loopback, as the tests use) is contacted there.

Labels: ``cloud`` (aws|azure|gcp), ``region``, ``zone``, ``instance_type``, ``instance_id``.
Options: ``enrich.cloud`` of the config (``options.CloudOptions``): ``enabled`` (off switch),
``providers``, ``timeout_seconds``, ``refresh_seconds``, ``labels`` (which of the five to emit)
and ``endpoints`` (base URL per provider; tests point these at local fake servers).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .cloud_dmi import Claim, claimed_cloud
from .options import CLOUD_LABELS, PROVIDERS, CloudOptions, parse

if TYPE_CHECKING:  # the client is imported by detect(): with cloud enrichment off it never loads
    import aiohttp

log = logging.getLogger(__name__)

LABELS = CLOUD_LABELS
IMDS = "http://169.254.169.254"
DEFAULT_ENDPOINTS = {"aws": IMDS, "azure": IMDS, "gcp": IMDS}
AZURE_API_VERSION = "2021-02-01"
AWS_TOKEN_TTL_SECONDS = "300"
# every answer read is bounded (identity documents are about 0.5-2 KB), and every label value is
# a short identifier: letters, digits and . _ : / -, up to 128 characters
MAX_BODY_BYTES = 64 * 1024
_VALUE_RE = re.compile(r"\A[A-Za-z0-9._:/-]{1,128}\Z")


@dataclass(frozen=True)
class CloudIdentity:
    cloud: str
    region: str = ""
    zone: str = ""
    instance_type: str = ""
    instance_id: str = ""

    def labels(self, names: tuple[str, ...] = LABELS) -> dict[str, str]:
        return {n: getattr(self, n) for n in names if getattr(self, n)}


class _NotThisCloud(Exception):
    pass


async def _body(r: aiohttp.ClientResponse, what: str, limit: int = MAX_BODY_BYTES) -> bytes:
    """At most ``limit`` bytes of an answer (a bigger one is not the metadata service's)."""
    if r.status != 200:  # redirects are not followed (allow_redirects=False): a 3xx lands here
        raise _NotThisCloud(f"{what} answered {r.status}")
    encoding = r.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):  # no metadata service compresses: nothing is inflated
        raise _NotThisCloud(f"{what}: a {encoding[:20]!r} answer (not the metadata service's)")
    body = bytearray()  # read() returns what has arrived: read on until the end or past the limit
    while len(body) <= limit:
        chunk = await r.content.read(limit + 1 - len(body))
        if not chunk:
            break
        body += chunk
    if len(body) > limit:
        raise _NotThisCloud(f"{what}: answer over {limit} bytes")
    return bytes(body)


def _json(body: bytes, what: str) -> dict:
    doc = json.loads(body)
    if not isinstance(doc, dict):
        raise _NotThisCloud(f"{what}: not a JSON object")
    return doc


async def _aws(session: aiohttp.ClientSession, base: str) -> CloudIdentity:
    async with session.put(f"{base}/latest/api/token", allow_redirects=False,
                           headers={"X-aws-ec2-metadata-token-ttl-seconds": AWS_TOKEN_TTL_SECONDS}) as r:
        token = (await _body(r, "token PUT", 4096)).decode("ascii", "replace").strip()
    if not token:
        raise _NotThisCloud("empty token")
    async with session.get(f"{base}/latest/dynamic/instance-identity/document", allow_redirects=False,
                           headers={"X-aws-ec2-metadata-token": token}) as r:
        doc = _json(await _body(r, "identity document"), "identity document")
    if not doc.get("instanceId"):
        raise _NotThisCloud("identity document without instanceId")
    return CloudIdentity("aws", region=_value(doc.get("region")), zone=_value(doc.get("availabilityZone")),
                         instance_type=_value(doc.get("instanceType")), instance_id=_value(doc["instanceId"]))


async def _azure(session: aiohttp.ClientSession, base: str) -> CloudIdentity:
    async with session.get(f"{base}/metadata/instance/compute", allow_redirects=False,
                           params={"api-version": AZURE_API_VERSION, "format": "json"},
                           headers={"Metadata": "true"}) as r:
        doc = _json(await _body(r, "compute"), "compute")
    if not doc.get("vmId"):
        raise _NotThisCloud("compute document without vmId")
    return CloudIdentity("azure", region=_value(doc.get("location")), zone=_value(doc.get("zone")),
                         instance_type=_value(doc.get("vmSize")), instance_id=_value(doc["vmId"]))


async def _gcp(session: aiohttp.ClientSession, base: str) -> CloudIdentity:
    async def item(name: str) -> str:
        async with session.get(f"{base}/computeMetadata/v1/instance/{name}", allow_redirects=False,
                               headers={"Metadata-Flavor": "Google"}) as r:
            if r.headers.get("Metadata-Flavor") != "Google":
                raise _NotThisCloud(f"{name} answered {r.status} without Metadata-Flavor: Google")
            return (await _body(r, name, 4096)).decode("utf-8", "replace").strip()

    instance_id, zone_path, type_path = await asyncio.gather(item("id"), item("zone"), item("machine-type"))
    zone = zone_path.rsplit("/", 1)[-1]  # projects/123/zones/us-central1-a
    region = zone.rsplit("-", 1)[0] if zone.count("-") >= 2 else ""
    return CloudIdentity("gcp", region=_value(region), zone=_value(zone),
                         instance_type=_value(type_path.rsplit("/", 1)[-1]), instance_id=_value(instance_id))


def _value(v: object) -> str:
    """A label value from the metadata service: a short identifier ("" when absent), or the
    whole answer is refused (a 1 MB instanceId would land on every series)."""
    if v is None or v == "":
        return ""
    text = str(v)
    if not _VALUE_RE.match(text):
        raise _NotThisCloud(f"a value that is not a short identifier ({len(text)} characters)")
    return text


_PROBES = {"aws": _aws, "azure": _azure, "gcp": _gcp}


async def detect(providers: tuple[str, ...] = PROVIDERS, endpoints: Mapping[str, str] | None = None,
                 timeout: float = 1.0) -> CloudIdentity | None:
    """Ask every provider at once; the first that answers in its own protocol wins."""
    import aiohttp

    urls = {**DEFAULT_ENDPOINTS, **(endpoints or {})}
    client_timeout = aiohttp.ClientTimeout(total=timeout, connect=timeout)
    # trust_env=False: never send the metadata request through an HTTP proxy
    # auto_decompress=False: a compressed answer is refused, never inflated (a gzip bomb)
    async with aiohttp.ClientSession(timeout=client_timeout, trust_env=False, auto_decompress=False) as session:
        tasks = {asyncio.create_task(_PROBES[p](session, urls[p].rstrip("/"))): p for p in providers}
        try:
            for fut in asyncio.as_completed(list(tasks)):
                try:
                    return await fut
                except (TimeoutError, _NotThisCloud, aiohttp.ClientError, ValueError) as e:
                    log.debug("cloud metadata: not %s (%s)", type(e).__name__, str(e)[:200])
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return None


class CloudEnricher:
    """Holds the detected cloud labels; ``labels()`` is a dict lookup for the render path.

    ``sysfs``: where the DMI identity is read (``--path.sysfs``).  ``simulated``: the node is the
    built-in simulator: ``static`` (its scenario's identity, or None) stands for the metadata
    service, which is never asked unless an ``endpoints:`` entry names a (fake) one."""

    def __init__(self, options: CloudOptions | Mapping[str, Any] | None = None, *, sysfs: Path = Path("/sys"),
                 simulated: bool = False, static: CloudIdentity | None = None) -> None:
        o = self.options = parse(CloudOptions, options)
        self.enabled = o.enabled
        self.providers = tuple(o.providers)
        self.label_names = tuple(o.labels)
        self.timeout = o.timeout_seconds
        self.refresh = o.refresh_seconds
        self.endpoints = dict(o.endpoints)
        self.sysfs = sysfs
        self.simulated = simulated
        self.static = static
        self.identity: CloudIdentity | None = None
        self._labels: dict[str, str] = {}
        self._targets: tuple[str, ...] | None = None  # decided at the first refresh
        self.reason = ""  # why these providers are (or no provider is) asked
        self._told = False

    def labels(self) -> dict[str, str]:
        return self._labels

    def apply_static(self) -> CloudIdentity | None:
        """The simulated node's labels from its scenario (what ``--once`` shows too): no request."""
        if not self.enabled or not self.simulated:
            return None
        if self.static is None:
            if not self._told:
                self._told = True
                log.info("no cloud metadata request: the simulated node's scenario has no cloud: entry; "
                         "no cloud labels")
            return None
        if self.identity is None:
            log.info("simulated node: cloud labels from the scenario: %s", self.static.labels())
        self.identity, self._labels = self.static, self.static.labels(self.label_names)
        return self.identity

    def targets(self) -> tuple[str, ...]:
        """The providers to ask, decided once: the explicit ones, else the one DMI names."""
        if self._targets is not None:
            return self._targets
        explicit_endpoints = tuple(p for p in self.providers if p in self.endpoints)
        if self.simulated:
            targets, why = explicit_endpoints, "the simulated node asks only an explicit endpoints: entry"
        elif "providers" in self.options.model_fields_set or self.endpoints:
            targets = self.providers if "providers" in self.options.model_fields_set else explicit_endpoints
            why = "enrich.cloud names them (providers:/endpoints:)"
        else:
            claim: Claim = claimed_cloud(self.sysfs)
            targets = tuple(p for p in claim.providers if p in self.providers)
            why = claim.evidence
        self._targets, self.reason = targets, why
        return targets

    async def refresh_once(self) -> CloudIdentity | None:
        if not self.enabled:
            return None
        targets = self._targets if self._targets is not None else await asyncio.to_thread(self.targets)
        if self.simulated and not targets:
            return self.apply_static()
        if not targets:
            if not self._told:
                self._told = True
                log.info("no cloud metadata request: %s; no cloud labels (an explicit "
                         "enrich.cloud.providers or endpoints entry asks a provider)", self.reason)
            return None
        found = await detect(targets, self.endpoints, self.timeout)
        if found is None:
            if self.identity is None:
                log.info("no cloud metadata service answered (%s: %s); no cloud labels",
                         ", ".join(targets), self.reason)
            # keep earlier labels on a transient failure: the instance did not move
            return self.identity
        if found != self.identity:
            log.info("cloud identity: %s", found.labels())
        self.identity = found
        self._labels = found.labels(self.label_names)
        return found

    async def run(self) -> None:
        """Background task: detect now, then every ``refresh_seconds`` (only while a provider is
        asked: with none, the first refresh logs why and the task ends)."""
        if not self.enabled:
            return
        while True:
            with contextlib.suppress(Exception):
                await self.refresh_once()
            if not self.targets():
                return
            await asyncio.sleep(self.refresh)
