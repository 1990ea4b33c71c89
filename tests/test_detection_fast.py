"""The detection scenarios in-process on a fake clock: every case of
mappings/scenarios/detection.yaml, both evidence variants, in seconds instead of the daemon run's
~100 s (tests/test_detection_scenarios.py, kept in ``make test``).  The loop to run while changing
the engine: ``.venv/bin/python -m pytest -q tests/test_detection_fast.py``.
"""

from __future__ import annotations

import pytest

from tests.detection_run import CONFIG, VARIANTS, failures, run_seconds, run_variant

# device -> why its expectation cannot be judged in-process (none today: every case of the file
# passes here as it does through the daemon)
NOT_IN_PROCESS: dict[str, str] = {}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    seconds = run_seconds()
    out = {}
    for variant, extra in VARIANTS.items():
        d = tmp_path_factory.mktemp(variant.replace(" ", "-"))
        out[variant] = run_variant(CONFIG + extra, d, seconds)
    return out


def test_every_case_reads_its_expected_state_over_time_in_process(runs):
    problems = failures("detection", runs, NOT_IN_PROCESS)
    assert not problems, "\n".join(problems)


def test_the_fast_run_sees_every_expected_device(runs):
    """A run that saw nothing would pass no expectation silently: each window had scrapes, and a
    device the scenario expects shows a state in most of them."""
    from exporter.simulate import load_scenario

    scenario = load_scenario("detection")
    for variant, run in runs.items():
        assert len(run.timeline) >= 200, variant
        for dev in scenario.expect:
            shown = sum(1 for _, st in run.timeline if dev in st)
            assert shown > len(run.timeline) // 2, (variant, dev)
