"""Cloud metadata detection against local fake IMDS servers speaking each provider's protocol."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from exporter.enrich.cloud import (
    AZURE_API_VERSION,
    CloudEnricher,
    CloudIdentity,
    detect,
)

AWS_DOC = {"accountId": "123456789012", "architecture": "x86_64", "availabilityZone": "us-east-1b",
           "imageId": "ami-0abc", "instanceId": "i-0123456789abcdef0", "instanceType": "p4d.24xlarge",
           "privateIp": "10.0.0.12", "region": "us-east-1", "version": "2017-09-30"}
AZURE_DOC = {"location": "westeurope", "name": "gpu-vm", "vmId": "02aab8a4-74ef-476e-8182-f6d2ba4166a6",
             "vmSize": "Standard_ND96asr_v4", "zone": "2", "osType": "Linux"}


def aws_app(hits: list) -> web.Application:
    token = "AQAEAtoken=="

    async def put_token(req: web.Request) -> web.Response:
        hits.append(("PUT", req.path))
        ttl = req.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
        if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
            return web.Response(status=400)
        return web.Response(text=token)

    async def document(req: web.Request) -> web.Response:
        hits.append(("GET", req.path))
        if req.headers.get("X-aws-ec2-metadata-token") != token:
            return web.Response(status=401)  # IMDSv2 required: v1 GETs are refused
        return web.json_response(AWS_DOC, content_type="text/plain")  # IMDS serves text/plain

    app = web.Application()
    app.router.add_put("/latest/api/token", put_token)
    app.router.add_get("/latest/dynamic/instance-identity/document", document)
    return app


def azure_app(hits: list) -> web.Application:
    async def compute(req: web.Request) -> web.Response:
        hits.append(("GET", req.path, req.query.get("api-version")))
        if req.headers.get("Metadata") != "true":
            return web.json_response({"error": "Bad request. Required metadata header not specified"},
                                     status=400)
        if "api-version" not in req.query:
            return web.json_response({"error": "Bad request. api-version was not specified"}, status=400)
        return web.json_response(AZURE_DOC)

    app = web.Application()
    app.router.add_get("/metadata/instance/compute", compute)
    return app


def gcp_app(hits: list) -> web.Application:
    items = {"id": "4520031799277581759", "zone": "projects/123456/zones/europe-west4-a",
             "machine-type": "projects/123456/machineTypes/a2-highgpu-1g"}

    async def item(req: web.Request) -> web.Response:
        hits.append(("GET", req.path))
        if req.headers.get("Metadata-Flavor") != "Google":
            return web.Response(status=403, text="Missing Metadata-Flavor:Google header.")
        name = req.match_info["name"]
        if name not in items:
            return web.Response(status=404)
        return web.Response(text=items[name], headers={"Metadata-Flavor": "Google"})

    app = web.Application()
    app.router.add_get("/computeMetadata/v1/instance/{name}", item)
    return app


def slow_app(delay: float) -> web.Application:
    async def slow(_req: web.Request) -> web.Response:
        await asyncio.sleep(delay)
        return web.Response(text="late")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", slow)
    return app


def not_found_app() -> web.Application:
    return web.Application()  # every path 404 (also answers PUT with 405)


async def start(app: web.Application) -> TestServer:
    srv = TestServer(app, host="127.0.0.1")
    await srv.start_server()
    return srv


def url(srv: TestServer) -> str:
    return str(srv.make_url("")).rstrip("/")


@pytest.mark.asyncio
async def test_aws_imdsv2_token_flow():
    hits: list = []
    aws, other = await start(aws_app(hits)), await start(not_found_app())
    try:
        ident = await detect(endpoints={"aws": url(aws), "azure": url(other), "gcp": url(other)})
    finally:
        await aws.close()
        await other.close()
    assert ident == CloudIdentity("aws", "us-east-1", "us-east-1b", "p4d.24xlarge", "i-0123456789abcdef0")
    assert hits == [("PUT", "/latest/api/token"), ("GET", "/latest/dynamic/instance-identity/document")]


@pytest.mark.asyncio
async def test_azure_metadata_header_and_api_version():
    hits: list = []
    az, other = await start(azure_app(hits)), await start(not_found_app())
    try:
        ident = await detect(endpoints={"aws": url(other), "azure": url(az), "gcp": url(other)})
    finally:
        await az.close()
        await other.close()
    assert ident == CloudIdentity("azure", "westeurope", "2", "Standard_ND96asr_v4",
                                  "02aab8a4-74ef-476e-8182-f6d2ba4166a6")
    assert hits == [("GET", "/metadata/instance/compute", AZURE_API_VERSION)]


@pytest.mark.asyncio
async def test_gcp_metadata_flavor():
    hits: list = []
    gcp, other = await start(gcp_app(hits)), await start(not_found_app())
    try:
        ident = await detect(endpoints={"aws": url(other), "azure": url(other), "gcp": url(gcp)})
    finally:
        await gcp.close()
        await other.close()
    assert ident == CloudIdentity("gcp", "europe-west4", "europe-west4-a", "a2-highgpu-1g", "4520031799277581759")
    assert sorted(hits) == [("GET", "/computeMetadata/v1/instance/id"),
                            ("GET", "/computeMetadata/v1/instance/machine-type"),
                            ("GET", "/computeMetadata/v1/instance/zone")]


@pytest.mark.asyncio
async def test_one_server_for_all_providers_picks_the_right_one():
    """All clouds share 169.254.169.254: other providers' requests must not be misread."""
    hits: list = []
    app = gcp_app(hits)
    srv = await start(app)
    try:
        base = url(srv)
        ident = await detect(endpoints={"aws": base, "azure": base, "gcp": base})
    finally:
        await srv.close()
    assert ident == CloudIdentity("gcp", "europe-west4", "europe-west4-a", "a2-highgpu-1g", "4520031799277581759")
    # the AWS and Azure probes found no route of theirs (404/405); only GCP's reached a handler
    assert sorted(hits) == [("GET", "/computeMetadata/v1/instance/id"),
                            ("GET", "/computeMetadata/v1/instance/machine-type"),
                            ("GET", "/computeMetadata/v1/instance/zone")]


@pytest.mark.asyncio
async def test_gcp_answer_without_flavor_header_is_rejected():
    async def item(_req):  # some other HTTP server on that address
        return web.Response(text="projects/1/zones/x-y-z")

    app = web.Application()
    app.router.add_get("/computeMetadata/v1/instance/{name}", item)
    srv = await start(app)
    try:
        assert await detect(providers=("gcp",), endpoints={"gcp": url(srv)}) is None
    finally:
        await srv.close()


@pytest.mark.asyncio
async def test_timeout_is_short_and_gives_none():
    slow = await start(slow_app(5.0))
    try:
        t0 = time.monotonic()
        ident = await detect(endpoints={p: url(slow) for p in ("aws", "azure", "gcp")}, timeout=0.3)
        elapsed = time.monotonic() - t0
    finally:
        await slow.close()
    assert ident is None
    assert elapsed < 1.5  # the three probes run at once, each bounded by the timeout


@pytest.mark.asyncio
async def test_nothing_listening_gives_none():
    # a port that was just free: connection refused
    srv = await start(not_found_app())
    base = url(srv)
    await srv.close()
    assert await detect(endpoints={p: base for p in ("aws", "azure", "gcp")}, timeout=0.5) is None


@pytest.mark.asyncio
async def test_enricher_off_switch_makes_no_request():
    hits: list = []
    aws = await start(aws_app(hits))
    try:
        e = CloudEnricher({"enabled": False, "endpoints": {"aws": url(aws)}})
        assert await e.refresh_once() is None
        await e.run()  # returns at once when disabled
    finally:
        await aws.close()
    assert hits == []
    assert e.labels() == {}


@pytest.mark.asyncio
async def test_enricher_label_selection_and_keeps_labels_on_failure():
    hits: list = []
    aws = await start(aws_app(hits))
    base = url(aws)
    e = CloudEnricher({"providers": ["aws"], "labels": ["cloud", "region", "instance_type"],
                       "endpoints": {"aws": base}, "timeout_seconds": 0.5})
    try:
        await e.refresh_once()
    finally:
        await aws.close()
    assert hits == [("PUT", "/latest/api/token"), ("GET", "/latest/dynamic/instance-identity/document")]
    assert e.labels() == {"cloud": "aws", "region": "us-east-1", "instance_type": "p4d.24xlarge"}
    await e.refresh_once()  # server gone: transient failure keeps the labels
    assert e.labels() == {"cloud": "aws", "region": "us-east-1", "instance_type": "p4d.24xlarge"}


def test_enricher_rejects_unknown_options():
    with pytest.raises(ValueError, match="unknown option"):
        CloudEnricher({"enable": False})
    with pytest.raises(ValueError, match="unknown provider"):
        CloudEnricher({"providers": ["oracle"]})
    with pytest.raises(ValueError, match="unknown label"):
        CloudEnricher({"labels": ["node"]})


async def detect_aws(token, document) -> CloudIdentity | None:
    """``detect`` against an AWS metadata service of these two handlers (the other providers
    answer 404)."""
    app = web.Application()
    app.router.add_put("/latest/api/token", token)
    app.router.add_get("/latest/dynamic/instance-identity/document", document)
    aws, other = await start(app), await start(not_found_app())
    try:
        return await detect(endpoints={"aws": url(aws), "azure": url(other), "gcp": url(other)})
    finally:
        await aws.close()
        await other.close()
