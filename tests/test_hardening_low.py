"""Issue 20, Low and YAML items: each reproduction from the adversarial pass as a test."""

from __future__ import annotations

import shutil
import time

import pytest
from aiohttp.test_utils import make_mocked_request

from exporter.map.mapper import Mapper
from exporter.map.mapping import MappingSet, load_mapping
from exporter.map.schema import default_mappings_dir, load_schema
from exporter.run.daemon import Daemon, Settings
from exporter.serve.server import _wants_openmetrics
from exporter.sources.base import Device, PollResult
from exporter.testing import flat
from exporter.yamlfile import ConfigError

LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{b}: &{b} [{', '.join(['*' + a] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True))


@pytest.fixture(scope="module")
def schema():
    return load_schema(default_mappings_dir() / "canonical.yaml")


@pytest.mark.parametrize(("text", "match"), [
    (LAUGHS, "aliases expand to more than"),
    ("a: &a [*a]\n", "recursive YAML alias"),
    ("poll_interval: 1\npoll_interval: 2\n", "duplicate key"),
    # libyaml refuses the escape while parsing; the pure-Python parser lets it through to our check
    ('labels: {cluster: "\\ud800"}\n', "not valid UTF-8|c.yaml:1: invalid YAML: found invalid Unicode"),
    ("poll_interval: .inf\n", "out of range"),
    ("poll_interval: .nan\n", "out of range|greater than 0"),
    ("poll_interval: 0.000001\n", "out of range"),
    ("fast_interval: 0.0000000001\n", "out of range"),
    ("collectors: {nvml: {interval: .inf}}\n", "out of range"),
    ("enrich: {kubernetes: {refresh_seconds: 0}}\n", "refresh_seconds"),
    ("enrich: {cloud: {refresh_seconds: .inf}}\n", "refresh_seconds"),
])
def test_hostile_config_refused_at_load(tmp_path, text, match):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=match):
        Daemon(Settings(config_path=p)).load()
    assert time.monotonic() - t0 < 30  # refused before expansion, not after 4 GB


@pytest.mark.parametrize("field", ["scale: .nan", "scale: .inf", "offset: .nan",
                                   "invalid: [.nan]", "valid: [10, 0]"])
def test_mapping_nonfinite_numbers_refused(tmp_path, schema, field):
    p = tmp_path / "m.yaml"
    p.write_text(f"vendor: nvidia\nfields:\n  - {{raw: x, metric: gpu_power_watts, {field}}}\n")
    with pytest.raises(ConfigError):
        load_mapping(p, schema)


def test_negative_clock_is_malformed_not_exported(schema):
    mapper = Mapper(MappingSet.load_dir(default_mappings_dir(), schema))
    dev = Device(key="k", vendor="nvidia", index="0", mapping="nvml", uuid="GPU-1")
    sample = PollResult(monotonic=1.0)
    sample.add("k", "clock.sm", -5.0)
    sample.add("k", "clock.graphics", 1410.0)
    out = mapper.map(sample, {"k": dev})
    clocks = {dict(ls).get("domain"): v for (n, ls), v in flat(out.frames).items() if n == "gpu_clock_mhz"}
    assert clocks == {"graphics": 1410.0}
    assert out.malformed == 1


@pytest.mark.parametrize(("accept", "om"), [
    ("application/openmetrics-text; q=0", False),
    ("application/openmetrics-text;version=1.0.0;q=0,text/plain", False),
    ("application/openmetrics-text", True),
    ("application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.2", True),
    ("text/plain;q=0.9,application/openmetrics-text;q=0.1", False),
    ("", False),
])
def test_accept_quality_values(accept, om):
    assert _wants_openmetrics(accept) is om
    make_mocked_request("GET", "/metrics", headers={"Accept": accept})


def test_shipped_mappings_still_load(tmp_path):
    d = tmp_path / "m"
    shutil.copytree(default_mappings_dir(), d)
    Daemon(Settings(mappings_dir=d)).load()


@pytest.mark.parametrize("args", [["--poll.interval", "0.000001"], ["--poll.fast-interval", "2d"],
                                  ["--poll.interval", "100000"], ["--web.max-connections", "0"],
                                  ["--web.max-connections", "x"]])
def test_numeric_flags_range_checked(args):
    from exporter.run.argparsing import build_parser
    with pytest.raises(SystemExit):
        build_parser().parse_args(args)
