"""Imported profiler values expire: a stale import stops feeding series (and so alerts and the
indicators) after ``ttl`` seconds."""

from __future__ import annotations

import pytest

from exporter.importers.profiles_source import ProfilesSource
from exporter.sources.context import SourceContext
from exporter.testing import FakeClock
from tests.test_profiles_source import ROCPROF_V1, _get, _series, mappings  # noqa: F401 - fixture


def _drop(tmp_path, src: ProfilesSource, name: str) -> None:
    (tmp_path / "drop" / name).write_text(ROCPROF_V1)
    assert src.scan_once() == 1


def test_import_expires_after_ttl_and_a_new_one_lives_again(tmp_path, mappings):  # noqa: F811
    src = ProfilesSource(SourceContext(options={"dir": str(tmp_path / "drop"), "settle": 0, "scan_interval": 3600,
                                  "ttl": 60}, wanted=mappings.raw_fields()))
    clock = FakeClock(1000.0)
    src.clock = clock
    src.open()
    try:
        _drop(tmp_path, src, "a.traceid-j1.csv")
        clock.now = 1059.0
        series, _ = _series(src, mappings)
        assert _get(series, "gpu_memory_arbitration_stalls_percent", kernel="copy", trace_id="j1") == 1.0
        clock.now = 1061.0
        series, sample = _series(src, mappings)
        assert not [k for k in series if k[0] == "gpu_memory_arbitration_stalls_percent"]
        assert not [k for k in series if k[0] == "gpu_l2_cache_miss_rate_percent"]
        assert sample.errors["profile_expired"] == 1
        _drop(tmp_path, src, "b.traceid-j2.csv")
        series, _ = _series(src, mappings)
        assert _get(series, "gpu_memory_arbitration_stalls_percent", kernel="copy", trace_id="j2") == 1.0
    finally:
        src.close()


def test_ttl_zero_keeps_imports_until_replaced(tmp_path, mappings):  # noqa: F811
    src = ProfilesSource(SourceContext(options={"dir": str(tmp_path / "drop"), "settle": 0, "scan_interval": 3600,
                                  "ttl": 0}, wanted=mappings.raw_fields()))
    clock = FakeClock(1000.0)
    src.clock = clock
    src.open()
    try:
        _drop(tmp_path, src, "a.traceid-j1.csv")
        clock.now = 1e9
        series, _ = _series(src, mappings)
        assert _get(series, "gpu_memory_arbitration_stalls_percent", kernel="copy", trace_id="j1") == 1.0
    finally:
        src.close()


@pytest.mark.parametrize("ttl", [-1, float("nan")])
def test_bad_ttl_is_refused(tmp_path, mappings, ttl):  # noqa: F811
    with pytest.raises(ValueError, match="ttl"):
        ProfilesSource(SourceContext(options={"dir": str(tmp_path), "ttl": ttl}, wanted=mappings.raw_fields()))
