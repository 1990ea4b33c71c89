"""Hostile input: the importer raises nothing but ProfileRejected, whatever the bytes."""

from __future__ import annotations

import gzip

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.importers.detect import import_file
from exporter.importers.model import Profile, ProfileRejected

NCU_HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Device","CC",'
            '"Section Name","Metric Name","Metric Unit","Metric Value"\n')
ROC_HEAD = '"Index","KernelName","gpu-id","DispatchNs","BeginNs","EndNs","L2CacheHit"\n'
UNI_HEAD = "Kernel,Device,SubDeviceId,GpuTime[ns],XVE_ACTIVE[%],\n"
KINETO = '{"traceEvents": ['

cell = st.one_of(st.text(max_size=12), st.sampled_from(["n/a", "1,234.5", "-1", "1e400", '"', "nan", ""]))
row = st.lists(cell, max_size=16).map(lambda cs: ",".join(cs))


def _check(path) -> None:
    try:
        prof = import_file(path)
    except ProfileRejected as exc:
        assert str(exc)
    else:
        assert isinstance(prof, Profile)


_FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_FUZZ
@given(head=st.sampled_from([NCU_HEAD, ROC_HEAD, UNI_HEAD, ""]), rows=st.lists(row, max_size=8))
def test_csv_rows_fuzz(tmp_path, head, rows):
    p = tmp_path / "f.csv"
    p.write_bytes((head + "\n".join(rows) + "\n").encode("utf-8", "surrogatepass"))
    _check(p)


json_value = st.recursive(st.one_of(st.none(), st.booleans(), st.floats(allow_nan=False), st.integers(),
                                    st.text(max_size=8)),
                          lambda ch: st.lists(ch, max_size=4) | st.dictionaries(
                              st.sampled_from(["ph", "cat", "ts", "dur", "args", "name", "pid", "tid",
                                               "correlation", "device", "stream"]), ch, max_size=6),
                          max_leaves=20)
event = st.fixed_dictionaries({"ph": st.sampled_from(["X", "s", "M", 1]),
                               "cat": st.sampled_from(["kernel", "cuda_runtime", "cuda_profiler_range",
                                                       "user_annotation", None]),
                               "name": st.sampled_from(["cudaLaunchKernel", "k", 3]),
                               "ts": st.one_of(st.floats(allow_nan=False), st.text(max_size=4), st.none()),
                               "dur": st.one_of(st.floats(allow_nan=False), st.none()),
                               "args": st.one_of(json_value, st.fixed_dictionaries(
                                   {"correlation": st.integers(0, 3), "device": st.integers(-1, 2)}))})


@_FUZZ
@given(events=st.lists(event, max_size=10), extra=json_value)
def test_kineto_fuzz(tmp_path, events, extra):
    import json
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": events, "deviceProperties": extra, "baseTimeNanoseconds": extra}))
    _check(p)


@_FUZZ
@given(data=st.binary(max_size=300), prefix=st.sampled_from([b"", b"SQLite format 3\x00", b"\x1f\x8b",
                                                             NCU_HEAD.encode(), KINETO.encode()]))
def test_arbitrary_bytes(tmp_path, data, prefix):
    p = tmp_path / "b.bin"
    p.write_bytes(prefix + data)
    _check(p)


def test_every_truncation_of_real_files(shared_fixtures, tmp_path):
    d = shared_fixtures / "profilers"
    for name in ("ncu-details-b200-cc10.0-superbench.csv", "rocprof-v1-rocm5.3-results.csv",
                 "kineto-a100-triton-cuLaunchKernel.json", "unitrace-pvc-device-timing-and-metric-query.txt",
                 "rocprofv2-via-omniperf-mi300x-tcc-pmc_perf.csv"):
        data = (d / name).read_bytes()
        for cut in range(1, len(data), max(1, len(data) // 40)):
            p = tmp_path / f"cut-{name}"
            p.write_bytes(data[:cut])
            _check(p)
    gz = (d / "nsys-2026.2.1-schema3.25.0-h100x2-trimmed.sqlite.gz").read_bytes()
    p = tmp_path / "cut.sqlite.gz"
    p.write_bytes(gz[: len(gz) // 2])  # truncated gzip stream
    with pytest.raises(ProfileRejected):
        import_file(p)
    p.write_bytes(gzip.compress(gzip.decompress(gz)[: 200_000]))  # truncated SQLite inside gzip
    _check(p)


def test_histogram_readings_are_cumulative_and_match_the_schema_buckets():
    from exporter.importers.convert import BUCKETS_MS, histogram_readings
    from exporter.map.schema import load_schema

    assert list(BUCKETS_MS) == load_schema().metrics["gpu_kernel_execution_time_milliseconds"].buckets
    out = histogram_readings([500.0, 2_000_000.0, 2_000_000.0, 3e10])  # ns: 0.0005 ms, 2 ms x2, 30 s
    buckets = {dict(lbl)["le"]: v for f, v, lbl in out if f.endswith(".bucket")}
    assert buckets["0.001"] == 1 and buckets["1"] == 1 and buckets["2.5"] == 3
    assert buckets["10000"] == 3 and buckets["+Inf"] == 4
    assert dict((f, v) for f, v, _ in out if not f.endswith(".bucket")) == {
        "kernel.duration_ms.sum": pytest.approx(0.0005 + 4 + 30000), "kernel.duration_ms.count": 4}
