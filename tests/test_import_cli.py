"""`unified-gpu-exporter import FILE...` (exporter.importers.cli.main)."""

from __future__ import annotations

import json

from prometheus_client.parser import text_string_to_metric_families

from exporter.importers.cli import main
from tests.conftest import require_binary
from tests.e2e_util import ProcessSet, http_get, start_node_exporter

NSYS_UUID = "GPU-554a6988-03dd-6206-3dd1-f43fb60a3ed0"  # TARGET_INFO_GPU of the torch-tiny capture


def _fx(shared_fixtures, *names):
    return [str(shared_fixtures / "profilers" / n) for n in names]


def test_text_output_is_valid_exposition(shared_fixtures, capsys):
    rc = main(_fx(shared_fixtures, "rocprofv2-via-omniperf-mi300x-tcc-pmc_perf.csv",
                  "ncu-raw-gtx1080-cc6.1-legacy-metrics.csv"))
    out = capsys.readouterr().out
    assert rc == 0
    fams = {f.name: f for f in text_string_to_metric_families(out)}
    assert not any(n.startswith("unified_gpu_exporter_") for n in fams)
    miss = {(s.labels["source"], s.labels.get("kernel", "")): s.value
            for s in fams["gpu_l2_cache_miss_rate_percent"].samples}
    assert abs(miss[("ncu", "vecAdd")] - (100 - (30.77 * 1 + 29.63 + 28.57) / 3)) < 1e-6  # equal durations
    assert miss[("rocprof", "")] < 67 and miss[("rocprof", "")] > 66


def test_json_groups_files_by_trace_id(shared_fixtures, capsys):
    rc = main(_fx(shared_fixtures, "nsys-2026.1.1-schema3.24.14-torch-tiny.sqlite",
                  "kineto-mi250-rocm6.2.json", "rocprofv3-hip_runtime_trace-sdk-2024-10.csv")
              + ["--format", "json", "--trace-id", "step-7"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert [p["tool"] for p in out["profiles"]] == ["nsys", "kineto"]
    assert [t["tool"] for t in out["traces"]["step-7"]] == ["nsys", "kineto"]
    assert out["companions"][0]["path"].endswith("hip_runtime_trace-sdk-2024-10.csv")
    nsys = out["profiles"][0]
    assert nsys["devices"][0]["launch_delay_us"]["p100"] == 184.869
    assert nsys["timeline"]["wall_zero_unix_ns"] == 1776781226557295056 + 1517727052
    kineto = out["profiles"][1]
    assert kineto["devices"][0]["vendor"] == "amd" and kineto["devices"][0]["kernel_executions"] == 14
    assert kineto["timeline"]["ranges"][0]["name"] == "ProfilerStep#1"
    assert any(s["name"] == "gpu_kernel_launch_latency_seconds" and s["labels"]["source"] == "kineto"
               for s in out["series"])


def test_rejected_file_sets_exit_status(tmp_path, shared_fixtures, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("x,y\n")
    rc = main(_fx(shared_fixtures, "rocprof-v1-rocm5.3-results.csv") + [str(bad), str(tmp_path / "missing")])
    captured = capsys.readouterr()
    assert rc == 1
    assert "bad.csv: unrecognised format" in captured.err and "missing: unreadable" in captured.err
    assert "gpu_kernel_execution_time_percentile_milliseconds" in captured.out


def test_usage_errors(capsys):
    assert main([]) == 2
    assert main(["x", "--trace-id", "bad id!"]) == 2


def test_text_output_carries_only_imported_series(tmp_path, shared_fixtures, capsys):
    """No process_* metrics of the command itself (node_exporter's textfile collector would see
    them twice); nothing at all when every input is rejected."""
    rc = main(_fx(shared_fixtures, "rocprofv3-kernel_trace-sdk-2024-10.csv"))
    out = capsys.readouterr().out
    assert rc == 0
    names = {f.name for f in text_string_to_metric_families(out)}
    assert names and all(n.startswith("gpu_") for n in names), names
    bad = tmp_path / "bad.csv"
    bad.write_text("not,a,profile\n1,2,3\n")
    assert main([str(bad)]) == 1
    assert capsys.readouterr().out == ""


def test_stderr_says_what_each_file_gave_and_warns_on_a_file_that_gives_no_series(shared_fixtures, capsys):
    rc = main(_fx(shared_fixtures, "rocprofv3-kernel_trace-sdk-2024-10.csv",
                  "rocprofv3-counter_collection-sdk-2024-10.csv"))
    err = capsys.readouterr().err.splitlines()
    assert rc == 0
    (good,) = [ln for ln in err if "kernel_trace-sdk-2024-10.csv" in ln]
    assert good.startswith("imported: ") and "gpu_kernel_execution_time_milliseconds" in good
    (nothing,) = [ln for ln in err if "counter_collection-sdk-2024-10.csv" in ln]
    assert nothing.startswith("warning: ") and "no series the canonical schema maps" in nothing


def test_every_flag_has_help_and_the_limits_are_flags(shared_fixtures, capsys):
    """The child's limits (issue 26) were fixed at the daemon's defaults: a file past one of them
    could not be imported at all from the command line."""
    from exporter.importers.cli import build_parser
    undocumented = [a.option_strings or [a.dest] for a in build_parser()._actions if not a.help]
    assert undocumented == []
    kineto = _fx(shared_fixtures, "kineto-mi250-rocm6.2.json")
    assert main(kineto + ["--max-events", "5"]) == 1  # lowered: rejected, naming the limit
    assert "above max_events_per_import (5)" in capsys.readouterr().err
    assert main(kineto + ["--max-series", "3"]) == 1
    assert "above max_series_per_import (3)" in capsys.readouterr().err
    assert main(kineto + ["--import-memory-bytes", str(1 << 30), "--import-cpu-seconds", "120",
                          "--import-timeout", "300", "--max-events", "2000000", "--max-series", "50000",
                          "--max-devices", "64"]) == 0  # raised
    capsys.readouterr()
    assert main(kineto + ["--import-memory-bytes", "1000"]) == 2  # below what a child needs
    assert "at least 67108864" in capsys.readouterr().err


def _gpus(fams) -> dict[tuple[str, str], set[str]]:
    """(source, uuid) -> gpu labels of the imported series."""
    out: dict[tuple[str, str], set[str]] = {}
    for fam in fams.values():
        for s in fam.samples:
            out.setdefault((s.labels["source"], s.labels.get("uuid", "")), set()).add(s.labels["gpu"])
    return out


def test_text_output_names_the_real_gpu_and_never_a_phantom_one(shared_fixtures, capsys):
    """No gpu_info (it gave uuid="" and a placeholder model such as "compute capability 10.0":
    node_exporter's textfile collector then served a GPU the node does not have, and even with
    the artifact's UUID a second gpu_info counts the GPU twice); the series carry the UUID where
    the artifact records it (nsys), only vendor and gpu where it does not, and stderr says which."""
    rc = main(_fx(shared_fixtures, "nsys-2026.1.1-schema3.24.14-torch-tiny.sqlite",
                  "ncu-details-b200-cc10.0-superbench.csv", "kineto-mi250-rocm6.2.json"))
    cap = capsys.readouterr()
    assert rc == 0
    fams = {f.name: f for f in text_string_to_metric_families(cap.out)}
    assert "gpu_info" not in fams
    assert _gpus(fams) == {("nsys", NSYS_UUID): {"0"}, ("ncu", ""): {"0"}, ("kineto", ""): {"2"}}
    (nsys,) = [ln for ln in cap.err.splitlines() if "torch-tiny" in ln]
    assert f'gpu="0" uuid="{NSYS_UUID}" (NVIDIA GeForce RTX 3080)' in nsys
    (ncu,) = [ln for ln in cap.err.splitlines() if "b200" in ln]
    assert 'gpu="0" (compute capability 10.0), no UUID in the file' in ncu


def test_textfile_collector_serves_the_import_without_a_phantom_gpu(tmp_path, shared_fixtures, capsys):
    """The output as the README says to use it: node_exporter's textfile collector (the real
    binary) serves the imported series, no gpu_info and no textfile error."""
    binary = require_binary("prometheus-node-exporter", "prometheus-node-exporter")
    assert main(_fx(shared_fixtures, "nsys-2026.1.1-schema3.24.14-torch-tiny.sqlite",
                    "ncu-details-b200-cc10.0-superbench.csv")) == 0
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    (textfiles / "profiles.prom").write_text(capsys.readouterr().out)
    with ProcessSet() as procs:
        node = start_node_exporter(procs, binary, tmp_path, extra=(
            "--collector.disable-defaults", "--collector.textfile",
            f"--collector.textfile.directory={textfiles}"))
        scraped = http_get(f"{node.url}/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(scraped)}
    assert fams["node_textfile_scrape_error"].samples[0].value == 0
    assert "gpu_info" not in fams
    gpus = _gpus({n: f for n, f in fams.items() if n.startswith("gpu_")})
    assert gpus == {("nsys", NSYS_UUID): {"0"}, ("ncu", ""): {"0"}}
