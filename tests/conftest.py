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

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "netguard"))
import uge_netguard  # noqa: E402  (tests/netguard: the network guard, installed below)

sys.path.pop(0)

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


def _extra_modules() -> dict[str, tuple[str, ...]]:
    """The modules each optional extra (pyproject's optional-dependencies) brings that tests
    import: the OTLP ones from the exporter's own table (its config error names the same extra)."""
    from exporter.otlp.config import PROTOCOL_EXTRAS, PROTOCOL_MODULES

    return {extra: PROTOCOL_MODULES[protocol] for protocol, extra in PROTOCOL_EXTRAS.items()}


def require_extra(extra: str, *modules: str) -> None:
    """Skip naming the extra when a module it installs cannot be imported (a venv made without
    it); under CI=true the skip is a failure, as every other.  Also ``@pytest.mark.needs_extra``."""
    import importlib.util

    for module in modules or _extra_modules()[extra]:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a parent package missing, or marked unavailable
            found = False
        if not found:
            pytest.skip(f"the {extra} extra is not installed ({module} missing): "
                        f"pip install -e '.[{extra}]' (make install does)")


def pytest_runtest_setup(item):
    for mark in item.iter_markers("needs_extra"):
        require_extra(*mark.args)


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
        "markers", "needs_extra(name): the test needs the package's optional extra `name` (otlp, "
                   "otlp-grpc): skips naming it locally, fails under CI=true")
    config.addinivalue_line(
        "markers", "optional_in_ci: a skip of this test is by design (e.g. the machine has a GPU), "
                   "not a missing dependency; CI=true lets it skip")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    skipped = len(terminalreporter.stats.get("skipped", []))
    mode = "CI=true: skips of missing dependencies fail" if ci_strict() else "local run"
    terminalreporter.write_line(f"skip count: {skipped} ({mode})")
    refused, _ = netguard_refusals()
    terminalreporter.write_line(f"network guard: {len(refused)} attempt(s) to reach past loopback "
                                f"refused{' (the run fails)' if refused else ''}")
    for r in refused[:20]:
        terminalreporter.write_line(f"  {r['test']}: {r['event']} {r['address']}")


# ---- the network guard (tests/netguard/uge_netguard.py) ---------------------------------------
# Tests and every process they start talk only to loopback.  The hook is installed here, in the
# pytest process, and handed to every child through its environment (PYTHONPATH finds
# tests/netguard/sitecustomize.py): os.environ for children that inherit it, and every explicit
# ``env=`` given to subprocess.Popen (asyncio's subprocesses go through it too).
def _netguard_log() -> Path:
    d = Path(tempfile.mkdtemp(prefix="uge-netguard-"))
    d.chmod(0o755)  # a child running as another user (uid 65534) appends its refusals too
    log = d / "refusals.jsonl"
    log.touch()
    log.chmod(0o666)
    return log


NETGUARD_LOG = _netguard_log()
os.environ[uge_netguard.LOG_ENV] = str(NETGUARD_LOG)
os.environ.update(uge_netguard.child_env(dict(os.environ)))
uge_netguard.install()

_popen_init = subprocess.Popen.__init__


def _guarded_popen_init(self, args, *rest, **kwargs):
    # a Python started with -I or -E reads no PYTHON* variable (the import worker, whose exact
    # environment its tests check): nothing to hand it
    isolated = isinstance(args, (list, tuple)) and any(a in ("-I", "-E") for a in args[1:4])
    if kwargs.get("env") is not None and not isolated:
        kwargs["env"] = uge_netguard.child_env(dict(kwargs["env"]))
    _popen_init(self, args, *rest, **kwargs)


subprocess.Popen.__init__ = _guarded_popen_init


def netguard_refusals(offset: int = 0) -> tuple[list[dict], int]:
    """The refusals logged since ``offset`` (bytes), and the new offset."""
    with open(NETGUARD_LOG, "rb") as f:
        f.seek(offset)
        data = f.read()
    lines = [json.loads(line) for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    return lines, offset + len(data)


@pytest.fixture(autouse=True)
def _network_guard(request):
    """Fails the test during which it, or a process it started, reached past loopback."""
    _, start = netguard_refusals()
    yield
    refused, _ = netguard_refusals(start)
    if refused:
        pytest.fail("network guard: tests may only talk to loopback (127.0.0.0/8, ::1); refused:\n"
                    + "\n".join(f"  {r['test']}: {r['event']} {r['address']} (pid {r['pid']}: {r['argv']})"
                                 for r in refused), pytrace=False)


def pytest_sessionfinish(session, exitstatus):
    refused, _ = netguard_refusals()
    if refused and session.exitstatus == 0:  # one after the last test's teardown, say
        session.exitstatus = 1


@pytest.fixture
def readlinks(monkeypatch):
    """Counts readlink calls on fd tables (relative to a directory fd): the fdinfo scan tests
    measure its work in calls, never in time."""
    calls = []
    real = os.readlink

    def counting(path, *, dir_fd=None):
        if dir_fd is not None:
            calls.append(os.fsdecode(path))
        return real(path, dir_fd=dir_fd)

    monkeypatch.setattr(os, "readlink", counting)
    return calls
