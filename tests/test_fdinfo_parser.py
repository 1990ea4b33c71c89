"""fdinfo_parser: every real fdinfo sample parses to the values it prints; any text is safe."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.sources.fdinfo_parser import normalize_pdev, parse_fdinfo

KiB = 1024


def _sample(shared_fixtures: Path, name: str) -> str:
    return (shared_fixtures / "intel" / name).read_text()


def test_xe_sample(shared_fixtures):
    rec = parse_fdinfo(_sample(shared_fixtures, "fdinfo-xe-1.txt"))
    assert rec is not None and rec.malformed == 0
    assert (rec.driver, rec.pdev, rec.client_id) == ("xe", "0000:03:00.0", "3")
    assert rec.cycles == {"rcs": 28257900, "bcs": 0, "vcs": 0, "vecs": 0, "ccs": 0}
    assert rec.total_cycles == dict.fromkeys(("rcs", "bcs", "vcs", "vecs", "ccs"), 7655183225)
    assert rec.capacity == {"vcs": 2, "vecs": 2, "ccs": 4}
    assert rec.engine_ns == {}
    assert rec.memory["shared"]["vram0"] == 16 * 1024 * 1024  # "16 MiB"
    assert rec.memory["total"]["gtt"] == 192 * KiB
    assert rec.resident() == {"system": 0, "gtt": 192 * KiB, "vram0": 23992 * KiB, "stolen": 0}


def test_i915_doc_sample(shared_fixtures):
    rec = parse_fdinfo(_sample(shared_fixtures, "fdinfo-i915-1.txt"))
    assert rec is not None and rec.malformed == 0
    assert (rec.driver, rec.pdev, rec.client_id) == ("i915", "0000:00:02.0", "7")
    assert rec.engine_ns == {"render": 9288864723, "copy": 2035071108, "video": 0, "video-enhance": 0}
    assert rec.capacity == {"video": 2}
    assert rec.resident() == {}


def test_i915_manpage_sample_with_regions(shared_fixtures):
    rec = parse_fdinfo(_sample(shared_fixtures, "fdinfo-i915-2.txt"))
    assert rec is not None and rec.malformed == 0
    assert rec.client_id == "39"
    assert rec.engine_ns["render"] == 346249
    assert rec.memory["purgeable"] == {"system0": 1688 * KiB, "stolen-system0": 0}
    assert rec.resident() == {"system0": 6044 * KiB, "stolen-system0": 0}


def test_amdgpu_legacy_memory_keys(shared_fixtures):
    rec = parse_fdinfo(_sample(shared_fixtures, "fdinfo-amdgpu-1.txt"))
    assert rec is not None and rec.malformed == 0
    assert (rec.driver, rec.pdev, rec.client_id) == ("amdgpu", "0000:08:00.0", "217")
    assert rec.engine_ns == {"gfx": 107322799}
    # drm-memory-<region> is the deprecated alias of drm-resident-<region>
    assert rec.resident() == {"vram": 2068 * KiB, "gtt": 8192 * KiB, "cpu": 0}


def test_msm_platform_device_has_no_pdev(shared_fixtures):
    rec = parse_fdinfo(_sample(shared_fixtures, "fdinfo-msm-1.txt"))
    assert rec is not None and rec.malformed == 0
    assert (rec.driver, rec.pdev, rec.client_id) == ("msm", "", "7")
    assert rec.engine_ns == {"gpu": 1734371319}
    assert rec.cycles == {"gpu": 1153645024}
    assert rec.maxfreq_hz == {"gpu": 800e6}


@pytest.mark.parametrize("sep", [":\t", ": ", ":", ":   \t "])
def test_separator_forms(sep):
    text = "\n".join(f"{k}{sep}{v}" for k, v in [
        ("drm-driver", "i915"), ("drm-pdev", "0000:00:02.0"), ("drm-client-id", "5"),
        ("drm-engine-render", "123 ns"), ("drm-resident-local0", "2 MiB")])
    rec = parse_fdinfo(text)
    assert rec is not None and rec.malformed == 0
    assert rec.engine_ns == {"render": 123}
    assert rec.resident() == {"local0": 2 * 1024 * 1024}


def test_not_drm_and_malformed_values():
    assert parse_fdinfo("pos:\t0\nflags:\t02\nmnt_id:\t9\n") is None
    assert parse_fdinfo("drm-driver:\n") is None  # empty driver name
    rec = parse_fdinfo("drm-driver: xe\ndrm-cycles-rcs: lots\ndrm-total-vram0: 5 PiB\n"
                       "drm-engine-capacity-ccs: 0\ndrm-pdev: nonsense\ndrm-curfreq-gpu: 5 Hz\n")
    assert rec is not None
    assert rec.malformed == 4 and rec.cycles == {} and rec.memory == {} and rec.capacity == {}


@pytest.mark.parametrize(("raw", "want"), [
    ("0000:03:00.0", "0000:03:00.0"), ("0000:0B:00.0", "0000:0b:00.0"), ("03:00.0", "0000:03:00.0"),
    ("10000:e1:00.1", "10000:e1:00.1"), ("card0", ""), ("", ""),
])
def test_normalize_pdev(raw, want):
    assert normalize_pdev(raw) == want


_keys = st.sampled_from(["drm-driver", "drm-pdev", "drm-client-id", "drm-engine-render", "drm-engine-capacity-vcs",
                         "drm-cycles-rcs", "drm-total-cycles-rcs", "drm-maxfreq-gpu", "drm-total-vram0",
                         "drm-memory-gtt", "drm-resident-", "drm-", "pos"])
_line = st.tuples(_keys | st.text(max_size=12), st.sampled_from([":", ": ", ":\t", ""]), st.text(max_size=24))


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_arbitrary_text_never_raises(text):
    rec = parse_fdinfo(text)
    assert rec is None or rec.driver


@settings(max_examples=300, deadline=None)
@given(st.lists(_line, max_size=20))
def test_arbitrary_drm_lines_never_raise(lines):
    rec = parse_fdinfo("\n".join(k + s + v for k, s, v in lines))
    if rec is not None:
        assert all(v >= 0 for v in rec.engine_ns.values())
        assert all(c >= 1 for c in rec.capacity.values())
