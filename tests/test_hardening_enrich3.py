"""Issue 37: every peer's answer is bounded while it is read.  The cloud metadata client reads
at most MAX_BODY_BYTES within one total timeout (test_hardening_enrich2); a compressed answer,
which no metadata service sends, is refused instead of inflated (aiohttp inflated it)."""

from __future__ import annotations

import gzip
import json

import pytest
from aiohttp import web

from tests.test_cloud_enrich import AWS_DOC, detect_aws


@pytest.mark.asyncio
async def test_a_compressed_metadata_answer_is_refused_not_inflated():
    async def token(_req: web.Request) -> web.Response:
        return web.Response(text="tok")

    async def document(_req: web.Request) -> web.Response:
        body = gzip.compress(json.dumps(AWS_DOC).encode())
        return web.Response(body=body, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
    ident = await detect_aws(token, document)
    # before the fix: inflated by aiohttp and taken; the size limit counted only what came out of
    # the inflater (a bomb's output, 64 KiB at a time, the whole answer kept before the check)
    assert ident is None
