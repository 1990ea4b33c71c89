"""deploy/device-check/nvml_load_check.py cannot run without a GPU; what can be checked here is
checked: its phase expectations are what the decision table gives the loads an H200 measured
(docs/detection.md), and a dry run through the real exporter on the faithful NVML fake serves
every family the check watches, with no configuration."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.indicators.config import RootCauseConfig, StateConfig
from exporter.indicators.rootcause import throttle_explains
from exporter.indicators.state import STATES, decide
from exporter.sources.evidence import host_pid_namespace

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "deploy" / "device-check" / "nvml_load_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("nvml_load_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


check = _load()


@pytest.mark.parametrize("phase", check.PHASES, ids=lambda p: p.name)
def test_each_phase_expects_what_the_decision_table_gives_the_h200_measurements(phase):
    """The H200 medians of each load (util.gpu, GPM occupancy, SM active, DRAM bandwidth, busy
    clients, sw_power_cap with the SM clock 3 % below its maximum) through the real decision:
    the state and reason the script expects.  Fails when the script, the docs' numbers or the
    code drift apart (a lone copy loop read memory_bound, matmul + copy read throttled before
    issue 24)."""
    util, occ, _sm, bw, clients, capped = phase.h200
    throttled = throttle_explains({"sw_power_cap": capped}, 0.97, RootCauseConfig())
    verdict = decide(bw, util, "occupancy", occ, throttled, clients, False, False, False, StateConfig())
    assert (verdict.state, verdict.reason) == (phase.expect, phase.reason)
    assert {phase.expect, *phase.also} <= set(STATES)


def test_a_power_cap_that_cut_the_clock_is_expected_throttled_and_the_code_agrees():
    power = next(p for p in check.PHASES if p.name == "power_capped")
    util, occ, _sm, bw, clients, _ = power.h200
    cut = {"clock_ratio": [0.7, 0.72]}
    assert check.expected(power, cut) == ("throttled",)
    assert check.expected(power, {"clock_ratio": [0.97]}) == ("healthy",)
    explains = throttle_explains({"sw_power_cap": True}, 0.71, RootCauseConfig())
    assert decide(bw, util, "occupancy", occ, explains, clients, False, False, False, StateConfig()).state \
        == "throttled"


def test_the_phases_cover_the_issue_and_fit_the_time_limit():
    names = [p.name for p in check.PHASES]
    assert names == ["idle", "one_copy", "two_copies", "power_capped", "matmul_copy", "idle_after"]
    assert sum(p.seconds for p in check.PHASES) + 90 < check.DEADLINE  # + worker start
    for p in check.PHASES:
        assert set(p.running) <= set(check.WORKERS)
    for name in ("gpu_contention_evidence_info", "gpu_active_clients", "gpu_throttle_active",
                 "gpu_clock_mhz", "gpu_clock_max_mhz", "gpu_memory_state_info"):
        assert name in check.WATCH and name in check.REQUIRED


def test_the_exporter_runs_with_no_configuration():
    cmd = check.exporter_command(9632, Path("/nonexistent"), dry_run=False)
    assert cmd[1:3] == ["-m", "exporter"]
    assert not [a for a in cmd if a.startswith(("--config", "--collector", "--no-collector", "--poll"))]


def test_dry_run_through_the_real_exporter_on_the_nvml_fake(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path), PYTHONPATH=str(REPO))
    res = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--phase-seconds", "1.5"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=50)
    assert res.returncode == 0, res.stdout + res.stderr
    table = (tmp_path / "state_table.txt").read_text().splitlines()
    assert [ln.split()[0] for ln in table[1:]] == [p.name for p in check.PHASES]
    data = json.loads((tmp_path / "load_samples.json").read_text())
    served = {k.split("{", 1)[0] for s in data["samples"] for k in s["values"]}
    assert set(check.REQUIRED) <= served
    # the default install's count-only evidence: clients counted by NVML, nothing per process
    assert any('evidence="clients"' in k and 'source="nvml"' in k for s in data["samples"] for k in s["values"])
    assert "watched families never served: none" in (tmp_path / "load_summary.txt").read_text()


def test_mps_check_dry_run_records_the_three_nvml_views_and_the_exporters_states(tmp_path):
    """deploy/device-check/nvml_mps_check.py (issue 36) on the NVML fake's MPS GPU: it records
    which pids the compute list, the MPS list and the utilization samples name (what nvml.h
    leaves open and the fake assumes: server, clients, server) and the exporter's states."""
    script = REPO / "deploy" / "device-check" / "nvml_mps_check.py"
    env = dict(os.environ, OUT=str(tmp_path), PYTHONPATH=str(REPO))
    res = subprocess.run([sys.executable, str(script), "--dry-run", "--phase-seconds", "7"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    summary = (tmp_path / "mps_summary.txt").read_text()
    for view, named in (("compute", "server and clients"), ("mps", "clients"), ("utilization_samples", "server")):
        assert f"two_clients  {view:<20} {named} " in summary, summary
    raw = json.loads((tmp_path / "mps_raw.json").read_text())
    assert {r["phase"] for r in raw} == {"one_client", "two_clients"}
    assert all(len(r["cpu_ticks"]) == 2 for r in raw)
    rows = {line.split()[0]: line for line in (tmp_path / "mps_state_table.txt").read_text().splitlines()[1:]}
    if host_pid_namespace(Path("/proc")):  # the spin workers' CPU time tells which client runs
        assert " memory_bound " in rows["one_client"] and " contended " not in rows["one_client"], rows
        assert " contended " in rows["two_clients"] and "clients:nvml" in rows["two_clients"], rows
    else:  # NVML's (the fake's) pids are not this /proc's: activity unknown
        assert "mps_client_activity_unknown" in rows["two_clients"], rows


def test_nvml_probe_runs_the_source_as_the_exporter_builds_it(tmp_path):
    """deploy/device-check/nvml_probe.py on the NVML fake: it broke once when NvmlSource's
    constructor changed (found only on the H200 run); every step writes its file, none fails."""
    code = ("import runpy, sys\nfrom tests.fakes import nvml_exporter\nnvml_exporter.install('h100')\n"
            f"sys.argv = ['nvml_probe.py']\nrunpy.run_path({str(REPO / 'deploy' / 'device-check' / 'nvml_probe.py')!r}, "
            "run_name='__main__')\n")
    env = dict(os.environ, OUT=str(tmp_path), PYTHONPATH=str(REPO))
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=60)
    summary = (tmp_path / "summary.txt").read_text()
    assert res.returncode == 0 and "failed" not in summary, res.stdout + res.stderr + summary
    polls = json.loads((tmp_path / "raw_readings.json").read_text())["polls"]
    assert len(polls) == 3 and polls[-1]["readings"]
    for name in ("gpm_support.json", "memory_identity.json"):
        assert (tmp_path / name).is_file(), name
