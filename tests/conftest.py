"""Shared test helpers: where the real captured fixtures live, and skips that name what is missing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Real captured data lives beside the checkout (../shared/fixtures); it is never copied in.
SHARED_FIXTURES = (REPO.parent / "shared" / "fixtures").resolve()


@pytest.fixture(scope="session")
def shared_fixtures() -> Path:
    if not SHARED_FIXTURES.is_dir():
        pytest.skip(f"real fixtures not found at {SHARED_FIXTURES} (../shared/fixtures beside the checkout)")
    return SHARED_FIXTURES


def require_binary(name: str, package: str) -> str:
    """Return the path of a system binary, or skip naming the Debian package that provides it."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed (Debian package: {package})")
    return path
