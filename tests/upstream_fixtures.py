"""Module-scoped fixtures of the upstream tests: a local exporter HTTP server and the shipped
mapping set (a plugin of tests/conftest.py; a module may define its own of the same name)."""

from __future__ import annotations

import pytest

from exporter.testing import load_mappings
from tests.test_upstream_http import ExporterServer


@pytest.fixture(scope="module")
def server():
    srv = ExporterServer()
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def mappings():
    return load_mappings()
