"""CI=true turns a skip for a missing tool, package or ../shared into a failure (tests/conftest.py);
locally the same test skips and names what is missing; every run prints its skip count."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO

CASES = '''
import pytest
from tests.conftest import require_binary

def test_missing_binary():
    require_binary("no-such-binary-for-ci-test", "no-such-package")

def test_missing_fixtures(shared_fixtures):
    pass

@pytest.mark.optional_in_ci
def test_by_design():
    pytest.skip("this machine has GPUs")

def test_passes():
    pass

@pytest.mark.needs_extra("no-such-extra-for-ci-test", "no_such_module_for_ci_test")
def test_missing_extra():
    pass
'''
IMPORTORSKIP = '''
import pytest
pytest.importorskip("no_such_module_for_ci_test", reason="pip install no-such-module")

def test_never():
    pass
'''


def _pytest(tmp_path, ci: str, name: str, text: str) -> subprocess.CompletedProcess:
    (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(CI=ci, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", "-p",
                           "tests.conftest", "-o", "addopts=", "--rootdir", str(tmp_path),
                           "-c", os.devnull, str(tmp_path / name)],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)


def _without_shared(text: str) -> str:
    """The fixture's skip as it reads when ../shared is missing (this checkout may have it)."""
    return text.replace("def test_missing_fixtures(shared_fixtures):\n    pass",
                        "def test_missing_fixtures():\n"
                        "    import pytest\n"
                        "    pytest.skip('real fixtures not found at /nonexistent/shared/fixtures')")


def test_under_ci_every_skip_for_something_missing_fails(tmp_path):
    r = _pytest(tmp_path, "true", "test_cases.py", _without_shared(CASES))
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "FAILED" in out and "test_missing_binary" in out and "test_missing_fixtures" in out
    assert "test_missing_extra" in out and "the no-such-extra-for-ci-test extra is not installed" in out
    assert "no-such-package" in out  # the failure still names what to install
    assert "2 failed, 1 passed, 1 skipped, 1 error" in out, out  # the extra: refused at setup
    assert "skip count: 1 (CI=true" in out


def test_locally_the_same_tests_skip_naming_what_is_missing(tmp_path):
    r = _pytest(tmp_path, "", "test_cases.py", _without_shared(CASES))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "1 passed, 4 skipped" in out, out
    assert "skip count: 4 (local run)" in out
    assert "pip install -e '.[no-such-extra-for-ci-test]'" in out, out


def test_under_ci_a_module_level_importorskip_fails(tmp_path):
    r = _pytest(tmp_path, "true", "test_importorskip.py", IMPORTORSKIP)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "pip install no-such-module" in out and "CI=true" in out
    local = _pytest(tmp_path, "false", "test_importorskip.py", IMPORTORSKIP)
    assert local.returncode in (0, 5) and "1 skipped" in local.stdout, local.stdout  # 5: nothing ran


def test_ci_entry_point_is_strict():
    text = (REPO / ".ci" / "run").read_text()
    assert "CI=true" in text and "set -euo pipefail" in text
    assert "|| fail" in text and "warning: apt" not in text
    for package in ("prometheus", "prometheus-alertmanager", "prometheus-node-exporter",
                    "victoria-metrics", "systemd", "openssl", "kubectl", "python3-venv"):
        assert package in text, package
