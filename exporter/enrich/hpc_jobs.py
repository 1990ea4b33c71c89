"""Slurm (HPC) jobs on the GPUs: the mapping directory a job's prolog writes and its epilog clears.

Two formats, so a site keeps the prolog/epilog it has (docs/jobs.md):

- dcgm-exporter's (``--hpc-job-mapping-dir``): one file per GPU named by its index (``0``) or
  ``<gpu>.<gpu_instance>`` for a MIG instance (``2.1``), each line a job id; ``0`` (written back by
  some epilogs) and an empty file mean "no job".  Other names and directories are ignored, as
  dcgm-exporter ignores them.
- AMD device-metrics-exporter's (``/var/run/exporter/<gpu>``): the same names, the content one
  JSON object with ``SLURM_JOB_ID``, ``SLURM_JOB_USER``, ``SLURM_JOB_PARTITION``,
  ``SLURM_CLUSTER_NAME`` (its epilog deletes the file).

The content decides the format, file by file.  The directory is input another user may write:
every file is read through ``safefile`` (a symlink is never followed, a FIFO or device is
refused, at most ``MAX_FILE_BYTES`` are read), at most ``max_files`` names are looked at, and
a file that is refused or does not parse is skipped and counted by reason
(``unified_gpu_exporter_hpc_job_files_refused_total``).  ``JobReader`` reads the directory every
``refresh_seconds`` on its own thread (and at once after a load or reload; the daemon owns it:
``exporter/run/enrichers.py``) and renders serve its last read, so a job appears within ``refresh_seconds`` and one poll of its prolog and leaves as
soon after its epilog; nothing is remembered between reads, so no job outlives its file by more.

What is served is a join, one ``gpu_job_info`` series per GPU (or MIG instance) and job, never a
copy of every series per job.
"""

from __future__ import annotations

import errno
import json
import os
import re
import threading
from collections import Counter
from dataclasses import dataclass

from .. import safefile
from ..model import DeviceId, Frames, Labels

NAME_RE = re.compile(r"^(\d{1,4})(?:\.(\d{1,4}))?$")  # dcgm-exporter's ^\d+(\.\d+)?$, bounded
# Slurm job ids: 123, array tasks 123_4, heterogeneous components 123+1
JOB_ID_RE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z_.+-]{0,63}$")
VALUE_RE = re.compile(r"^[\x20-\x7e]{0,128}$")  # user, partition, cluster: printable ASCII, bounded
MAX_FILE_BYTES = 4096
MAX_JOBS_PER_FILE = 16  # a GPU shared by more jobs than this is a writer's bug, not a site
REASONS = ("symlink", "not_regular", "too_large", "malformed", "unreadable", "too_many_files")
# safefile's refusals: a symlink, not a regular file, a hard link (another file's content)
_REFUSED = {errno.ELOOP: "symlink", errno.EINVAL: "not_regular", errno.EMLINK: "not_regular"}
JSON_FIELDS = (("job_user", "SLURM_JOB_USER"), ("job_partition", "SLURM_JOB_PARTITION"),
               ("job_cluster", "SLURM_CLUSTER_NAME"))

# self-metric name (after unified_gpu_exporter_) -> (type, help); exporter/render/exposition.py serves them
HELP: dict[str, tuple[str, str]] = {
    "hpc_job_files_refused_total": (
        "counter", "Files of the HPC job mapping directory (enrich.hpc_jobs) skipped, by reason: symlink "
                   "(never followed), not_regular (a FIFO, device, socket or directory with a GPU's name), "
                   "too_large, malformed (not a job id per line nor a JSON object with SLURM_JOB_ID), "
                   "unreadable, too_many_files (the read stopped after max_files GPU names or 8 x max_files "
                   "entries). Counted on every read of the directory (every refresh_seconds)."),
    "hpc_job_mapping_up": (
        "gauge", "1 when the HPC job mapping directory (enrich.hpc_jobs) was read on its last read, 0 when "
                 "it is missing or cannot be opened (then no GPU shows a job)."),
}


class Malformed(ValueError):
    """A mapping file that is neither format."""


@dataclass(frozen=True)
class Job:
    job_id: str
    job_user: str = ""
    job_partition: str = ""
    job_cluster: str = ""

    def labels(self) -> tuple[tuple[str, str], ...]:
        """The job's labels, an empty one left off (a dcgm-format file names only the job)."""
        return tuple((k, v) for k, v in (("job_id", self.job_id), ("job_user", self.job_user),
                                         ("job_partition", self.job_partition),
                                         ("job_cluster", self.job_cluster)) if v)


def parse(data: bytes) -> tuple[Job, ...]:
    """The jobs one mapping file names (none: no job); raises Malformed."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise Malformed("not UTF-8") from None
    body = text.strip()
    if body.startswith("{"):
        return _parse_json(body)
    jobs: list[Job] = []
    for line in body.splitlines():
        job_id = line.strip()
        if not job_id or job_id == "0":  # "0": no job (written back by some epilogs)
            continue
        if not JOB_ID_RE.match(job_id):
            raise Malformed(f"not a job id: {job_id[:40]!r}")
        if all(j.job_id != job_id for j in jobs):
            jobs.append(Job(job_id))
    if len(jobs) > MAX_JOBS_PER_FILE:
        raise Malformed(f"{len(jobs)} jobs on one GPU (at most {MAX_JOBS_PER_FILE})")
    return tuple(jobs)


def _parse_json(body: str) -> tuple[Job, ...]:
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        raise Malformed("not valid JSON") from None
    if not isinstance(obj, dict):
        raise Malformed("JSON that is not an object")
    job_id = obj.get("SLURM_JOB_ID", "")
    if isinstance(job_id, int) and not isinstance(job_id, bool):
        job_id = str(job_id)
    if not isinstance(job_id, str):
        raise Malformed("SLURM_JOB_ID is not a string")
    if job_id in ("", "0"):
        return ()
    if not JOB_ID_RE.match(job_id):
        raise Malformed(f"SLURM_JOB_ID is not a job id: {job_id[:40]!r}")
    fields = {}
    for label, key in JSON_FIELDS:
        value = obj.get(key, "")
        if not isinstance(value, str) or not VALUE_RE.match(value):
            raise Malformed(f"{key} is not a short printable string")
        fields[label] = value
    return (Job(job_id, **fields),)


@dataclass
class Mapping:
    """One read of the directory: jobs per (gpu index, gpu_instance or "")."""

    jobs: dict[tuple[str, str], tuple[Job, ...]]
    refused: Counter
    up: bool


def read_dir(directory: str, max_files: int = 256) -> Mapping:
    """Read the mapping directory once.  A missing directory is no job anywhere (up false)."""
    refused: Counter = Counter()
    out: dict[tuple[str, str], tuple[Job, ...]] = {}
    try:
        dir_fd = safefile.open_dir(directory)
    except OSError:
        return Mapping(out, refused, False)
    try:
        return _read_entries(dir_fd, max_files, out, refused)
    except OSError:  # the listing itself failed (the directory removed under us, EIO)
        return Mapping(out, refused, False)
    finally:
        os.close(dir_fd)


def _read_entries(dir_fd: int, max_files: int, out: dict, refused: Counter) -> Mapping:
    """The GPU files of the open directory ``dir_fd`` into ``out``, refusals into ``refused``."""
    seen = entries = 0
    with os.scandir(dir_fd) as it:
        for entry in it:
            entries += 1
            m = NAME_RE.match(entry.name)
            if m is not None:
                seen += 1
            if seen > max_files or entries > 8 * max_files:  # a flooded directory: the read stops here
                refused["too_many_files"] += 1
                break
            if m is None:
                continue  # not a GPU's file (dcgm-exporter ignores these too)
            try:
                data = safefile.read_at(dir_fd, entry.name, MAX_FILE_BYTES, single_link=True)
                jobs = parse(bytes(data))
            except FileNotFoundError:
                continue  # cleared between the listing and the read: no job
            except safefile.TooLarge:
                refused["too_large"] += 1
                continue
            except safefile.Refused as exc:
                refused[_REFUSED.get(exc.errno or 0, "unreadable")] += 1
                continue
            except Malformed:
                refused["malformed"] += 1
                continue
            except OSError as exc:
                # a directory with a GPU's name: O_NOFOLLOW|O_RDONLY opens it, fstat refuses it
                refused["not_regular" if exc.errno == errno.EISDIR else "unreadable"] += 1
                continue
            if jobs:
                out[(m.group(1), m.group(2) or "")] = jobs
    return Mapping(out, refused, True)


def info_series(mapping: Mapping, devices: list[DeviceId], vendors: frozenset[str] | None = None) -> Frames:
    """``gpu_job_info`` series: one per GPU (or MIG instance) and job.  A file's name is the
    GPU's index, the ``gpu`` label; ``vendors`` limits which GPUs an index names (a node with
    GPUs of two vendors has two GPUs 0)."""
    by_index: dict[str, list[DeviceId]] = {}
    for dev in devices:  # (vendor, gpu, uuid)
        if vendors is None or dev[0] in vendors:
            by_index.setdefault(dev[1], []).append(dev)
    frames: Frames = {}
    for (gpu, instance), jobs in mapping.jobs.items():
        for dev in by_index.get(gpu, ()):
            rows = frames.setdefault(dev, {})
            for job in jobs:
                labels = job.labels() + ((("gpu_instance", instance),) if instance else ())
                rows[("gpu_job_info", tuple(sorted(labels)))] = 1.0
    return frames


class JobStats:
    """What the reads counted, for the self-metrics (written by ``JobReader``)."""

    def __init__(self) -> None:
        self.enabled = False
        self.up = False
        self.refused: Counter = Counter()
        self._lock = threading.Lock()

    def add(self, mapping: Mapping) -> None:
        with self._lock:
            self.enabled, self.up = True, mapping.up
            self.refused.update(mapping.refused)

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        if not self.enabled:
            return []
        with self._lock:
            out = [("hpc_job_files_refused_total", {"reason": r}, float(self.refused[r])) for r in REASONS]
            out.append(("hpc_job_mapping_up", {}, 1.0 if self.up else 0.0))
        return out


STATS = JobStats()


class JobLabeler:
    """dcgm-exporter's per-series ``hpc_job`` label, only with ``enrich.hpc_jobs.series_label``:
    a MIG instance's series (``gpu_instance``) get the jobs of its ``<gpu>.<gpu_instance>`` file,
    the GPU's other series the jobs of its ``<gpu>`` file; several jobs are joined with "," (one
    label value, where dcgm-exporter copies the series once per job).  Composes with pod
    attribution's labeler of the same GPU (``inner``)."""

    __slots__ = ("whole", "by_gi", "inner")

    def __init__(self, whole: Labels, by_gi: dict[str, Labels], inner) -> None:  # noqa: ANN001 - DeviceLabels | None
        self.whole, self.by_gi, self.inner = whole, by_gi, inner

    def __call__(self, labels: Labels) -> Labels:
        base = (self.inner(labels) if callable(self.inner) else self.inner) or ()
        gi = None
        for k, v in labels:
            if k == "job_id":
                return base  # gpu_job_info names its job already
            if k == "gpu_instance":
                gi = v
        mine = self.by_gi.get(gi, ()) if gi is not None else self.whole
        return base + mine if mine else base


def series_labelers(mapping: Mapping, devices: list[DeviceId], vendors: frozenset[str] | None,
                    per_device: dict) -> dict:
    """``per_device`` (pod attribution's labelers) with a ``JobLabeler`` on every GPU a job holds."""
    jobs: dict[DeviceId, tuple[Labels, dict[str, Labels]]] = {}
    for dev in devices:
        if vendors is not None and dev[0] not in vendors:
            continue
        for (gpu, instance), listed in mapping.jobs.items():
            if gpu != dev[1]:
                continue
            whole, by_gi = jobs.setdefault(dev, ((), {}))
            label = (("hpc_job", ",".join(j.job_id for j in listed)),)
            if instance:
                by_gi[instance] = label
            else:
                jobs[dev] = (label, by_gi)
    if not jobs:
        return per_device
    out = dict(per_device)
    for dev, (whole, by_gi) in jobs.items():
        out[dev] = JobLabeler(whole, by_gi, per_device.get(dev))
    return out


class JobReader:
    """Reads the mapping directory every ``refresh_seconds`` on its own thread, so a render (up
    to four a poll interval) reads no file: it takes the last ``Mapping``.  Its owner (the
    daemon: ``exporter/run/enrichers.py``) hands it the options of every (re)load: new options
    start a fresh reader that reads once at once, so the first render has the jobs; None (no
    section) or ``stop`` stops it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._options = None  # the HpcJobsOptions being read
        self._stop: threading.Event | None = None
        self._mapping = Mapping({}, Counter(), False)
        self.thread: threading.Thread | None = None  # the running reader's
        self.reads = 0

    def configure(self, options) -> None:  # noqa: ANN001 - HpcJobsOptions | None
        """Read ``options.directory`` from now on (at once when ``options`` are new); None: stop,
        and no self-metrics (no section, any more after a reload)."""
        with self._lock:
            if options is self._options:
                return
            self._halt()
            if options is None:
                STATS.enabled = False
                return
            self._options, stop = options, threading.Event()
            self._stop = stop
            self._keep(read_dir(options.directory, options.max_files))
            self.thread = threading.Thread(target=self._loop, args=(options, stop), name="hpc-jobs", daemon=True)
            self.thread.start()

    def snapshot(self):  # noqa: ANN201 - (HpcJobsOptions | None, Mapping)
        """The options being read and their last read."""
        with self._lock:
            return self._options, self._mapping

    def _loop(self, options, stop: threading.Event) -> None:  # noqa: ANN001
        while not stop.wait(options.refresh_seconds):
            mapping = read_dir(options.directory, options.max_files)  # a render never waits for it
            with self._lock:
                if stop.is_set():
                    return  # replaced (a reload) or stopped meanwhile: not served, not counted
                self._keep(mapping)

    def _keep(self, mapping: Mapping) -> None:
        STATS.add(mapping)
        self._mapping, self.reads = mapping, self.reads + 1

    def _halt(self) -> None:
        if self._stop is not None:
            self._stop.set()
        self._options, self._stop = None, None

    def stop(self) -> None:
        self.configure(None)


def job_info(reader: JobReader, store, per_device: dict, info: Frames) -> tuple[dict, Frames]:  # noqa: ANN001
    """Pod attribution's (labelers, gpu_pod_info series) with the ``gpu_job_info`` series of the
    GPUs in ``store``, from ``reader``'s last read (nothing while it reads nothing), and with
    ``series_label`` the ``hpc_job`` labelers."""
    options, mapping = reader.snapshot()
    if options is None:
        return per_device, info
    vendors = frozenset(options.vendors) if options.vendors else None
    devices = [dev.id for _, dev in store.info_devices()]
    if options.series_label:
        per_device = series_labelers(mapping, devices, vendors, per_device)
    jobs = info_series(mapping, devices, vendors)
    if not info:
        return per_device, jobs
    return per_device, {d: {**info.get(d, {}), **jobs.get(d, {})} for d in info.keys() | jobs.keys()}
