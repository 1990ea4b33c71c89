"""Bad input: arbitrary YAML and text into the config / mapping / scenario loaders, garbage into the
sysfs value parsers, the upstream exposition parser, and garbage files under every sysfs/procfs
source's tree.  Nothing but the documented error may escape.

Already covered elsewhere (not repeated here): random bytes into the gpu_metrics parser
(test_amd_gpu_metrics.py) and random text into the fdinfo parser (test_fdinfo_parser.py).
"""

from __future__ import annotations

import os
import random
import string
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.config import load_config
from exporter.map.mapper import Mapper
from exporter.map.mapping import load_mapping
from exporter.map.schema import default_mappings_dir, load_schema
from exporter.map.store import SourceState, Store
from exporter.run.pipeline import poll_and_map
from exporter.simulate import load_scenario
from exporter.sources import sysfs_util
from exporter.sources.amdgpu_sysfs import AmdgpuSysfsSource, parse_dpm, parse_link_speed, parse_pcie_bw
from exporter.sources.base import PollResult
from exporter.sources.context import SourceContext
from exporter.sources.drm_fdinfo import DrmFdinfoSource
from exporter.sources.intel_sysfs import IntelSysfsSource
from exporter.sources.upstream import FetchError, parse_exposition
from exporter.testing import flat, load_mappings
from exporter.yamlfile import ConfigError
from tests.amd_fixture_tree import arrange_mi300x_node
from tests.fdinfo_trees import add_card as add_drm_card
from tests.fdinfo_trees import add_fd, some_card

SCHEMA = load_schema(default_mappings_dir() / "canonical.yaml")
FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# ------------------------------------------------------------------------------------------------
# YAML documents: random structures dumped as YAML (keys the models know, and others), YAML-ish
# token soup, and plain text.  Each loader may only raise ConfigError.

_known_keys = st.sampled_from([
    # config
    "poll_interval", "fast_interval", "collectors", "labels", "mappings_dir", "indicators", "simulate",
    "enrich", "enabled", "interval", "timeout", "options", "nvml", "amdgpu", "upstream", "targets",
    # mapping
    "vendor", "description", "fields", "raw", "metric", "scale", "offset", "label_map", "transform",
    "wrap", "invalid", "clamp", "gpu_power_watts", "gpu_energy_joules_total", "amd", "rate",
    # scenario
    "name", "seed", "loop", "devices", "phases", "duration", "values", "mapping", "model", "count",
])
_scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True)
            | st.text(max_size=12) | st.sampled_from(["1s", "250ms", "-1s", "0", "nvidia", "rate", "1e400",
                                                      ".inf", "=gpu_power_watts", "gpu{a=\"b\"}"]))
_trees = st.recursive(_scalars, lambda kids: st.lists(kids, max_size=4)
                      | st.dictionaries(_known_keys | st.text(max_size=6), kids, max_size=5), max_leaves=25)
_tokens = st.lists(st.sampled_from(
    ["a", ":", " ", "\n", "  ", "- ", "[", "]", "{", "}", ",", "&x", "*x", "? ", "!!str", "!!binary",
     "!!python/object:os.system", "'", '"', "#", "|", ">", "---", "...", "%YAML 1.1", "\t", "1", "1.5",
     "poll_interval", "fields", "vendor", "\\u0000", "\x00", "\x85", "\ufeff", "<<: *x", "@"]), max_size=40)

YAML_REGRESSIONS = [
    "? [a, b]\n: c\n",                        # a sequence as a mapping key
    "labels: {? {a: 1}: 2}\n",                # a mapping as a key, nested
    "a: &x [*x]\n",                           # a recursive alias
    "labels: &x {a: *x}\n",
    "[" * 3000 + "]" * 3000,                  # nesting deeper than the recursion limit
    "\x00",                                   # a character YAML does not accept
    "poll_interval: 1s\n---\nlabels: {}\n",   # two documents
    "!!python/object/apply:os.system [true]\n",
]


def _documents():
    return (_trees.map(lambda t: yaml.safe_dump(t, default_flow_style=None, allow_unicode=True))
            | _tokens.map("".join) | st.text(max_size=200))


def _write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return path


def _only_config_error(fn, path: Path) -> None:
    try:
        fn(path)
    except ConfigError as exc:
        assert str(exc)
        assert str(path) in str(exc) or "scenario" in str(exc), str(exc)


def _config_error(fn, path: Path) -> None:
    """The loader must reject the file with a ConfigError naming it (loading it is a failure)."""
    with pytest.raises(ConfigError) as info:
        fn(path)
    assert str(info.value)
    assert str(path) in str(info.value) or "scenario" in str(info.value), str(info.value)


@pytest.mark.parametrize("text", YAML_REGRESSIONS)
@pytest.mark.parametrize("loader", ["config", "mapping", "scenario"])
def test_hostile_yaml_gives_config_error(tmp_path, loader, text):
    fn = {"config": load_config, "mapping": lambda p: load_mapping(p, SCHEMA),
          "scenario": lambda p: load_scenario(str(p))}[loader]
    _config_error(fn, _write(tmp_path, f"{loader}.yaml", text))


@pytest.mark.parametrize("loader", ["config", "mapping", "scenario"])
def test_file_that_is_not_utf8_gives_config_error(tmp_path, loader):
    fn = {"config": load_config, "mapping": lambda p: load_mapping(p, SCHEMA),
          "scenario": lambda p: load_scenario(str(p))}[loader]
    _config_error(fn, _write(tmp_path, f"{loader}.yaml", b"labels: {node: \xff\xfe}\n"))


@FAST
@given(text=_documents())
def test_config_loader_raises_only_config_error(tmp_path, text):
    _only_config_error(load_config, _write(tmp_path, "config.yaml", text))


@FAST
@given(text=_documents())
def test_mapping_loader_raises_only_config_error(tmp_path, text):
    _only_config_error(lambda p: load_mapping(p, SCHEMA), _write(tmp_path, "m.yaml", text))


@FAST
@given(text=_documents())
def test_scenario_loader_raises_only_config_error(tmp_path, text):
    _only_config_error(lambda p: load_scenario(str(p)), _write(tmp_path, "s.yaml", text))


_rule = st.fixed_dictionaries({
    "raw": st.text(min_size=1, max_size=8),
    "metric": st.sampled_from(sorted(SCHEMA.metrics)),
}, optional={
    "scale": st.floats(allow_nan=True), "offset": st.floats(allow_nan=True),
    "transform": st.sampled_from(["none", "rate", "bogus"]),
    "wrap": st.floats(allow_nan=True) | st.integers(-5, 2**40),
    "invalid": st.lists(st.floats(allow_nan=False), max_size=3),
    "clamp": st.lists(st.floats(allow_nan=True), min_size=0, max_size=3),
    "labels": st.dictionaries(st.sampled_from(["sensor", "domain", "direction", "interconnect", "x", "1bad"]),
                              st.text(max_size=5), max_size=3),
    "label_map": st.dictionaries(st.text(max_size=4), st.sampled_from(["link", "pid", "process", "bad-name"]),
                                 max_size=2),
})


@FAST
@given(rules=st.lists(_rule, max_size=6), vendor=st.sampled_from(["nvidia", "amd", "intel", "acme"]),
       values=st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=6))
def test_schema_shaped_mappings_load_or_fail_cleanly_and_map_any_value(tmp_path, rules, vendor, values):
    """Mappings close to valid ones: they load or raise ConfigError; a loaded one maps any raw
    values (NaN, inf, huge) without raising and never emits a non-finite sample."""
    path = _write(tmp_path, "m.yaml", yaml.safe_dump({"vendor": vendor, "fields": rules}))
    try:
        cm = load_mapping(path, SCHEMA, "m")
    except ConfigError:
        return
    ms = _shipped_mappings()
    mapper = Mapper(type(ms)(ms.schema, {**ms.mappings, "m": cm}))
    store, state = Store(), SourceState("t")
    store.add(state)
    from exporter.sources.base import Device
    dev = Device(key="k", vendor=cm.vendor, index="0", mapping="m", uuid="u")
    for i, v in enumerate(values):
        s = PollResult(devices=[dev], monotonic=1000.0 + i)
        for r in rules:
            s.add("k", r["raw"], v, (("link", "0"), ("pid", "1"), ("process", "p")))
        out = poll_and_map(lambda s=s: s, store, state, mapper).result
        for (_name, _labels), value in flat(out.frames).items():
            assert value == value and abs(value) != float("inf"), (rules, values)


# ------------------------------------------------------------------------------------------------
# sysfs value parsers


@settings(max_examples=500, deadline=None)
@given(st.text() | st.binary().map(lambda b: b.decode("latin-1")))
def test_sysfs_text_parsers_never_raise(text):
    v = sysfs_util.parse_int(text)
    assert v is None or isinstance(v, int)
    cur, high = parse_dpm(text)
    assert cur is None or cur >= 0
    assert high is None or high >= 0
    speed = parse_link_speed(text)
    assert speed is None or speed >= 0
    bw = parse_pcie_bw(text)
    assert bw is None or len(bw) == 3


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300))
def test_sysfs_file_readers_never_raise_and_count_errors(tmp_path, data):
    path = tmp_path / "attr"
    path.write_bytes(data)
    errors: dict[str, int] = {}
    for fn in (sysfs_util.read_text, sysfs_util.read_int, sysfs_util.read_float, sysfs_util.read_kv):
        fn(path, errors)
    assert set(errors) <= {"malformed_value"}
    # absent: silent; a directory: read_error, counted
    assert sysfs_util.read_int(tmp_path / "absent", errors) is None
    assert sysfs_util.read_int(tmp_path, errors) is None and errors.get("read_error") == 1


# ------------------------------------------------------------------------------------------------
# upstream exposition


_expo_line = st.one_of(
    st.text(max_size=60),
    st.builds(lambda n, lbl, v: f"{n}{lbl} {v}",
              st.sampled_from(["DCGM_FI_DEV_GPU_UTIL", "gpu_power", "x_total", "a:b", "9bad", ""]),
              st.sampled_from(["", "{}", '{gpu="0"}', '{gpu="0",UUID="GPU-1"}', '{a="\\"}', "{a=b}", '{a="x"']),
              st.sampled_from(["1", "NaN", "+Inf", "-1e400", "0x10", "abc", "1 123", "1 # {a=\"b\"} 1"])),
    st.sampled_from(["# TYPE x counter", "# HELP x help", "# TYPE x", "# EOF", "# TYPE x_total counter",
                     "# UNIT x bytes", "#"]),
)


@settings(max_examples=400, deadline=None)
@given(lines=st.lists(_expo_line, max_size=15),
       ctype=st.sampled_from(["", "text/plain; version=0.0.4",
                              "application/openmetrics-text; version=1.0.0"]))
def test_exposition_parser_raises_only_fetch_error(lines, ctype):
    try:
        samples = parse_exposition("\n".join(lines) + "\n", ctype)
    except FetchError as exc:
        assert exc.kind == "parse_error"
        return
    for name, labels, value in samples:
        assert isinstance(name, str) and isinstance(labels, dict) and isinstance(value, (int, float))


# ------------------------------------------------------------------------------------------------
# garbage files under the trees of the sysfs/procfs sources: poll() never raises


def _scribble(root: Path, rnd: random.Random, share: float = 0.5, keep: frozenset[str] = frozenset()) -> int:
    """Overwrite a share of the regular files under ``root`` (except those named in ``keep``)
    with random bytes or text."""
    files = [p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and p.name not in keep]
    junk = [b"", b"\xff\xfe\x00", b"-1\n", b"99999999999999999999999999\n", b"0x\n", b"nan\n", b"inf\n",
            b"1.5\n", "١٢\n".encode(), b"\n\n\n", b"0: 100Mhz *\n1: x\n", b"S: Mhz *"]
    n = 0
    for p in files:
        if rnd.random() < share:
            choice = rnd.random()
            if choice < 0.4:
                data = rnd.choice(junk)
            elif choice < 0.8:
                data = bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 64)))
            else:
                data = "".join(rnd.choice(string.printable) for _ in range(rnd.randrange(0, 40))).encode()
            p.write_bytes(data)
            n += 1
    return n


def _poll_twice(src) -> list[PollResult]:
    src.open()
    try:
        return [src.poll(), src.poll()]
    finally:
        src.close()


_MAPPINGS: list = []


def _shipped_mappings():
    if not _MAPPINGS:
        _MAPPINGS.append(load_mappings())
    return _MAPPINGS[0]


def _mapped(src_name: str, samples: list[PollResult]) -> None:
    """The samples also go through the mapping without raising or emitting non-finite values."""
    mapper = Mapper(_shipped_mappings())
    store, state = Store(), SourceState(src_name)
    store.add(state)
    for i, s in enumerate(samples):
        out = poll_and_map(lambda s=s: s, store, state, mapper, now=s.monotonic or 1000.0 + i).result
        assert all(v == v and abs(v) != float("inf") for v in flat(out.frames).values())


@pytest.mark.parametrize("seed", range(12))
def test_amdgpu_poll_survives_garbage_files(tmp_path, seed):
    arrange_mi300x_node(tmp_path, cards=(0, 1))
    assert _scribble(tmp_path / "devices", random.Random(seed)) > 5
    src = AmdgpuSysfsSource(SourceContext(sysfs=tmp_path, options={"pcie_bw": False}))
    try:
        samples = _poll_twice(src)
    except Exception as exc:  # discovery may find no amdgpu card if uevent was scribbled
        assert type(exc).__name__ == "SourceUnavailable", exc
        return
    _mapped("amdgpu", samples)


@pytest.mark.parametrize("seed", range(6))
def test_amdgpu_poll_survives_garbage_real_cards(tmp_path, shared_fixtures, seed):
    from tests.amd_fixture_tree import REAL_CARDS, arrange_real_card

    for n, name in enumerate(REAL_CARDS):
        arrange_real_card(tmp_path, shared_fixtures, name, n)
    _scribble(tmp_path / "devices", random.Random(seed), share=0.3)
    src = AmdgpuSysfsSource(SourceContext(sysfs=tmp_path, options={"pcie_bw": False}))
    try:
        samples = _poll_twice(src)
    except Exception as exc:
        assert type(exc).__name__ == "SourceUnavailable", exc
        return
    _mapped("amdgpu", samples)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("tree", ["sysfs-lact-a380-i915", "sysfs-lact-a380-xe", "sysfs-lact-b580",
                                  "sysfs-lact-cometlake"])
def test_intel_poll_survives_garbage_files(tmp_path, shared_fixtures, tree, seed):
    from tests.intel_trees import sysfs_root

    root = sysfs_root(shared_fixtures, tmp_path, tree, copy=True)
    # the card's identity (uevent: DRIVER, PCI_SLOT_NAME) stays intact so discovery finds it and
    # every combination really polls the scribbled telemetry files
    assert _scribble(root / "class" / "drm", random.Random(seed), share=0.3,
                     keep=frozenset({"uevent"})) > 0
    src = IntelSysfsSource(SourceContext(sysfs=root))
    samples = _poll_twice(src)
    assert samples[0].devices, "the scribbled card must still be found and polled"
    _mapped("intel", samples)


def test_intel_poll_with_a_scribbled_identity_is_unavailable_not_a_crash(tmp_path, shared_fixtures):
    from exporter.sources.base import SourceUnavailable
    from tests.intel_trees import sysfs_root

    root = sysfs_root(shared_fixtures, tmp_path, "sysfs-lact-b580", copy=True)
    for uevent in (root / "class" / "drm").rglob("uevent"):
        if uevent.is_file():
            uevent.write_bytes(b"\xff\xfe\x00garbage")
    for link in (root / "class" / "drm").rglob("driver"):
        if link.is_symlink():
            link.unlink()
    with pytest.raises(SourceUnavailable):
        IntelSysfsSource(SourceContext(sysfs=root)).open()


@FAST
@given(texts=st.lists(st.binary(max_size=400), min_size=1, max_size=4))
def test_fdinfo_poll_survives_garbage_fdinfo_and_comm(tmp_path_factory, texts):
    base = tmp_path_factory.mktemp("fd")
    proc, sysfs = base / "proc", base / "sys"
    add_drm_card(sysfs, 1, "0000:08:00.0")
    good = ("drm-driver:\tamdgpu\ndrm-pdev:\t0000:08:00.0\ndrm-client-id:\t7\n"
            "drm-engine-gfx:\t1000 ns\ndrm-memory-vram:\t4 KiB\n")
    add_fd(proc, 10, 3, "/dev/dri/renderD128", good, comm="ok")
    for i, data in enumerate(texts):
        add_fd(proc, 20 + i, 3, "/dev/dri/renderD128", "", comm="x")
        (proc / str(20 + i) / "fdinfo" / "3").write_bytes(data)
        (proc / str(20 + i) / "comm").write_bytes(data[:20])
    some_card(sysfs)  # a node with a DRM card (else the source is absent)
    src = DrmFdinfoSource(SourceContext(sysfs=sysfs, procfs=proc, options={"processes": "series"}))
    samples = _poll_twice(src)
    pids = {dict(r.labels)["pid"] for r in samples[-1].readings if r.field.startswith("process.")}
    assert "10" in pids
    _mapped("fdinfo", samples)


def test_garbage_helpers_are_deterministic(tmp_path):
    """_scribble is seeded: a failure above reproduces with its seed."""
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        for i in range(20):
            (tmp_path / d / f"f{i}").write_text("x")
        _scribble(tmp_path / d, random.Random(3))
    assert all((tmp_path / "a" / f"f{i}").read_bytes() == (tmp_path / "b" / f"f{i}").read_bytes()
               for i in range(20))
    assert os.listdir(tmp_path / "a")
