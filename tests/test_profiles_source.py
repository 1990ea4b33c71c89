"""ProfilesSource: drop directory -> mapping engine -> canonical series; triggered capture."""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
import time
from pathlib import Path

import pytest

from exporter.importers.profiles_source import ProfilesSource
from exporter.importers.trigger import CaptureTrigger, TriggerConfig
from exporter.map.mapper import Mapper
from exporter.map.mapping import MappingSet
from exporter.map.schema import default_mappings_dir, load_schema
from exporter.sources.base import SourceUnavailable
from exporter.sources.context import SourceContext
from exporter.testing import flat, frames_of

ROCPROF_V1 = textwrap.dedent("""\
    "Index","KernelName","gpu-id","queue-id","pid","DispatchNs","BeginNs","EndNs","L2CacheHit","MemUnitStalled"
    0,"gemm [clone .kd]",0,0,1,1000,6000,106000,40.0,10.0
    1,"gemm [clone .kd]",0,0,1,200000,203000,313000,60.0,30.0
    2,"copy [clone .kd]",0,0,1,400000,401000,402000,90.0,1.0
    """)


@pytest.fixture(scope="module")
def mappings():
    mdir = default_mappings_dir()
    return MappingSet.load_dir(mdir, load_schema(mdir / "canonical.yaml"))


def _source(tmp_path, mappings, **opts) -> ProfilesSource:
    src = ProfilesSource(SourceContext(options={"dir": str(tmp_path / "drop"), "settle": 0, "scan_interval": 3600,
                                  "restore": True, **opts}, wanted=mappings.raw_fields()))
    src.open()
    return src


def _series(src: ProfilesSource, mappings) -> tuple[dict, object]:
    sample = src.poll()
    sample.monotonic = time.monotonic()
    devices = {d.key: d for d in sample.devices}
    return flat(Mapper(mappings).map(sample, devices).frames), sample


def _get(series: dict, name: str, **labels) -> float:
    hits = [v for (n, ls), v in series.items() if n == name and all(dict(ls).get(k) == x for k, x in labels.items())
            and ("kernel" in labels or "kernel" not in dict(ls))]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


def test_without_dir_the_source_is_unavailable(mappings):
    with pytest.raises(SourceUnavailable, match="dir"):
        ProfilesSource(SourceContext(options={}, wanted=mappings.raw_fields())).open()


def test_dropped_file_becomes_canonical_series(tmp_path, mappings):
    src = _source(tmp_path, mappings)
    try:
        drop = tmp_path / "drop"
        (drop / "run1.traceid-job42.csv.tmp").write_text(ROCPROF_V1)  # still being written: ignored
        src.scan_once()
        assert (drop / "run1.traceid-job42.csv.tmp").exists()
        os.rename(drop / "run1.traceid-job42.csv.tmp", drop / "run1.traceid-job42.csv")
        src.scan_once()
        assert (drop / "imported" / "run1.traceid-job42.csv").is_file()
        series, sample = _series(src, mappings)
        assert not sample.errors
        common = {"vendor": "amd", "gpu": "0", "source": "rocprof", "trace_id": "job42"}
        # duration-weighted over the two gemm dispatches (100 us at 40 %, 110 us at 60 %)
        gemm_hit = (40 * 100 + 60 * 110) / 210
        assert _get(series, "gpu_l2_cache_miss_rate_percent", kernel="gemm", **common) == pytest.approx(100 - gemm_hit)
        assert _get(series, "gpu_memory_arbitration_stalls_percent", kernel="copy", **common) == pytest.approx(1.0)
        assert _get(series, "gpu_kernel_executions", kernel="gemm", **common) == 2
        assert _get(series, "gpu_kernel_execution_time_percentile_milliseconds", kernel="gemm", percentile="100",
                    **common) == pytest.approx(0.110)
        assert _get(series, "gpu_kernel_execution_time_cov", kernel="gemm", **common) == pytest.approx(5 / 105)
        assert _get(series, "gpu_kernel_launch_latency_seconds", percentile="100", **common) == pytest.approx(5e-6)
        assert _get(series, "gpu_profile_imports_total", vendor="amd", source="rocprof") == 1
        # not live readings: the series stay on every poll
        again, _ = _series(src, mappings)
        assert again.keys() == series.keys()
    finally:
        src.close()


def test_bad_file_moved_aside_with_reason_and_counted_once(tmp_path, mappings):
    src = _source(tmp_path, mappings)
    try:
        drop = tmp_path / "drop"
        (drop / "garbage.csv").write_text("a,b\n1,2\n")
        (drop / "empty.json").write_text("")
        src.scan_once()
        reason = (drop / "rejected" / "garbage.csv.reason").read_text()
        assert "unrecognised format" in reason
        assert (drop / "rejected" / "empty.json.reason").read_text().startswith("empty file")
        _, sample = _series(src, mappings)
        assert sample.errors["profile_rejected"] == 2
        _, sample = _series(src, mappings)
        assert not sample.errors  # counted once: the daemon adds each poll's errors to its total
        assert not any(p.is_file() for p in drop.iterdir())
    finally:
        src.close()


def test_newer_import_replaces_and_survives_restart(tmp_path, mappings):
    src = _source(tmp_path, mappings, max_profiles=2)
    drop = tmp_path / "drop"
    try:
        (drop / "a.csv").write_text(ROCPROF_V1)
        src.scan_once()
        (drop / "b.csv").write_text(ROCPROF_V1.replace("40.0", "0.0"))  # same tool, GPU, no trace id
        src.scan_once()
        series, _ = _series(src, mappings)
        gemm = _get(series, "gpu_l2_cache_miss_rate_percent", kernel="gemm", source="rocprof")
        assert gemm == pytest.approx(100 - 60 * 110 / 210)  # b replaced a
        assert _get(series, "gpu_profile_imports_total", source="rocprof") == 2
        for i in range(3):  # bounded: only max_profiles artifacts stay
            (drop / f"c{i}.traceid-t{i}.csv").write_text(ROCPROF_V1)
            src.scan_once()
        series, _ = _series(src, mappings)
        assert {dict(ls).get("trace_id") for (n, ls) in series if n == "gpu_kernel_executions"} == {"t1", "t2"}
    finally:
        src.close()
    restarted = _source(tmp_path, mappings, max_profiles=2)
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            series, _ = _series(restarted, mappings)
            if any(n == "gpu_kernel_executions" for n, _ in series):
                break
            time.sleep(0.02)
        assert {dict(ls).get("trace_id") for (n, ls) in series if n == "gpu_kernel_executions"} == {"t1", "t2"}
        assert not any(n == "gpu_profile_imports_total" for n, _ in series)  # restored, not imported again
    finally:
        restarted.close()


def test_interrupted_import_is_set_aside_at_start(tmp_path, mappings):
    (tmp_path / "drop" / "processing").mkdir(parents=True)
    (tmp_path / "drop" / "processing" / "half.sqlite").write_bytes(b"SQLite format 3\x00")
    src = _source(tmp_path, mappings)
    try:
        assert "interrupted" in (tmp_path / "drop" / "rejected" / "half.sqlite.reason").read_text()
        _, sample = _series(src, mappings)
        assert sample.errors["profile_rejected"] == 1
    finally:
        src.close()


def test_real_nsys_export_uses_uuid_and_drops_unmapped_fields(tmp_path, mappings, shared_fixtures):
    src = _source(tmp_path, mappings)
    try:
        shutil.copy(shared_fixtures / "profilers" / "nsys-2026.1.1-schema3.24.14-torch-tiny.sqlite",
                    tmp_path / "drop" / "torch.sqlite")
        src.scan_once()
        series, sample = _series(src, mappings)
        (dev,) = sample.devices
        assert dev.uuid == "GPU-554a6988-03dd-6206-3dd1-f43fb60a3ed0" and dev.mapping == "profiles/nsys"
        assert _get(series, "gpu_kernel_launch_latency_seconds", percentile="50", source="nsys") == \
            pytest.approx((18982 + 184869) / 2 / 1e9)
        mapped = set(mappings.get("profiles/nsys").rules)
        assert {r.field for r in sample.readings} <= mapped
    finally:
        src.close()


# ---------------------------------------------------------------------------- triggered capture
FAKE_CAPTURE = textwrap.dedent(f"""\
    import sys, time
    mode = sys.argv[2]
    if mode == "sleep":
        time.sleep(30)
    if mode == "fail":
        print("nsys: cannot access GPU"); sys.exit(3)
    if mode == "ok":
        with open(sys.argv[1] + ".csv", "w") as f:
            f.write({ROCPROF_V1!r})
    """)


def _trigger(tmp_path, mode: str, **kw) -> CaptureTrigger:
    script = tmp_path / "fake_capture.py"
    script.write_text(FAKE_CAPTURE)
    cfg = TriggerConfig.from_options({"enabled": True, "for_seconds": 5, "min_interval": 100, "timeout": 10,
                                      "command": [sys.executable, str(script), "{output}", mode], **kw})
    (tmp_path / "drop").mkdir(exist_ok=True)
    return CaptureTrigger(cfg)


def test_trigger_condition_duration_and_rate_limit(tmp_path):
    t = _trigger(tmp_path, "ok")
    hot, cold = {"gpu_memory_contention": 1.0}, {"gpu_memory_contention": 0.0}
    assert not t.observe(0, "gpu0", hot)
    assert not t.observe(4, "gpu0", hot)
    assert not t.observe(4.5, "gpu0", cold)      # the episode ended: the clock restarts
    assert not t.observe(5, "gpu0", hot)
    assert not t.observe(9, "gpu0", {})          # no value: not contended
    assert not t.observe(10, "gpu0", hot)
    assert t.observe(15, "gpu0", hot)            # held for 5 s
    assert not t.observe(16, "gpu1", hot) and not t.observe(30, "gpu1", hot)
    assert t.stats["rate_limited"] == 1          # once per episode, within min_interval
    assert t.observe(200, "gpu1", hot)


def test_disabled_trigger_never_fires():
    t = CaptureTrigger(TriggerConfig())
    assert not any(t.observe(float(s), "g", {"gpu_memory_contention": 1}) for s in range(0, 1000, 10))


@pytest.mark.parametrize("opts", [{"enabled": True}, {"command": "nsys profile"}, {"bogus": 1},
                                  {"timeout": -1}])
def test_trigger_config_errors(opts):
    with pytest.raises(ValueError):
        TriggerConfig.from_options(opts)


def test_capture_ok_is_imported_with_its_trace_id(tmp_path, mappings):
    src = _source(tmp_path, mappings, trigger={
        "enabled": True, "for_seconds": 0, "min_interval": 0, "timeout": 20,
        "command": [sys.executable, str(tmp_path / "fake_capture.py"), "{output}", "ok"]})
    (tmp_path / "fake_capture.py").write_text(FAKE_CAPTURE)
    try:
        assert src.observe_indicators(time.monotonic(), "0000:01:00.0", {"gpu_memory_contention": 1.0})
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            series, _ = _series(src, mappings)
            if series:
                break
            time.sleep(0.05)
        trace_ids = {dict(ls).get("trace_id") for (n, ls) in series if n == "gpu_kernel_executions"}
        assert len(trace_ids) == 1 and next(iter(trace_ids)).startswith("capture-")
        imported = [p.name for p in (tmp_path / "drop" / "imported").iterdir()]
        assert any(n.endswith(".csv") for n in imported) and any(n.endswith(".meta.json") for n in imported)
        # the capture thread counts its result after it moved the files, which the scan may import first
        while src.trigger.stats["ok"] == 0 and time.monotonic() < deadline + 15:
            time.sleep(0.05)
        assert src.trigger.stats["ok"] == 1
    finally:
        src.close()


@pytest.mark.parametrize("mode,result", [("fail", "failed"), ("nothing", "failed"), ("sleep", "timeout")])
def test_capture_failures_are_counted(tmp_path, mode, result):
    t = _trigger(tmp_path, mode, timeout=0.5)
    t0 = time.monotonic()
    res = t.run_capture("gpu0")
    assert res.result == result and res.reason
    assert time.monotonic() - t0 < 5
    assert t.stats[result] == 1
    assert not any(Path(tmp_path / "drop").glob("*.csv"))


def test_daemon_hook_groups_indicator_output_per_gpu(tmp_path, mappings):
    script = tmp_path / "argv.py"
    script.write_text("import sys\nopen(sys.argv[1] + '.txt', 'w').write(' '.join(sys.argv[2:]))\n")
    src = _source(tmp_path, mappings, trigger={"enabled": True, "for_seconds": 0, "min_interval": 0,
                                               "command": [sys.executable, str(script), "{output}", "{gpu}",
                                                           "{uuid}"]})
    try:
        dl = (("vendor", "nvidia"), ("gpu", "3"), ("uuid", "GPU-x"))
        other = (("vendor", "amd"), ("gpu", "0"), ("uuid", ""))
        out = [("gpu_memory_contention", dl + (("basis", "occupancy"),), 1.0),
               ("gpu_metric_cov", dl + (("metric", "bandwidth"),), 0.2),
               ("gpu_memory_contention", other + (("basis", "utilization"),), 0.0)]
        assert src.observe_indicator_output(100.0, frames_of({(n, labels): v for n, labels, v in out})) == 1
        deadline = time.monotonic() + 10
        while src.trigger.stats["ok"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert src.trigger.stats["ok"] == 1
        rejected = list((tmp_path / "drop" / "rejected").glob("*.txt"))
        assert len(rejected) == 1 and rejected[0].read_text() == "3 GPU-x"  # not a profile: set aside
    finally:
        src.close()
