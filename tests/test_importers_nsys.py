"""Nsight Systems SQLite import: the two real exports, truncated and foreign SQLite files."""

from __future__ import annotations

import sqlite3

import pytest

from exporter.importers.detect import import_file
from exporter.importers.model import ProfileRejected, quantile


@pytest.fixture
def tiny(shared_fixtures):
    return shared_fixtures / "profilers" / "nsys-2026.1.1-schema3.24.14-torch-tiny.sqlite"


def test_torch_tiny_export(tiny):
    prof = import_file(tiny)
    assert prof.variant == "nsys sqlite schema 3.24.14"
    assert [k.name for k in prof.kernels] == ["vectorized_elementwise_kernel", "reduce_kernel"]
    # HTA launch delay = kernel.start - (api.start + api.dur): 18,982 ns and 184,869 ns (fixture notes)
    assert [k.launch_delay_ns for k in prof.kernels] == [18982, 184869]
    assert [k.duration_ns for k in prof.kernels] == [1440, 2689]
    dev = prof.devices["0"]
    assert dev.uuid == "GPU-554a6988-03dd-6206-3dd1-f43fb60a3ed0"
    assert dev.model == "NVIDIA GeForce RTX 3080" and dev.pci_bus_id == "0000:01:00.0"
    assert prof.queue_length_max == {"0": 1}
    assert prof.wall_zero_ns == 1776781226557295056  # TARGET_INFO_SESSION_START_TIME.utcEpochNs


def test_h100_trimmed_export_kernel_count_and_launch_delay_distribution(shared_fixtures):
    prof = import_file(shared_fixtures / "profilers" / "nsys-2026.2.1-schema3.25.0-h100x2-trimmed.sqlite.gz")
    assert prof.variant == "nsys sqlite schema 3.25.0"
    assert len(prof.kernels) == 3442
    assert sorted(prof.devices) == ["0", "1"]
    delays = sorted(k.launch_delay_ns for k in prof.kernels if k.launch_delay_ns is not None)
    assert len(delays) == 1632  # 1,810 kernels were launched before the trimmed window
    assert any("1810 of 3442" in w for w in prof.warnings)
    # the CPU ran ~0.4 s ahead of the GPU: the queueing shows in the launch delay
    assert quantile(delays, 0.5) == pytest.approx(421.3e6, rel=1e-3)
    assert max(delays) == 438826023
    assert sum(delays) / len(delays) == pytest.approx(366.8e6, rel=1e-3)
    assert prof.queue_length_max == {"0": 597, "1": 597}
    assert len(prof.ranges) == 16782  # NVTX push/pop and start/end ranges


def test_truncated_sqlite_is_rejected_not_raised(tiny, tmp_path):
    data = tiny.read_bytes()
    for cut in (100, 4096, len(data) // 2, len(data) - 1000):
        p = tmp_path / f"cut{cut}.sqlite"
        p.write_bytes(data[:cut])
        try:
            prof = import_file(p)
        except ProfileRejected as exc:
            assert str(exc)
        else:  # SQLite may still read what the cut left intact: then the data must be sane
            assert prof.tool == "nsys"


def _db(tmp_path, sql: str):
    p = tmp_path / "x.sqlite"
    db = sqlite3.connect(p)
    db.executescript(sql)
    db.commit()
    db.close()
    return p


@pytest.mark.parametrize("sql,reason", [
    ("CREATE TABLE StringTable(_id_ INTEGER, value TEXT);", "nvprof"),
    ("CREATE TABLE rocpd_kernel_dispatch(id INTEGER);", "rocpd"),
    ("CREATE TABLE foo(a);", "not an nsys export"),
    ("CREATE TABLE META_DATA_EXPORT(name TEXT, value TEXT);"
     "INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', '2.9.0');", "only major version 3"),
    ("CREATE TABLE META_DATA_EXPORT(name TEXT, value TEXT);"
     "INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', '3.24.14');", "no CUPTI_ACTIVITY_KIND_KERNEL"),
])
def test_foreign_or_unsupported_sqlite(tmp_path, sql, reason):
    with pytest.raises(ProfileRejected, match=reason):
        import_file(_db(tmp_path, sql))


def test_minimal_export_with_optional_tables_missing(tmp_path):
    p = _db(tmp_path, """
        CREATE TABLE META_DATA_EXPORT(name TEXT, value TEXT);
        INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', '3.30.0');
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL(start INT, end INT, deviceId INT, streamId INT, demangledName INT);
        INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (100, 300, 0, 7, 5), (400, 500, 0, 7, 5);
    """)
    prof = import_file(p)
    assert [k.duration_ns for k in prof.kernels] == [200, 100]
    assert all(k.launch_delay_ns is None for k in prof.kernels)
    assert any("newer than the tested" in w for w in prof.warnings)
