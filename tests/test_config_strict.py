"""Strict configuration (issue 15): unknown keys, collectors, options and values are rejected by
--check-config, at start and on reload, with file:line: field, every error of the file at once;
one duration grammar for the config file, the web config and the flags."""

from __future__ import annotations

import re
import subprocess

import pytest

from exporter.config import load_config
from exporter.durations import parse_duration
from exporter.run.daemon import Daemon, Settings
from exporter.serve.webconfig import WebConfig
from exporter.sources.options import OPTIONS
from exporter.sources.registry import COLLECTORS
from exporter.yamlfile import ConfigError
from tests.conftest import REPO
from tests.e2e_util import EXPORTER_CMD

# the typos of the issue, one file: (text, expected line, field, words the message must hold)
TYPOS = """\
poll_interval: 1m30s
collectors:
  nvmll:
    enabled: true
  nvml:
    options:
      procesess: true
  fdinfo:
    options:
      topn: 5
  upstream:
    options:
      targets:
        - url: http://127.0.0.1:9400/metrics
          exporter: dcgm-exportr
"""
EXPECTED = [
    (3, "collectors.nvmll", "did you mean 'nvml'"),
    (7, "collectors.nvml.options.procesess", "did you mean 'processes'"),
    (10, "collectors.fdinfo.options.topn", "did you mean 'top_n'"),
    (15, "collectors.upstream.options.targets[0].exporter", "dcgm-exportr"),
]


def _check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*EXPORTER_CMD, "--check-config", *args], capture_output=True, text=True,
                          timeout=60, cwd=REPO)


def test_check_config_reports_every_typo_with_file_line_and_field_at_once(tmp_path):
    cfg = tmp_path / "typos.yml"
    cfg.write_text(TYPOS)
    result = _check("--config.file", str(cfg))
    assert result.returncode == 1, result.stdout + result.stderr
    for line, field, words in EXPECTED:
        assert re.search(rf"{re.escape(str(cfg))}:{line}: {re.escape(field)}: .*{re.escape(words)}",
                         result.stderr), (field, result.stderr)


@pytest.mark.parametrize("text, line, field", [
    ("collectors:\n  amdgpu:\n    options: {pcie_bw: maybe}\n", 3, "collectors.amdgpu.options.pcie_bw"),
    ("collectors:\n  nvml:\n    options:\n      processes_top_n: lots\n", 4,
     "collectors.nvml.options.processes_top_n"),
    ("collectors:\n  dcgm:\n    options:\n      update_interval_s: soon\n", 4,
     "collectors.dcgm.options.update_interval_s"),
    ("collectors:\n  intel:\n    options: {anything: 1}\n", 3, "collectors.intel.options.anything"),
    ("collectors:\n  profiles:\n    options:\n      dir: /tmp\n      trigger: {enabled: true}\n", 5,
     "collectors.profiles.options.trigger"),
    ("simulate:\n  scenaro: demo\n", 2, "simulate.scenaro"),
    ("indicators:\n  bogus: 1\n", 2, "indicators.bogus"),
])
def test_unknown_keys_and_bad_values_at_every_level(tmp_path, text, line, field):
    cfg = tmp_path / "c.yml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    assert f"{cfg}:{line}: {field}" in str(info.value), str(info.value)


def test_enrich_errors_name_the_line(tmp_path):
    cfg = tmp_path / "c.yml"
    cfg.write_text("poll_interval: 1s\nenrich:\n  cloud: {provider: 7, bogus: x}\n  clowd: {}\n")
    result = _check("--config.file", str(cfg))
    assert result.returncode == 1
    assert f"{cfg}:3: enrich.cloud" in result.stderr, result.stderr
    assert f"{cfg}:4: enrich.clowd" in result.stderr, result.stderr


def test_valid_options_reach_the_source_as_set(tmp_path):
    cfg = tmp_path / "c.yml"
    cfg.write_text("collectors:\n  nvml:\n    options: {processes: true, gpm_min_window_s: 250ms}\n"
                   "  upstream:\n    options:\n      targets:\n"
                   "        - {url: 'http://127.0.0.1:1/metrics', exporter: dcgm-exporter, timeout: 1.5s}\n")
    config = load_config(cfg)
    assert config.collector("nvml").options_dict() == {"processes": "series", "gpm_min_window_s": 0.25}
    target, = config.collector("upstream").options_dict()["targets"]
    assert target["timeout"] == 1.5 and target["exporter"] == "dcgm-exporter"
    assert config.collector("amdgpu").options_dict() == {}


def test_every_collector_has_an_options_model():
    assert set(COLLECTORS) == set(OPTIONS)


async def test_reload_with_a_typo_keeps_the_running_config(tmp_path):
    cfg = tmp_path / "c.yml"
    cfg.write_text("poll_interval: 2s\n")
    daemon = Daemon(Settings(config_path=cfg, simulate="demo"))
    await daemon.start()
    try:
        cfg.write_text("poll_interval: 1s\ncollectors:\n  nvml:\n    options: {procesess: true}\n")
        assert not await daemon.reload()
        assert daemon.config.poll_interval == 2.0
    finally:
        await daemon.stop()


# ------------------------------------------------------------------------------------ durations

@pytest.mark.parametrize("text, seconds", [
    ("1m30s", 90.0), ("1d", 86400.0), ("250ms", 0.25), ("1.5s", 1.5), ("2h", 7200.0), ("1w", 604800.0),
    ("1h30m15s500ms", 5415.5), ("0.5m", 30.0), ("2", 2.0), (3, 3.0), (0.25, 0.25),
])
def test_one_duration_grammar(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "1s1m", "1m1m", "-1s", "1 s", "1.s", "fast", "1e3s", True, None])
def test_duration_grammar_rejects(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_config_web_config_and_flags_share_the_grammar(tmp_path):
    cfg = tmp_path / "c.yml"
    cfg.write_text("poll_interval: 1m30s\nfast_interval: 1.5s\ncollectors:\n  nvml: {timeout: 1d}\n")
    config = load_config(cfg)
    assert (config.poll_interval, config.fast_interval, config.collector("nvml").timeout) == (90, 1.5, 86400)
    web = tmp_path / "web.yml"
    web.write_text("rate_limit: {interval: 1.5s, burst: 5}\n")
    assert WebConfig.load(web).rate_limit.interval_seconds == 1.5
    web.write_text("rate_limit: {interval: 1m30s, burst: 5}\n")
    assert WebConfig.load(web).rate_limit.interval_seconds == 90
    result = _check("--poll.interval", "1m30s", "--poll.fast-interval", "1.5s")
    assert result.returncode == 0, result.stderr


def test_every_broken_mapping_and_the_config_are_reported_in_one_run(tmp_path):
    import shutil

    mdir = tmp_path / "mappings"
    shutil.copytree(REPO / "mappings", mdir)
    broken = []
    for name in ("nvml.yaml", "amdgpu.yaml"):
        path = mdir / name
        text = path.read_text()
        needle = "metric: "
        i = text.index(needle)
        line = text[:i].count("\n") + 1
        path.write_text(text[:i] + "metric: gpu_no_such_metric_x\n" + text[text.index("\n", i) + 1:])
        broken.append(f"{name}:{line}: ")
    cfg = tmp_path / "c.yml"
    cfg.write_text("poll_intervall: 1s\n")
    result = _check("--path.mappings", str(mdir), "--config.file", str(cfg))
    assert result.returncode == 1
    for where in broken:
        assert where in result.stderr, result.stderr
    assert "c.yml:1: poll_intervall: unknown key, did you mean 'poll_interval'" in result.stderr
