"""HPC (Slurm) job mapping: both file formats, hostile files refused with a count, and the
running exporter showing a job within a refresh period and a poll of the file and dropping it as
soon after its removal (gpu_job_info, a join); renders read no file (the reader's last read).  The real Slurm run is tests/test_slurm_jobs.py."""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
import threading
import time
import types

import pytest

from exporter.enrich import hpc_jobs
from exporter.enrich.hpc_jobs import Job, Malformed, parse, read_dir
from exporter.model import DeviceId
from tests.e2e_util import ProcessSet, http_get, start_exporter, wait_until

DME = {"SLURM_JOB_ID": "4242", "SLURM_JOB_USER": "alice", "SLURM_JOB_PARTITION": "gpu",
       "SLURM_CLUSTER_NAME": "hpc1", "SLURM_JOB_GPUS": "0", "CUDA_VISIBLE_DEVICES": "0",
       "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}


# ---------------------------------------------------------------------------------- parsing

@pytest.mark.parametrize("text,jobs", [
    ("1234\n", ("1234",)),
    ("1234\n5678\n", ("1234", "5678")),  # a shared GPU: both jobs (dcgm-exporter lists both too)
    ("0\n", ()),  # "no job", written back by some epilogs
    ("", ()),  # cleared
    ("  77_3 \n\n", ("77_3",)),  # an array task, whitespace around
    ("12+1\n12+1\n", ("12+1",)),  # a heterogeneous job component, once
])
def test_dcgm_format(text, jobs):
    assert tuple(j.job_id for j in parse(text.encode())) == jobs


def test_dme_json_format():
    assert parse(json.dumps(DME).encode()) == (Job("4242", "alice", "gpu", "hpc1"),)
    # the shell prolog's own spacing (echo of a heredoc) and an idle file
    assert parse(b'{ "SLURM_JOB_ID": "9", "SLURM_JOB_USER": "bob" }\n')[0].job_user == "bob"
    assert parse(b'{"SLURM_JOB_ID": ""}') == ()


@pytest.mark.parametrize("data", [
    b"12 34\n", b"$(reboot)\n", b"a" * 65 + b"\n", b"\xff\xfe\n",
    b'{"SLURM_JOB_ID": "1"', b"[1, 2]", b'{"SLURM_JOB_ID": ["1"]}', b'{"SLURM_JOB_ID": "1", "SLURM_JOB_USER": 5}',
    b'{"SLURM_JOB_ID": "1", "SLURM_JOB_USER": "a\\nb"}', b'{"SLURM_JOB_ID": "x y"}',
    "\n".join(str(i) for i in range(1, 40)).encode(),  # more jobs on one GPU than any site has
])
def test_malformed_content_is_refused(data):
    with pytest.raises(Malformed):
        parse(data)


# ------------------------------------------------------------------------------- the directory

def test_names_and_mig_instances(tmp_path):
    (tmp_path / "0").write_text("11\n")
    (tmp_path / "1.2").write_text(json.dumps(DME))
    (tmp_path / "2").write_text("0\n")
    (tmp_path / "README").write_text("not a GPU")  # ignored, as dcgm-exporter ignores it
    (tmp_path / "sub").mkdir()
    m = read_dir(str(tmp_path))
    assert m.up and not m.refused
    assert m.jobs == {("0", ""): (Job("11"),), ("1", "2"): (Job("4242", "alice", "gpu", "hpc1"),)}
    devs: list[DeviceId] = [("nvidia", "0", "GPU-a"), ("nvidia", "1", "GPU-b"), ("amd", "0", "0xabc")]
    frames = hpc_jobs.info_series(m, devs, frozenset({"nvidia"}))
    assert frames == {
        devs[0]: {("gpu_job_info", (("job_id", "11"),)): 1.0},
        devs[1]: {("gpu_job_info", (("gpu_instance", "2"), ("job_cluster", "hpc1"), ("job_id", "4242"),
                                    ("job_partition", "gpu"), ("job_user", "alice"))): 1.0},
    }
    # without a vendor list an index names every vendor's GPU of that index
    assert set(hpc_jobs.info_series(m, devs)) == set(devs)


def test_missing_directory_is_no_job_not_an_error(tmp_path):
    m = read_dir(str(tmp_path / "absent"))
    assert not m.up and m.jobs == {} and not m.refused


def test_hostile_files_are_refused_with_a_count(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("tok3n\n")  # would read as a job id if followed
    d = tmp_path / "jobs"
    d.mkdir()
    os.symlink(secret, d / "0")
    os.mkfifo(d / "1")  # opening it for reading must not hang the render
    (d / "2").write_bytes(b"1\n" * 4000)  # above the size bound
    (d / "3").write_text("not a job id\n")
    os.link(secret, d / "4")  # a hard link to another file: its content is not ours to show
    (d / "5").mkdir()  # a directory with a GPU's name
    (d / "6").write_text("66\n")  # the one good file
    done = threading.Event()
    result = {}

    def run():
        result["m"] = read_dir(str(d))
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(20), "read_dir hung on a hostile file"
    m = result["m"]
    assert m.jobs == {("6", ""): (Job("66"),)}
    assert m.refused == {"symlink": 1, "not_regular": 3, "too_large": 1, "malformed": 1}
    assert stat.S_ISFIFO(os.lstat(d / "1").st_mode)  # untouched


def test_file_count_is_bounded(tmp_path):
    for i in range(10):
        (tmp_path / str(i)).write_text(f"{i + 100}\n")
    m = read_dir(str(tmp_path), max_files=4)
    assert len(m.jobs) == 4 and m.refused == {"too_many_files": 1}  # the read stopped there


def test_a_directory_flooded_with_other_names_is_bounded(tmp_path):
    for i in range(100):
        (tmp_path / f"junk{i}").write_text("x")
    m = read_dir(str(tmp_path), max_files=4)  # at most 32 entries looked at
    assert m.refused == {"too_many_files": 1}


# ------------------------------------------------------------------------- the running exporter

def _job_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("gpu_job_info{")]


def _last_success(text: str) -> float:
    values = [float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
              if ln.startswith("unified_gpu_exporter_source_last_success_timestamp_seconds{")]
    return min(values) if values else 0.0


REFRESH = 0.25  # enrich.hpc_jobs.refresh_seconds of the running exporters here


def scrape_after(server, t: float, ok=lambda body: True) -> str:  # noqa: ANN001
    """A /metrics rendered from a poll that ended a refresh period after ``t`` (the reader has
    read the directory since ``t`` by then, unless this busy machine held its thread back: then
    a later one) for which ``ok`` holds."""
    return wait_until(lambda: (lambda body: body if _last_success(body) > t + REFRESH and ok(body) else None)(
        http_get(server.url + "/metrics").text), 20, what=f"a poll after {t} + {REFRESH}")


@pytest.fixture
def exporter_with_jobs(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    cfg = tmp_path / "config.yml"
    cfg.write_text(f"enrich:\n  cloud: {{enabled: false}}\n  hpc_jobs:\n    directory: {jobs}\n"
                   f"    vendors: [nvidia]\n    refresh_seconds: {REFRESH}\n")
    with ProcessSet() as procs:
        server = start_exporter(procs, tmp_path, ["--simulate", "--poll.interval", "250ms",
                                                  "--config.file", str(cfg)])
        yield server, jobs


def test_a_job_appears_within_one_poll_and_leaves_within_one_poll(exporter_with_jobs):
    server, jobs = exporter_with_jobs
    body = http_get(server.url + "/metrics").text
    assert _job_lines(body) == []
    assert "unified_gpu_exporter_hpc_job_mapping_up 1.0" in body

    # dcgm-exporter's format for GPU 0, the device-metrics-exporter's JSON for a MIG instance of GPU 1
    t = time.time()
    (jobs / ".0.tmp").write_text("1001\n")
    os.replace(jobs / ".0.tmp", jobs / "0")
    (jobs / "1.3").write_text(json.dumps({**DME, "SLURM_JOB_ID": "1002"}))
    lines = _job_lines(scrape_after(server, t + 0.01, lambda b: len(_job_lines(b)) == 2))
    assert len(lines) == 2, lines
    assert any('gpu="0"' in ln and 'job_id="1001"' in ln and 'vendor="nvidia"' in ln
               and "job_user" not in ln for ln in lines)
    assert any('gpu="1"' in ln and 'gpu_instance="3"' in ln and 'job_id="1002"' in ln
               and 'job_user="alice"' in ln and 'job_partition="gpu"' in ln and 'job_cluster="hpc1"' in ln
               for ln in lines)

    # the epilogs: dcgm's writes 0 back, the JSON one deletes its file
    t = time.time()
    (jobs / "0").write_text("0\n")
    (jobs / "1.3").unlink()
    assert _job_lines(scrape_after(server, t + 0.01, lambda b: not _job_lines(b))) == []

    # a hostile file is refused and counted, the good one beside it still served
    t = time.time()
    os.mkfifo(jobs / "2")
    (jobs / "0").write_text("1003\n")
    body = scrape_after(server, t + 0.01, lambda b: 'job_id="1003"' in b)
    assert [re.search(r'job_id="(\d+)"', ln).group(1) for ln in _job_lines(body)] == ["1003"]
    refused = re.search(r'unified_gpu_exporter_hpc_job_files_refused_total\{reason="not_regular"\} (\S+)', body)
    assert refused and float(refused.group(1)) >= 1


def test_docs_name_every_refusal_reason_and_option():
    from exporter.enrich.options import HpcJobsOptions
    from tests.conftest import REPO

    text = (REPO / "docs" / "jobs.md").read_text()
    for reason in hpc_jobs.REASONS:
        assert f"`{reason}`" in text, reason
    for option in HpcJobsOptions.model_fields:
        assert f"{option}:" in text, option
    script = (REPO / "deploy" / "slurm" / "gpu-job-map.sh").read_text()
    for line in ("PrologFlags=Alloc", "Prolog=/etc/slurm/prolog.d/*", "Epilog=/etc/slurm/epilog.d/*"):
        assert line in text and line in script, line


# ------------------------------------------------------------------------------- the reader

def _options(directory, refresh: float):  # noqa: ANN001
    from exporter.enrich.options import HpcJobsOptions

    extra = {"refresh_seconds": refresh} if "refresh_seconds" in HpcJobsOptions.model_fields else {}
    return HpcJobsOptions(directory=str(directory), **extra)


def test_renders_read_the_directory_at_most_once_per_refresh_period(tmp_path, monkeypatch):
    """Renders (up to four a poll interval) serve the reader's last read, not a read each."""
    (tmp_path / "0").write_text("11\n")
    reads: list[str] = []
    real = hpc_jobs.read_dir
    monkeypatch.setattr(hpc_jobs, "read_dir", lambda d, n=256: reads.append(d) or real(d, n))

    class Store:
        def info_devices(self):
            return [("nvml", types.SimpleNamespace(id=("nvidia", "0", "GPU-a")))]

    reader = hpc_jobs.JobReader()
    reader.configure(_options(tmp_path, 600.0))  # no periodic read during the test
    try:
        for _ in range(8):
            _, info = hpc_jobs.job_info(reader, Store(), {}, {})
        assert list(info.values()) == [{("gpu_job_info", (("job_id", "11"),)): 1.0}]
        assert len(reads) == 1, reads
        reader.configure(_options(tmp_path, 600.0))  # a reload's options: read at once
        assert len(reads) == 2, reads
    finally:
        reader.configure(None)
    assert hpc_jobs.job_info(reader, Store(), {}, {}) == ({}, {})  # no section: no job served


def test_the_reader_refreshes_on_its_own_and_stops_with_the_section(tmp_path):
    options = _options(tmp_path, 0.1)
    reader = hpc_jobs.JobReader()
    try:
        reader.configure(options)
        assert reader.snapshot()[1].jobs == {}
        (tmp_path / "0").write_text("12\n")  # a prolog, no render asking
        wait_until(lambda: reader.snapshot()[1].jobs, 20, what="the reader's next read")
        assert reader.snapshot() == (options, reader.snapshot()[1])
        assert reader.snapshot()[1].jobs == {("0", ""): (Job("12"),)}
    finally:
        reader.stop()
    done = reader.reads
    time.sleep(0.3)  # three refresh periods: a stopped reader reads no more
    assert reader.reads == done


# ----------------------------------------------------------- the optional per-series hpc_job label

def test_series_label_follows_dcgm_exporters_keys(tmp_path):
    (tmp_path / "0").write_text("11\n12\n")  # a shared GPU: both jobs in one value
    (tmp_path / "1.2").write_text("21\n")  # a MIG instance of GPU 1
    m = read_dir(str(tmp_path))
    devs: list[DeviceId] = [("nvidia", "0", "GPU-a"), ("nvidia", "1", "GPU-b"), ("nvidia", "2", "GPU-c")]
    pods = {devs[0]: (("pod", "p0"),)}  # pod attribution's fixed labels for GPU 0
    labelers = hpc_jobs.series_labelers(m, devs, None, pods)
    assert set(labelers) == {devs[0], devs[1]}
    assert labelers[devs[0]](()) == (("pod", "p0"), ("hpc_job", "11,12"))
    assert labelers[devs[1]](()) == ()  # GPU 1's whole-GPU series: no job on the GPU's own file
    assert labelers[devs[1]]((("gpu_instance", "2"),)) == (("hpc_job", "21"),)
    assert labelers[devs[1]]((("gpu_instance", "3"),)) == ()
    assert labelers[devs[0]]((("job_id", "11"),)) == (("pod", "p0"),)  # gpu_job_info itself
    assert hpc_jobs.series_labelers(read_dir(str(tmp_path / "none")), devs, None, pods) is pods


def test_series_label_on_request_in_the_running_exporter(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    cfg = tmp_path / "config.yml"
    cfg.write_text(f"enrich:\n  cloud: {{enabled: false}}\n  hpc_jobs:\n    directory: {jobs}\n"
                   f"    vendors: [nvidia]\n    series_label: true\n    refresh_seconds: {REFRESH}\n")
    with ProcessSet() as procs:
        server = start_exporter(procs, tmp_path, ["--simulate", "--poll.interval", "250ms",
                                                  "--config.file", str(cfg)])
        t = time.time()
        (jobs / "0").write_text("777\n")
        body = scrape_after(server, t + 0.01, lambda b: 'hpc_job="777"' in b)
        util = [ln for ln in body.splitlines() if ln.startswith("gpu_compute_utilization_percent{")]
        labelled = [ln for ln in util if 'hpc_job="777"' in ln]
        assert labelled and all('vendor="nvidia"' in ln and 'gpu="0"' in ln for ln in labelled), util
        assert len(labelled) < len(util)  # the other GPUs' series carry none
        assert all("hpc_job" not in ln for ln in _job_lines(body))
        t = time.time()
        (jobs / "0").unlink()
        assert "hpc_job=" not in scrape_after(server, t + 0.01)


# ----------------------------------------------------------- the daemon owns the reader

def _daemon_config(path, jobs, section: bool = True) -> None:
    hpc = f"  hpc_jobs: {{directory: {jobs}, refresh_seconds: 600}}\n" if section else ""
    path.write_text("enrich:\n  cloud: {enabled: false}\n" + hpc)


def _jobs_daemon(tmp_path, interval: float):
    """A simulated daemon whose configuration maps GPU 0 to job 11 (the daemon, its config file,
    the job directory)."""
    from exporter.run.daemon import Daemon, Settings

    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "0").write_text("11\n")
    cfg = tmp_path / "config.yml"
    _daemon_config(cfg, jobs)
    return Daemon(Settings(config_path=cfg, simulate="demo", poll_interval=interval)), cfg, jobs


async def test_the_daemon_starts_the_reader_restarts_it_at_a_reload_and_stops_it_at_shutdown(tmp_path):
    """One owner: the daemon hands the reader its options before the first render (which has the
    job), a reload's options restart it (a section removed stops it) and shutdown stops its thread."""
    daemon, cfg, jobs = _jobs_daemon(tmp_path, 0.2)
    await daemon.start()
    try:
        first = daemon.enrichers.jobs.thread
        assert first is not None and first.is_alive()
        assert daemon.rendered is not None and b'gpu_job_info{' in daemon.rendered.text
        assert await daemon.reload()  # new options (the same file): a fresh reader
        second = daemon.enrichers.jobs.thread
        assert second is not first and second is not None and second.is_alive()
        wait_until(lambda: not first.is_alive(), 10, what="the replaced reader's thread to end")
        _daemon_config(cfg, jobs, section=False)
        assert await daemon.reload()
        wait_until(lambda: not second.is_alive(), 10, what="the reader of a removed section to end")
        _daemon_config(cfg, jobs)
        assert await daemon.reload()
        third = daemon.enrichers.jobs.thread
        assert third is not None and third is not second and third.is_alive()
    finally:
        await daemon.stop()
    wait_until(lambda: not third.is_alive(), 10, what="the reader's thread to end at shutdown")
    assert daemon.enrichers.jobs.snapshot()[0] is None


@pytest.mark.parametrize("fails", ["build_runtimes", "build_feed"])
async def test_a_reload_that_fails_after_the_sources_stopped_keeps_the_running_configuration(tmp_path, fails):
    """The new configuration is valid but the daemon cannot be rebuilt from it: the running
    configuration comes back whole (the job reader included), as when applying it fails."""
    daemon, cfg, jobs = _jobs_daemon(tmp_path, 0.2)
    await daemon.start()
    try:
        running, options = daemon.config, daemon.enrichers.jobs.snapshot()[0]
        assert options is running.enrich.hpc_jobs
        other = tmp_path / "other-jobs"
        other.mkdir()
        _daemon_config(cfg, other)  # other options for the reader
        real, calls = getattr(daemon, fails), []

        def once() -> None:
            calls.append(1)
            if len(calls) == 1:
                raise MemoryError("no room for the new sources")
            real()
        setattr(daemon, fails, once)
        assert not await daemon.reload()
        assert daemon.renderer is not None and daemon.renderer.reload_ok is False
        assert daemon.config is running  # kept, as the reader's options are
        assert daemon.enrichers.jobs.snapshot()[0] is daemon.config.enrich.hpc_jobs
        assert daemon.enrichers.jobs.snapshot()[0].directory == str(jobs)
        before = daemon.rendered
        for _ in range(200):  # the event loop runs the rebuilt sources meanwhile
            if daemon.rendered is not before:
                break
            await asyncio.sleep(0.05)
        assert b'job_id="11"' in daemon.rendered.text  # the running reader's job
    finally:
        await daemon.stop()


async def test_once_reads_the_jobs_and_leaves_no_reader_running(tmp_path):
    from exporter.run.oneshot import run_once

    daemon, cfg, jobs = _jobs_daemon(tmp_path, 0.05)
    text, _ = await run_once(daemon, cycles=1)
    assert b'gpu_job_info{' in text and b'job_id="11"' in text
    reader = daemon.enrichers.jobs.thread
    assert reader is not None
    wait_until(lambda: not reader.is_alive(), 10, what="the reader's thread to end after --once")
