"""Nsight Compute CSV import: real fixtures (details + raw pages) and hand-written variants."""

from __future__ import annotations

import pytest

from exporter.importers.detect import import_file
from exporter.importers.model import ProfileRejected, normalize_unit, parse_number
from exporter.importers.ncu_csv import memory_stall_percent

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
          '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')
PREFIX = '"0","1","app","h","gemv_kernel","1","7","(128, 1, 1)","(64, 1, 1)","0","12.0"'


def _details(tmp_path, rows: list[str], preamble: str = "") -> str:
    p = tmp_path / "k.ncu.csv"
    p.write_text(preamble + HEADER + "\n" + "\n".join(rows) + "\n")
    return str(p)


def test_superbench_b200_details_page(shared_fixtures):
    prof = import_file(shared_fixtures / "profilers" / "ncu-details-b200-cc10.0-superbench.csv")
    assert prof.variant == "ncu csv --page details"
    assert len(prof.kernels) == 1  # the ==PROF== preamble and app stdout are skipped
    k = prof.kernels[0]
    assert k.name.startswith("cutlass3x_sm100_tensorop")
    assert k.duration_ns == 406240
    assert k.counters["dram__throughput.avg.pct_of_peak_sustained_elapsed"] == pytest.approx(0.74)
    assert k.counters["sm__warps_active.avg.pct_of_peak_sustained_active"] == pytest.approx(15.53)
    assert k.counters["gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"] == pytest.approx(21.68)
    assert k.counters["smsp__cycles_elapsed.avg.per_second"] == pytest.approx(1239496049.13)
    assert prof.devices["0"].model == "compute capability 10.0"


def test_gtx1080_raw_page_legacy_names(shared_fixtures):
    prof = import_file(shared_fixtures / "profilers" / "ncu-raw-gtx1080-cc6.1-legacy-metrics.csv")
    assert prof.variant == "ncu csv --page raw"
    assert [k.name for k in prof.kernels] == ["vecAdd"] * 3
    k0 = prof.kernels[0]
    assert k0.duration_ns == 2720  # "2,720.00" nsecond
    assert k0.counters["dram__read_bytes"] == 7552  # "7,552.00"
    assert [k.counters["lts__t_sector_hit_rate.pct"] for k in prof.kernels] == [30.77, 29.63, 28.57]
    # memory stalls (long+short scoreboard, drain, imc_miss) 44.44 over 93.63 stall cycles/issue
    assert k0.counters["derived__memory_stall_pct"] == pytest.approx(100 * 44.44 / 93.63, rel=1e-4)
    assert not any(c.startswith("device__attribute") for c in k0.counters)


def test_autoscaled_units_separators_and_na(tmp_path):
    # the shape of `ncu --csv --page details --import` without --print-units base (CC 12.0)
    rows = [
        PREFIX + ',"GPU Speed Of Light Throughput","Duration","us","6.75"',
        PREFIX + ',"GPU Speed Of Light Throughput","Elapsed Cycles","cycle","13,485"',
        PREFIX + ',"GPU Speed Of Light Throughput","SM Frequency","Ghz","1.99"',
        PREFIX + ',"GPU Speed Of Light Throughput","DRAM Throughput","%","19.66"',
        PREFIX + ',"Memory Workload Analysis","Memory Throughput","Gbyte/s","2.33"',
        PREFIX + ',"Memory Workload Analysis","L2 Hit Rate","%","27.66"',
        PREFIX + ',"Command line profiler metrics","dram__bytes_read.sum","Mbyte","2.33"',
        PREFIX + ',"Command line profiler metrics","dram__bytes_write.sum","byte","0"',
        PREFIX + ',"Command line profiler metrics","lts__t_sectors_srcunit_tex.sum","sector","n/a"',
        PREFIX + ',"Occupancy","Achieved Occupancy","%","11.32"',
    ]
    prof = import_file(_details(tmp_path, rows, preamble="==PROF== Connected to process 1\nhello\n"))
    c = prof.kernels[0].counters
    assert prof.kernels[0].duration_ns == pytest.approx(6750)
    assert c["sm__cycles_elapsed.max"] == 13485
    assert c["smsp__cycles_elapsed.avg.per_second"] == pytest.approx(1.99e9)
    assert c["dram__bytes.sum.per_second"] == pytest.approx(2.33e9)  # MWA "Memory Throughput" is a rate
    assert c["dram__bytes_read.sum"] == pytest.approx(2.33e6)
    assert c["lts__t_sector_hit_rate.pct"] == pytest.approx(27.66)
    assert "lts__t_sectors_srcunit_tex.sum" not in c  # n/a is absent, not 0


def test_shifted_columns_are_skipped_with_a_warning(tmp_path):
    rows = [PREFIX + ',"Occupancy","Achieved Occupancy","%","50"',
            '"0","1","app","h","gemv_kernel","1","7"',  # truncated row
            '"x","0","1","app","h","gemv_kernel","1","7","(1,1,1)","(1,1,1)","0","12.0","Occupancy","a","%","1"']
    prof = import_file(_details(tmp_path, rows))
    assert prof.kernels[0].counters["sm__warps_active.avg.pct_of_peak_sustained_active"] == 50
    assert any("shifted" in w for w in prof.warnings)


def test_header_without_metric_rows_is_rejected(tmp_path):
    with pytest.raises(ProfileRejected, match="no kernel rows"):
        import_file(_details(tmp_path, []))


@pytest.mark.parametrize("text,value", [("13,485", 13485), ("7,552.00", 7552), ("n/a", None), ("", None),
                                        ("1.234,5", 1234.5), ("2,5", 2.5), ("8.1097E+14", 8.1097e14),
                                        ("1,2,3", None), ("nan", None), ("inf", None)])
def test_parse_number(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize("unit,value", [("Kbyte", 1e3), ("Mbyte", 1e6), ("Gbyte/second", 1e9), ("usecond", 1e3),
                                        ("msecond", 1e6), ("Mhz", 1e6), ("nsecond", 1), ("cycle", 1)])
def test_normalize_unit(unit, value):
    assert normalize_unit(1.0, unit)[0] == value


def test_memory_stall_percent_ignores_selected_and_prefers_modern_names():
    c = {"smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": 3.0,
         "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio": 1.0,
         "smsp__average_warps_issue_stalled_selected_per_issue_active.ratio": 1.0,
         "smsp__warp_cycles_per_issue_stall_wait": 100.0}
    assert memory_stall_percent(c) == pytest.approx(75.0)
    assert memory_stall_percent({}) is None
