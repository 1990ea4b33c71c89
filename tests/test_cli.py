"""The command line as a user runs it: a subprocess of `python -m exporter` / the console script.

Covers --version, --help, --check-config (valid and each kind of invalid input, with the
file:line: field error), --once | promtool check metrics, the HTTP server (/metrics in text and
OpenMetrics, gzip, landing page, /healthz, /readyz, custom telemetry path, no timestamps),
SIGHUP reloads, SIGTERM, bad flags and --list-devices.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families as text_families

from tests.conftest import REPO, require_binary
from tests.e2e_util import EXPORTER_CMD, ProcessSet, http_get, start_exporter, wait_until

MAPPINGS = REPO / "mappings"
CONSOLE_SCRIPT = Path(sys.executable).parent / "unified-gpu-exporter"
VENDORS = {"nvidia", "amd", "intel"}
TEXT_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"


def run_cli(*args: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*EXPORTER_CMD, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, **kw)


# ------------------------------------------------------------------------ --version, --help

def test_version_from_module_and_console_script():
    from exporter import __version__

    result = run_cli("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"unified-gpu-exporter {__version__}"
    short = run_cli("-v")  # issue 38: the short form users try first
    assert short.returncode == 0 and short.stdout == result.stdout, short.stderr
    if not CONSOLE_SCRIPT.exists():
        pytest.skip(f"console script not installed at {CONSOLE_SCRIPT}")
    script = subprocess.run([str(CONSOLE_SCRIPT), "--version"], capture_output=True, text=True,
                            timeout=30)
    assert script.returncode == 0 and script.stdout == result.stdout


def test_help_lists_every_collector_and_the_main_flags():
    from exporter.sources.registry import COLLECTORS

    result = run_cli("--help")
    assert result.returncode == 0, result.stderr
    for name in COLLECTORS:
        if name != "simulator":
            assert f"--collector.{name}" in result.stdout, name
    for flag in ("--web.listen-address", "--web.telemetry-path", "--web.config.file",
                 "--config.file", "--path.sysfs", "--path.procfs", "--poll.interval",
                 "--state.dir", "--log.level", "--log.format", "--check-config", "--once",
                 "--simulate", "--list-devices"):
        assert flag in result.stdout, flag



def test_help_lists_the_no_collector_form_and_every_flag_has_help():
    from exporter.run.argparsing import build_parser
    from exporter.sources.registry import COLLECTORS

    result = run_cli("--help")
    for name in COLLECTORS:
        if name != "simulator":
            assert f"--no-collector.{name}" in result.stdout, name
    undocumented = [a.option_strings for a in build_parser()._actions
                    if a.option_strings and not a.help]
    assert undocumented == []


def test_every_flag_and_argument_of_import_has_help():
    from exporter.importers.cli import build_parser as import_parser

    result = run_cli("import", "--help")
    assert result.returncode == 0
    actions = import_parser()._actions
    for flag in ("--format", "--trace-id", "--top-kernels", "--path.mappings", "--max-file-bytes"):
        assert flag in result.stdout, flag
    undocumented = [a.option_strings or a.metavar for a in actions if not a.help]
    assert undocumented == []


@pytest.mark.parametrize(("args", "hint"), [
    (["--colector.nvml"], "did you mean --collector.nvml?"),
    (["--poll.interval", "soon"], "see unified-gpu-exporter --help"),
    (["--log.level", "loud"], "see unified-gpu-exporter --help"),
    # without --simulate a real node would ignore them (`make run ARGS="--simulate.phase X"`)
    (["--simulate.phase", "thermal_throttle", "--check-config"],
     "add --simulate, e.g. --simulate --simulate.phase thermal_throttle"),
    (["--simulate.host", "node-b", "--check-config"], "add --simulate, e.g. --simulate --simulate.host node-b"),
    (["import", "--formt", "json", "x.csv"], "did you mean --format?"),
    (["import", "--top-kernels", "many", "x.csv"], "see unified-gpu-exporter import --help"),
    (["import"], "see unified-gpu-exporter import --help"),
])
def test_a_flag_error_is_one_line_and_a_hint_not_the_usage(args, hint):
    result = run_cli(*args)
    prog = "unified-gpu-exporter import" if args[0] == "import" else "unified-gpu-exporter"
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith(f"{prog}: error: ") and hint in lines[1], result.stderr
    assert "usage:" not in result.stderr

# -------------------------------------------------------------------------- --check-config

def test_check_config_accepts_a_valid_config(tmp_path):
    cfg = tmp_path / "config.yml"
    cfg.write_text("poll_interval: 500ms\nlabels: {node: gpu-node-1}\n"
                   "collectors:\n  simulator:\n    interval: 1s\n")
    result = run_cli("--check-config", "--config.file", str(cfg))
    assert result.returncode == 0, result.stderr
    result = run_cli("--check-config", "--simulate", "--config.file", str(cfg))
    assert result.returncode == 0, result.stderr


def test_check_config_reads_the_file_as_the_daemon_does_without_capabilities(tmp_path):
    """The daemon reads its configuration with its effective set emptied; --check-config does
    too, so a file only CAP_DAC_READ_SEARCH (or CAP_DAC_OVERRIDE) could read fails both."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a file only a capability can read")
    cfg = tmp_path / "config.yml"
    cfg.write_text("poll_interval: 500ms\n")
    os.chown(cfg, 4242, 4242)
    cfg.chmod(0o600)
    result = run_cli("--check-config", "--config.file", str(cfg))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "configuration and mappings are valid" not in result.stdout
    assert str(cfg) in result.stderr and "ermission denied" in result.stderr, result.stderr


def _error_line(result: subprocess.CompletedProcess, path: Path) -> str:
    """The error line naming the file (stderr), for asserting file:line: field."""
    assert result.returncode != 0, f"exit 0 for an invalid input:\n{result.stdout}{result.stderr}"
    lines = [ln for ln in result.stderr.splitlines() if path.name in ln]
    assert lines, f"no error naming {path.name}:\n{result.stderr}"
    return lines[0]


@pytest.mark.parametrize("text, line, field", [
    pytest.param("labels: {node: x\n", 2, "invalid YAML", id="yaml-syntax"),
    pytest.param("poll_interval: 1s\nbogus_key: 1\n", 2, "bogus_key", id="unknown-key"),
    pytest.param("poll_interval: 1s\ncollectors:\n  simulator:\n    interval: fast\n", 4,
                 "collectors.simulator.interval", id="bad-duration"),
    pytest.param("poll_interval: -2s\n", 1, "poll_interval", id="bad-duration-sign"),
])
def test_check_config_rejects_an_invalid_config_naming_file_line_and_field(tmp_path, text, line, field):
    cfg = tmp_path / "config.yml"
    cfg.write_text(text)
    err = _error_line(run_cli("--check-config", "--config.file", str(cfg)), cfg)
    assert re.search(rf"{re.escape(cfg.name)}:{line}: ", err), err
    assert field in err, err


def test_check_config_rejects_a_broken_mapping_file(tmp_path):
    mdir = tmp_path / "mappings"
    shutil.copytree(MAPPINGS, mdir)
    nvml = mdir / "nvml.yaml"
    text = nvml.read_text()
    needle = "metric: gpu_compute_utilization_percent\n"
    line = text[:text.index(needle)].count("\n") + 1
    nvml.write_text(text.replace(needle, "metric: gpu_no_such_metric_percent\n", 1))
    # the unbroken copy is valid: the failure below is the broken field, not the copy
    ok = run_cli("--check-config", "--path.mappings", str(MAPPINGS))
    assert ok.returncode == 0, ok.stderr
    err = _error_line(run_cli("--check-config", "--path.mappings", str(mdir)), nvml)
    assert f"nvml.yaml:{line}: " in err, err
    assert ".metric" in err and "gpu_no_such_metric_percent" in err, err


def test_check_config_rejects_an_invalid_scenario_file(tmp_path):
    scenario = tmp_path / "broken-scenario.yaml"
    text = (MAPPINGS / "scenarios" / "demo.yaml").read_text()
    line = text[:text.index("count: 2")].count("\n") + 1
    scenario.write_text(text.replace("count: 2", "count: many", 1))
    # the same file is rejected when the simulator starts (--once) ...
    once = run_cli("--simulate", str(scenario), "--once")
    assert once.returncode != 0 and f"{scenario.name}:{line}: devices[0].count" in once.stderr
    # ... and --check-config must find it without starting anything
    err = _error_line(run_cli("--check-config", "--simulate", str(scenario)), scenario)
    assert f"{scenario.name}:{line}: " in err and "devices[0].count" in err, err


def test_check_config_rejects_an_unknown_scenario_phase():
    result = run_cli("--check-config", "--simulate", "--simulate.phase", "no_such_phase")
    assert result.returncode != 0, result.stdout + result.stderr
    assert "no_such_phase" in result.stderr


# ---------------------------------------------------------------------- --once | promtool

def test_once_output_passes_promtool_check_metrics():
    promtool = require_binary("promtool", "prometheus")
    once = run_cli("--simulate", "--once")
    assert once.returncode == 0, once.stderr
    check = subprocess.run([promtool, "check", "metrics"], input=once.stdout, capture_output=True,
                           text=True, timeout=30)
    # promtool's complaints verbatim (stdout/stderr), nothing filtered out
    assert (check.returncode, check.stdout, check.stderr) == (0, "", ""), check.stdout + check.stderr


# -------------------------------------------------------------------------------- server

@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One simulated exporter for the read-only server tests."""
    tmp = tmp_path_factory.mktemp("served")
    with ProcessSet() as procs:
        server = start_exporter(procs, tmp, ["--simulate", "--poll.interval", "250ms"])
        # /readyz is 200 after the first poll; series computed from counter rates (e.g. the Intel
        # engine utilisation) appear from the second poll on
        wait_until(lambda: _vendors(server, "gpu_compute_utilization_percent") == VENDORS, 5,
                   what="utilization of all three vendors")
        yield server


def _vendors(server, name: str) -> set[str]:
    families = _families_text(http_get(server.url + "/metrics").text)
    return {s.labels["vendor"] for s in families.get(name, [])}


def _families_text(body: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_families(body)}


def test_metrics_text_format(served):
    resp = http_get(served.url + "/metrics")
    assert resp.status == 200
    assert resp.headers["content-type"] == TEXT_0_0_4
    families = _families_text(resp.text)
    assert {s.labels["vendor"] for s in families["gpu_compute_utilization_percent"]} == VENDORS
    assert "unified_gpu_exporter_build_info" in families


def test_no_sample_has_a_timestamp(served):
    text = http_get(served.url + "/metrics").text
    for family in text_families(text):
        for sample in family.samples:
            assert sample.timestamp is None, sample
    om = http_get(served.url + "/metrics", {"Accept": "application/openmetrics-text"}).text
    for family in om_families(om):
        for sample in family.samples:
            assert sample.timestamp is None, sample


def test_metrics_openmetrics_format(served):
    resp = http_get(served.url + "/metrics",
                    {"Accept": "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"})
    assert resp.status == 200
    assert resp.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert resp.text.endswith("# EOF\n")
    names = {f.name for f in om_families(resp.text)}
    assert {"gpu_info", "gpu_compute_utilization_percent", "gpu_energy_joules"} <= names


def test_metrics_gzip(served):
    plain = http_get(served.url + "/metrics")
    resp = http_get(served.url + "/metrics", {"Accept-Encoding": "gzip"})
    assert resp.status == 200
    assert resp.headers.get("content-encoding") == "gzip"
    assert resp.headers["content-type"] == plain.headers["content-type"]
    body = gzip.decompress(resp.body).decode()
    assert set(_families_text(body)) == set(_families_text(plain.text))
    assert len(resp.body) < len(body)


def test_landing_page_lists_devices_of_all_vendors_and_links_metrics(served):
    resp = http_get(served.url + "/")
    assert resp.status == 200 and resp.headers["content-type"].startswith("text/html")
    page = resp.text
    assert 'href="/metrics"' in page
    cells = set(re.findall(r"<td>([^<]*)</td>", page))
    assert VENDORS <= cells, cells
    uuids = {s.labels["uuid"] for s in _families_text(http_get(served.url + "/metrics").text)["gpu_info"]}
    assert len(uuids) == 5 and uuids <= cells
    for model in ("NVIDIA H100 80GB HBM3", "AMD Instinct MI300X", "Intel Data Center GPU Max 1550"):
        assert model in cells


def test_healthz_and_readyz(served):
    health = http_get(served.url + "/healthz")
    ready = http_get(served.url + "/readyz")
    assert (health.status, ready.status) == (200, 200)


def test_custom_telemetry_path(tmp_path):
    with ProcessSet() as procs:
        server = start_exporter(procs, tmp_path, ["--simulate", "--web.telemetry-path", "/custom"])
        resp = http_get(server.url + "/custom")
        assert resp.status == 200, resp
        assert "gpu_info{" in resp.text, resp.text
        assert http_get(server.url + "/metrics").status == 404
        landing = http_get(server.url + "/").text
        assert 'href="/custom"' in landing, landing


# ------------------------------------------------------------------------- signals

def _node_labels(server) -> set[str]:
    text = http_get(server.url + "/metrics").text
    return {s.labels.get("node") for s in _families_text(text)["gpu_info"]}


def _reload_ok(server) -> float:
    text = http_get(server.url + "/metrics").text
    return _families_text(text)["unified_gpu_exporter_config_last_reload_successful"][0].value


def test_sighup_applies_a_valid_config_and_keeps_the_old_one_when_invalid(tmp_path):
    cfg = tmp_path / "config.yml"
    cfg.write_text("labels: {node: x}\n")
    mdir = tmp_path / "mappings"
    shutil.copytree(MAPPINGS, mdir)
    intel = mdir / "intel.yaml"
    intel_text = intel.read_text()
    with ProcessSet() as procs:
        server = start_exporter(procs, tmp_path, ["--simulate", "--poll.interval", "200ms",
                                                  "--config.file", str(cfg), "--path.mappings", str(mdir)])
        assert _node_labels(server) == {"x"}
        assert _reload_ok(server) == 1

        cfg.write_text("labels: {node: y}\n")
        server.signal(signal.SIGHUP)
        wait_until(lambda: _node_labels(server) == {"y"}, 10, what="node label y after SIGHUP")
        assert _reload_ok(server) == 1

        # a broken mapping file: the running mappings stay, the reload is reported failed
        intel.write_text(intel_text.replace("vendor: intel", "vendor: [intel", 1))
        server.signal(signal.SIGHUP)
        wait_until(lambda: _reload_ok(server) == 0, 10, what="reload_successful 0 (mapping)")
        assert "intel.yaml" in server.log()
        assert len(_families_text(http_get(server.url + "/metrics").text)["gpu_info"]) == 5

        intel.write_text(intel_text)
        server.signal(signal.SIGHUP)
        wait_until(lambda: _reload_ok(server) == 1, 10, what="reload_successful 1 again")
        assert _node_labels(server) == {"y"}

        cfg.write_text("labels: {node: z}\nno_such_key: true\n")
        server.signal(signal.SIGHUP)
        wait_until(lambda: _reload_ok(server) == 0, 10, what="reload_successful 0")
        assert _node_labels(server) == {"y"}
        assert "no_such_key" in server.log()
        assert http_get(server.url + "/readyz").status == 200


def test_sigterm_exits_zero_within_two_seconds(tmp_path):
    with ProcessSet() as procs:
        server = start_exporter(procs, tmp_path, ["--simulate"])
        t0 = time.monotonic()
        server.signal(signal.SIGTERM)
        rc = server.proc.wait(5)
        elapsed = time.monotonic() - t0
        assert rc == 0, server.log()
        assert elapsed < 2.0, f"SIGTERM took {elapsed:.2f}s"


# ------------------------------------------------------------------------- bad flags

@pytest.mark.parametrize("args, message", [
    pytest.param(["--web.listen-address", "not-an-address"], "invalid listen address", id="listen"),
    pytest.param(["--web.listen-address", "127.0.0.1:99999"], "invalid listen address", id="port"),
    pytest.param(["--poll.interval", "1x"], "invalid duration", id="duration"),
    pytest.param(["--poll.interval", "0s"], "--poll.interval", id="zero-duration"),
    pytest.param(["--log.level", "chatty"], "--log.level", id="log-level"),
])
def test_invalid_flags_exit_nonzero_with_a_message(args, message):
    result = run_cli("--simulate", *args, timeout=30)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def test_listen_address_in_use_is_reported(served):
    result = run_cli("--simulate", "--web.listen-address", served.address, timeout=30)
    assert result.returncode != 0
    assert "error:" in result.stderr and str(served.port) in result.stderr, result.stderr


# ------------------------------------------------------------------------- --list-devices

def test_list_devices_simulated():
    result = run_cli("--list-devices", "--simulate")
    assert result.returncode == 0, result.stderr
    rows = [ln.split("\t") for ln in result.stdout.splitlines() if ln.strip()]
    assert len(rows) == 5
    assert sorted(r[1] for r in rows) == ["amd", "amd", "intel", "nvidia", "nvidia"]
    assert len({r[4] for r in rows}) == 5  # distinct uuids


@pytest.mark.optional_in_ci
def test_list_devices_without_gpus_exits_1(tmp_path):
    if any(Path("/sys/class/drm").glob("card*")) or shutil.which("nvidia-smi"):
        pytest.skip("this machine has GPUs")
    empty = tmp_path / "sys"
    (empty / "class" / "drm").mkdir(parents=True)
    result = run_cli("--list-devices", "--path.sysfs", str(empty))
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout == ""


def test_a_taken_port_says_how_to_pick_another():
    """Issue 38: a raw Errno 98 gave no hint; the error names the flag (and make run's ARGS)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = run_cli("--simulate", f"--web.listen-address=127.0.0.1:{port}", timeout=120)
    assert result.returncode == 1
    assert "address already in use" in result.stderr and "--web.listen-address=:<port>" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_start_without_any_gpu_says_why_it_is_not_ready(tmp_path):
    """Issue 38: a real start on a node without GPUs logged only info lines; now one warning says
    which sources are not up, and why.  /readyz means "can serve" (issue 39): it answers 200, and
    the exporter serves its own series (source_up 0 where a source was asked for)."""
    from tests.e2e_util import ProcessSet, exporter, http_get, wait_until

    (tmp_path / "sys").mkdir()
    cfg = tmp_path / "config.yml"
    cfg.write_text("enrich:\n  cloud: {enabled: false}\n  kubernetes: {enabled: false}\n")  # loopback only
    with ProcessSet() as procs:
        # an empty sysfs, and no library source that could find a GPU of this machine
        server = procs.add(exporter(tmp_path, [f"--path.sysfs={tmp_path / 'sys'}", f"--config.file={cfg}",
                                               "--no-collector.nvml", "--no-collector.dcgm", "--no-collector.amdsmi",
                                               "--no-collector.levelzero"]))
        server.start()
        wait_until(lambda: "no source is up" in server.log() and "msg=listening" in server.log(), 60)
        assert http_get(server.url + "/readyz").status == 200
    line = next(ln for ln in server.log().splitlines() if "no source is up" in ln)
    assert "level=warning" in line and "amdgpu: absent" in line and "--simulate" in line
