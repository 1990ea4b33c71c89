"""Shared test helpers: where the real captured fixtures live, and skips that name what is missing.

CI honesty: with ``CI`` set to a true value (``CI=true``, as .ci/run and every CI service set it)
a skipped test is a failure, whatever skipped it (``require_binary``, ``shared_fixtures``,
``pytest.importorskip`` at module level, ``pytest.skip`` in a test).  A run on a machine that lacks
a tool, a Python package or ``../shared`` cannot go green by skipping.  The few tests that skip by
design (the machine has a GPU, an optional binding is installed) carry
``@pytest.mark.optional_in_ci``.  Locally, tests skip and name the package that is missing.  Every
run ends with a line giving its skip count.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

# module-scoped fixtures of the upstream tests (a local exporter server, the shipped mappings)
pytest_plugins = ["tests.upstream_fixtures"]

REPO = Path(__file__).resolve().parent.parent
# Real captured data lives beside the checkout (../shared/fixtures); it is never copied in.
SHARED_FIXTURES = (REPO.parent / "shared" / "fixtures").resolve()


def ci_strict() -> bool:
    """True under CI=true (or 1/yes): a missing dependency fails instead of skipping."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes", "on"}


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


def _skip_reason(longrepr: object) -> str:
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def _ci_failure(reason: str) -> str:
    return (f"CI=true: this test would have been skipped, which CI treats as a failure "
            f"(install what is missing): {reason.removeprefix('Skipped: ')}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if (ci_strict() and report.skipped and not hasattr(report, "wasxfail")
            and item.get_closest_marker("optional_in_ci") is None):
        report.outcome = "failed"
        report.longrepr = _ci_failure(_skip_reason(report.longrepr))


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A module that skips itself at import (``pytest.importorskip``) fails under CI=true."""
    outcome = yield
    report = outcome.get_result()
    if ci_strict() and report.skipped:
        report.outcome = "failed"
        report.longrepr = _ci_failure(_skip_reason(report.longrepr))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "optional_in_ci: a skip of this test is by design (e.g. the machine has a GPU), "
                   "not a missing dependency; CI=true lets it skip")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    skipped = len(terminalreporter.stats.get("skipped", []))
    mode = "CI=true: skips of missing dependencies fail" if ci_strict() else "local run"
    terminalreporter.write_line(f"skip count: {skipped} ({mode})")
