"""Issue 26, findings 14 and 16 (and issue 27 item 2): names that would make the exposition
unparsable are refused with file:line (a trailing newline slips through a ``$`` regex; static
labels that collide with series, Prometheus or attribution labels), and every period of the
enrichers is bounded below.  The real ``--check-config``, and a real scrape parsed by promtool."""

from __future__ import annotations

import subprocess

import pytest

from exporter.map.schema import LABEL_RE, NAME_RE, Schema
from tests.conftest import REPO, require_binary
from tests.e2e_util import EXPORTER_CMD
from tests.reliability_util import ExporterProcess


def _check(tmp_path, text: str) -> subprocess.CompletedProcess:
    """What ``--check-config`` does (exporter.run.loading.prepare), in this process: rc and stderr."""
    from exporter.run.daemon import Settings
    from exporter.run.loading import prepare
    from exporter.yamlfile import ConfigError

    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    try:
        prepare(Settings(config_path=cfg))
    except ConfigError as exc:
        return subprocess.CompletedProcess([], 1, "", str(exc))
    return subprocess.CompletedProcess([], 0, "", "")


def test_check_config_refuses_a_reserved_static_label_with_its_line(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("labels:\n  node: a\n  __name__: x\n  instance: foo\n")
    r = subprocess.run([*EXPORTER_CMD, "--config.file", str(cfg), "--check-config"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "c.yaml:3: labels.__name__" in r.stderr and "c.yaml:4: labels.instance" in r.stderr, r.stderr


@pytest.mark.parametrize("name", ["gpu\n", "node\n"])
def test_names_with_a_trailing_newline_do_not_match(name):
    assert not LABEL_RE.match(name) and not NAME_RE.match(name)


@pytest.mark.parametrize("key,line", [
    ('"node\\n"', 3),            # a trailing newline (passes a "$" regex)
    ("__name__", 3),             # issue 27 item 2
    ("__meta_x", 3),
    ("instance", 3),             # issue 27 item 2: a Prometheus target label
    ("job", 3),
    ("le", 3),
    ("vendor", 3),               # identity labels
    ("gpu", 3),
    ("uuid", 3),
    ("gpu_instance", 3),
    ("source", 3),               # labels of canonical series (gpu_info)
    ("pid", 3),
])
def test_static_label_that_breaks_the_exposition_is_refused_with_its_line(tmp_path, key, line):
    r = _check(tmp_path, f"poll_interval: 1s\nlabels:\n  {key}: x\n")
    assert r.returncode != 0, r.stdout
    assert f"c.yaml:{line}:" in r.stderr, r.stderr
    assert "labels" in r.stderr


def test_attribution_labels_refused_only_with_pod_attribution(tmp_path):
    r = _check(tmp_path, "labels:\n  namespace: team-a\n  label_app: x\n"
                         "enrich:\n  kubernetes:\n    enabled: true\n    api: 'off'\n")
    assert r.returncode != 0
    assert "c.yaml:2:" in r.stderr and "c.yaml:3:" in r.stderr, r.stderr
    assert "pod attribution" in r.stderr
    ok = _check(tmp_path, "labels:\n  namespace: team-a\n  workload: w\n  label_app: x\n  cluster: c1\n"
                          "enrich:\n  kubernetes:\n    enabled: false\n")
    assert ok.returncode == 0, ok.stderr


def test_label_allowlist_name_with_a_newline_is_refused(tmp_path):
    r = _check(tmp_path, 'exposition:\n  label_allowlist: ["vendor", "gpu\\n"]\n')
    assert r.returncode != 0 and "c.yaml:" in r.stderr, r.stderr


def test_canonical_metric_name_with_a_newline_is_refused():
    with pytest.raises(ValueError, match="invalid metric name"):
        Schema.model_validate({"version": 1, "device_labels": ["vendor", "gpu", "uuid"], "metrics": {
            "gpu_temp_celsius\n": {"type": "gauge", "unit": "celsius", "help": "t", "labels": []}}})


@pytest.mark.parametrize("key", ["pid_refresh_seconds", "refresh_seconds"])
def test_enricher_periods_are_bounded_below(tmp_path, key):
    r = _check(tmp_path, f"enrich:\n  kubernetes:\n    enabled: true\n    api: 'off'\n    {key}: 0.000001\n")
    assert r.returncode != 0
    assert f"c.yaml:5: enrich.kubernetes.{key}" in r.stderr, r.stderr


def test_accepted_static_labels_keep_the_exposition_valid(tmp_path):
    promtool = require_binary("promtool", "prometheus")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("labels:\n  node: n1\n  cluster: 'c\"1\\n'\n")
    exp = ExporterProcess(["--simulate", "--config.file", str(cfg)], tmp_path)
    try:
        body = exp.scrape()
    finally:
        exp.stop()
    assert 'node="n1"' in body
    r = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True,
                       timeout=60)
    assert "error" not in (r.stdout + r.stderr).lower() or r.returncode == 0, r.stdout + r.stderr


def test_enrichment_label_never_duplicates_a_series_own_label():
    """A cloud ``region`` label (added to every series like a static one) beside a process's
    memory ``region``: the series keeps its own, and the exposition stays parsable."""
    from prometheus_client.parser import text_string_to_metric_families

    from exporter.map.schema import default_mappings_dir, load_schema
    from exporter.map.store import Store
    from exporter.render.exposition import Renderer

    schema = load_schema(default_mappings_dir() / "canonical.yaml")
    r = Renderer(schema)
    series = {("amd", "0", "u"): {("gpu_process_memory_bytes", (("pid", "7"), ("process", "p"),
                                                                   ("region", "vram"))): 5.0}}
    static = (("cluster", "c1"), ("region", "eu-west-1"))
    text = r.render(Store(), [series], static).text.decode()
    line = next(x for x in text.splitlines() if x.startswith("gpu_process_memory_bytes{"))
    assert line.count("region=") == 1 and 'region="vram"' in line and 'cluster="c1"' in line
    fams = [f for f in text_string_to_metric_families(text) if f.name == "gpu_process_memory_bytes"]
    assert [s.labels["region"] for s in fams[0].samples] == ["vram"]


@pytest.mark.parametrize("collector,option", [("amdgpu", "pcie_bw_interval"), ("nvml", "gpm_min_window_s")])
def test_collector_periods_are_bounded_below(tmp_path, collector, option):
    r = _check(tmp_path, f"collectors:\n  {collector}:\n    options:\n      {option}: 0.000001\n")
    assert r.returncode != 0
    assert "c.yaml:4" in r.stderr and option in r.stderr and "at least 10ms" in r.stderr, r.stderr
