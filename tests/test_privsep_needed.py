"""The counting process starts only where it is needed (issue 35): a serving daemon whose DRM
fdinfo count is on, holding the capabilities.  With the count off (the flag, ``enabled: false``,
``processes: off``) and in the one-shot modes, no process starts and the capabilities are dropped
all the same; an invalid configuration is reported before any process starts; a reload that
turns the count on says that the capabilities are gone.  As root, with the real daemon."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.config import load_config
from exporter.privsep.caps import capabilities
from exporter.privsep.counter import held
from exporter.run.collector_policy import counts_fdinfo
from exporter.run.settings import Settings
from tests.conftest import require_binary
from tests.e2e_util import REPO, ProcessSet, children, http_get, start_exporter, wait_until
from tests.fdinfo_trees import add_card

PDEV = "0000:08:00.0"
NONE = {"CapPrm": 0, "CapEff": 0, "CapAmb": 0, "CapInh": 0}
SEPARATED = ("unified_gpu_exporter_privilege_separated", (("source", "fdinfo"),))

root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the daemon separates only when it "
                          "holds the count capabilities")


@pytest.mark.parametrize(("flags", "conf", "counts"), [
    ({}, "{}", True),
    ({}, "collectors: {fdinfo: {options: {processes: series}}}", True),
    ({"fdinfo": False}, "{}", False),
    ({}, "collectors: {fdinfo: {enabled: false}}", False),
    ({}, "collectors: {fdinfo: {options: {processes: 'off'}}}", False),
    ({"fdinfo": True}, "collectors: {fdinfo: {enabled: false}}", True),  # the flag wins
])
def test_counts_fdinfo_follows_the_flag_the_config_and_processes(tmp_path, flags, conf, counts):
    path = tmp_path / "config.yml"
    path.write_text(conf + "\n")
    settings = Settings(config_path=path, collectors=flags)
    assert counts_fdinfo(settings, load_config(path)) is counts
    # the simulated node runs a hardware collector only when asked for explicitly
    assert counts_fdinfo(Settings(config_path=path, collectors=flags, simulate="demo"),
                         load_config(path)) is (counts and flags.get("fdinfo") is True)


def _node(tmp_path: Path) -> list[str]:
    """A procfs of the host's PID namespace (kthreadd) and one amdgpu card: the fdinfo source opens."""
    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    add_card(sysfs, 1, PDEV, driver="amdgpu")
    (proc / "2").mkdir(parents=True)
    (proc / "2" / "comm").write_text("kthreadd\n")
    return ["--path.procfs", str(proc), "--path.sysfs", str(sysfs), "--poll.interval", "200ms",
            "--state.dir", str(tmp_path / "state")]


def _samples(text: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


FDINFO_OFF = {"flag": (["--no-collector.fdinfo"], ""),
              "enabled_false": ([], "collectors:\n  fdinfo:\n    enabled: false\n"),
              "processes_off": ([], "collectors:\n  fdinfo:\n    options: {processes: 'off'}\n")}


@root
@pytest.mark.parametrize("how", sorted(FDINFO_OFF))
def test_with_the_fdinfo_count_off_no_counting_process_starts_and_nothing_is_held(tmp_path, how):
    flags, conf = FDINFO_OFF[how]
    config = tmp_path / "config.yml"
    config.write_text(conf or "{}\n")
    with ProcessSet() as procs:
        exporter = start_exporter(procs, tmp_path, [*_node(tmp_path), "--config.file", str(config), *flags],
                                  timeout=30)
        samples = _samples(http_get(exporter.url + "/metrics").text)
        server = exporter.proc.pid
        assert children(server) == []  # no counting process
        assert held(str(server)) == NONE  # dropped all the same (fail closed)
        assert capabilities(str(server))["CapBnd"] == 0  # root: the bounding set too (CAP_SETPCAP)
        assert SEPARATED not in samples  # no fdinfo source scans
    assert "no DRM fdinfo client count is configured: no counting process starts" in exporter.log_path.read_text()


@root
def test_with_the_fdinfo_count_on_the_counting_process_starts(tmp_path):
    with ProcessSet() as procs:
        exporter = start_exporter(procs, tmp_path, _node(tmp_path), timeout=30)
        wait_until(lambda: _samples(http_get(exporter.url + "/metrics").text).get(SEPARATED) == 1.0, 20)
        server = exporter.proc.pid
        assert len(children(server)) == 1  # the counting process's supervisor
        assert held(str(server)) == NONE
        assert capabilities(str(server))["CapBnd"] == 0


# the CLI in a process of its own with an audit hook that reports every process it starts
SPAWNS = """
import sys
def hook(event, args):
    if event == "subprocess.Popen":
        sys.stderr.write(f"SPAWN {args[1]!r}\\n")
sys.addaudithook(hook)
from exporter.cli import main
from exporter.config import load_config
from exporter.privsep.caps import capabilities
from exporter.privsep.counter import held
from exporter.run.collector_policy import counts_fdinfo
from exporter.run.settings import Settings
rc = main(sys.argv[1:])
sys.stderr.write(f"HELD {held()}\\n")
sys.exit(rc)
"""


def _cli(*args: str, wrap: tuple[str, ...] = (), path: tuple[Path, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*wrap, sys.executable, "-c", SPAWNS, *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env={**os.environ, "PYTHONPATH": os.pathsep.join(map(str, (*path, REPO)))})


@root
@pytest.mark.parametrize("mode", ["--once", "--list-devices"])
def test_one_shot_modes_start_no_counting_process_and_drop_the_capabilities(tmp_path, mode):
    r = _cli(mode, *_node(tmp_path))
    assert "SPAWN" not in r.stderr, r.stderr
    assert f"HELD {NONE}" in r.stderr, r.stderr
    if mode == "--once":
        assert r.returncode == 0, r.stderr
        # the count ran in this process, unprivileged
        assert _samples(r.stdout).get(SEPARATED) == 0.0


@root
@pytest.mark.parametrize("mode", ["--once", "--list-devices"])
def test_other_capabilities_are_dropped_though_there_is_nothing_to_separate(tmp_path, mode):
    """``docker run --user 0`` with Docker's default set: CHOWN, DAC_OVERRIDE, SETUID, ... but
    neither count capability.  Nothing is separated, and nothing is kept either (a permitted
    capability could be raised again)."""
    setpriv = require_binary("setpriv", "util-linux")
    # uid 0 execs with its bounding set as permitted: everything but the two count capabilities
    r = _cli(mode, *_node(tmp_path), wrap=(setpriv, "--bounding-set=-sys_ptrace,-dac_read_search"))
    assert "SPAWN" not in r.stderr, r.stderr
    assert f"HELD {NONE}" in r.stderr, r.stderr
    if mode == "--once":
        assert r.returncode == 0, r.stderr


@root
@pytest.mark.parametrize("levelzero", [True, False])
def test_cap_perfmon_stays_where_the_level_zero_collector_runs(tmp_path, levelzero):
    """Level Zero's engine groups need CAP_PERFMON (docs/privileges.md): a root process whose
    levelzero collector is on, with the binding installed, keeps that one (permitted and
    effective again after the start's lower_effective) and drops every other; with the collector
    off it keeps nothing."""
    binding = tmp_path / "binding"
    binding.mkdir()
    (binding / "pyzes.py").write_text("raise OSError('libze_loader.so.1: not on this node')\n")  # found, then off
    flags = () if levelzero else ("--no-collector.levelzero",)
    r = _cli("--list-devices", *_node(tmp_path), *flags, path=(binding,))
    perfmon = 1 << 38 if levelzero else 0
    assert f"HELD {NONE | {'CapPrm': perfmon, 'CapEff': perfmon}}" in r.stderr, r.stderr


@root
def test_an_invalid_configuration_is_reported_before_any_process_starts(tmp_path):
    config = tmp_path / "config.yml"
    config.write_text("poll_interval: 1s\ncollectors:\n  fdinfo:\n    options: {processes: many}\n")
    r = _cli(*_node(tmp_path), "--config.file", str(config))
    assert r.returncode == 1
    assert f"{config}:4: collectors.fdinfo.options.processes" in r.stderr, r.stderr
    assert "SPAWN" not in r.stderr, r.stderr


@root
def test_a_reload_that_turns_the_count_on_warns_that_the_capabilities_are_gone(tmp_path):
    """The serving process dropped its capabilities at start (the count was off); a reload
    cannot give them back: the count runs in the serving process, unprivileged, and says so."""
    config = tmp_path / "config.yml"
    config.write_text("collectors:\n  fdinfo:\n    enabled: false\n")
    with ProcessSet() as procs:
        exporter = start_exporter(procs, tmp_path, [*_node(tmp_path), "--config.file", str(config)], timeout=30)
        config.write_text("collectors:\n  fdinfo:\n    enabled: true\n")
        os.kill(exporter.proc.pid, signal.SIGHUP)
        wait_until(lambda: _samples(http_get(exporter.url + "/metrics").text).get(SEPARATED) == 0.0, 20)
        assert children(exporter.proc.pid) == []
        assert held(str(exporter.proc.pid)) == NONE
        log = exporter.log_path.read_text()
        assert log.count("the reloaded configuration turns the DRM fdinfo client count on, but it was off "
                         "at start") == 1, log
