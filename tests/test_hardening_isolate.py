"""Issue 26 (second audit): what parsing an artifact costs never lands on the daemon.

Each artifact is parsed in a child process with kernel-enforced limits (exporter/importers/
isolate.py).  The bombs run with the default limits inside a bounded "daemon" process
(tests/bounded.py: 1 GiB of address space, a timeout), which measures its own peak RSS and its
children's: without the child process the daemon itself would hold the bomb."""

from __future__ import annotations

import gzip
import json
import os
import sqlite3
import textwrap
import time
from pathlib import Path

import pytest

from exporter.importers import isolate, nsys_sqlite
from exporter.importers.dropdir import DropDir
from exporter.importers.isolate import Importer, ImportLimits
from exporter.importers.model import ProfileRejected
from exporter.importers.profiles_source import ProfilesSource
from exporter.map.mapping import MappingSet
from exporter.map.schema import default_mappings_dir, load_schema
from exporter.sources.context import SourceContext
from tests.bounded import run_bounded
from tests.e2e_util import children

MiB = 1 << 20


def _member(data: bytes) -> bytes:
    return gzip.compress(data, 9)


def zeros_bomb(path: Path, mib: int) -> Path:
    """``{"traceEvents":[0,0,...]}`` of about ``mib`` MiB, as gzip members of 1 MiB each (built
    without ever holding the content: about 1 KB of gzip per MiB)."""
    one = _member(b"0," * (MiB // 2))
    with open(path, "wb") as f:
        f.write(_member(b'{"traceEvents":['))
        for _ in range(mib):
            f.write(one)
        f.write(_member(b"0]}"))
    return path


def table_only_nsys(path: Path, rows: int) -> Path:
    """An nsys export with nothing but tables: a kernel table of ``rows`` rows."""
    db = sqlite3.connect(path)
    db.executescript(f"""
        CREATE TABLE META_DATA_EXPORT(name TEXT, value TEXT);
        INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', '3.24.14');
        CREATE TABLE StringIds(id INTEGER PRIMARY KEY, value TEXT);
        INSERT INTO StringIds VALUES (1, 'gemm_kernel');
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL(start INT, end INT, deviceId INT, streamId INT,
                                                correlationId INT, globalPid INT, shortName INT);
        WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < {rows})
        INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL SELECT n * 1000, n * 1000 + 500, 0, 7, n, 16777216, 1 FROM r;
    """)
    db.commit()
    db.close()
    return path


def _gzip_file(src: Path, dst: Path) -> Path:
    with open(src, "rb") as i, gzip.open(dst, "wb", 1) as o:
        while chunk := i.read(MiB):
            o.write(chunk)
    src.unlink()
    return dst


# the "daemon": the profiles source with its default limits, one scan of the drop directory
DAEMON = textwrap.dedent("""\
    import json, resource, sys
    from pathlib import Path
    from exporter.importers.profiles_source import ProfilesSource
    from exporter.sources.context import SourceContext
    drop = Path(sys.argv[1])
    src = ProfilesSource(SourceContext(options={"dir": str(drop), "settle": 0, "scan_interval": 3600,
                                                "restore": False}))
    src.open()
    try:
        imported = src.scan_once()
        errors = dict(src.poll().errors)
    finally:
        src.close()
    # the peak RSS of this process image (VmHWM): getrusage's maxrss survives fork and exec, so it
    # would carry the RSS of the pytest process that started this one
    hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print(json.dumps({"imported": imported, "errors": errors,
                      "rss": hwm * 1024,
                      "child_rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
                      "reasons": [p.read_text() for p in (drop / "rejected").glob("*.reason")]}))
    """)


def _daemon_scan(drop: Path) -> dict:
    res = run_bounded(DAEMON, str(drop), timeout=55)
    assert res.ok, res
    return json.loads(next(line for line in res.out.splitlines() if line.startswith('{"imported"')))


def test_gzip_zero_list_bomb_is_rejected_for_memory_and_the_daemon_stays_small(tmp_path):
    drop = tmp_path / "drop"
    drop.mkdir()
    bomb = zeros_bomb(drop / "trace.json.gz", 460)  # below max_file_bytes (512 MiB) after gunzip
    assert bomb.stat().st_size < 600_000
    got = _daemon_scan(drop)
    assert got["imported"] == 0 and got["errors"] == {"profile_rejected_memory": 1}, got
    assert "memory" in got["reasons"][0], got
    assert got["rss"] < 200 * MiB, got  # the daemon never held the 460 MB of content
    assert got["child_rss"] < 768 * MiB, got  # the child stayed under import_memory_bytes


def test_table_only_sqlite_above_the_row_cap_is_rejected(tmp_path):
    drop = tmp_path / "drop"
    drop.mkdir()
    _gzip_file(table_only_nsys(tmp_path / "k.sqlite", 1_100_000), drop / "k.sqlite.gz")
    got = _daemon_scan(drop)
    assert got["imported"] == 0 and got["errors"] == {"profile_rejected_events": 1}, got
    assert "1100000 kernels, above max_events_per_import (1000000)" in got["reasons"][0], got
    assert got["rss"] < 200 * MiB and got["child_rss"] < 200 * MiB, got  # counted, never read


def _source(tmp_path: Path, **opts) -> ProfilesSource:
    src = ProfilesSource(SourceContext(options={"dir": str(tmp_path / "drop"), "settle": 0, "scan_interval": 3600,
                                                "restore": False, **opts}))
    src.open()
    return src


def test_wall_clock_limit_kills_the_child(tmp_path):
    src = _source(tmp_path, import_timeout="10ms")  # a child cannot even start in 10 ms
    try:
        (tmp_path / "drop" / "t.json").write_text(json.dumps({"traceEvents": []}))
        assert src.scan_once() == 0
        assert dict(src.poll().errors) == {"profile_rejected_time": 1}
        reason = (tmp_path / "drop" / "rejected" / "t.json.reason").read_text()
        assert "time limit import_timeout (0.01 s)" in reason
    finally:
        src.close()


def test_cpu_limit_kills_the_child(tmp_path):
    src = _source(tmp_path, import_cpu_seconds=1, max_events_per_import=100_000_000)
    try:
        zeros_bomb(tmp_path / "drop" / "z.json.gz", 64)  # seconds of CPU to decode and parse
        assert src.scan_once() == 0
        assert dict(src.poll().errors) == {"profile_rejected_time": 1}
        assert "CPU limit import_cpu_seconds (1 s)" in (tmp_path / "drop" / "rejected" / "z.json.gz.reason").read_text()
    finally:
        src.close()


def test_a_running_import_is_killed_at_shutdown(tmp_path):
    before = set(children())
    src = _source(tmp_path, max_events_per_import=100_000_000, scan_interval="10ms")  # its own import thread
    os.rename(zeros_bomb(tmp_path / "z.json.gz", 64), tmp_path / "drop" / "z.json.gz")  # whole, at once
    deadline = time.monotonic() + 20
    while not (set(children()) - before) and time.monotonic() < deadline:
        time.sleep(0.01)
    child = set(children()) - before
    assert child, "the import child never started"
    thread = src._thread
    src.close()  # the daemon stops: the child is killed, the import thread ends
    assert thread is not None and not thread.is_alive()
    for pid in child:
        with pytest.raises(ProcessLookupError):  # killed and reaped, no zombie
            os.kill(pid, 0)
    # stopped is no fault of the file: back in the drop directory for the next start, never rejected
    assert (tmp_path / "drop" / "z.json.gz").is_file()
    assert list((tmp_path / "drop" / "rejected").iterdir()) == []


def test_sqlite_time_limit_and_shutdown_with_a_generated_export(tmp_path):
    """The SQLite deadline (a clean rejection inside the child) and the shutdown kill, on a
    generated export (no fixture needed)."""
    nsys = table_only_nsys(tmp_path / "k.sqlite", 20_000)
    assert len(nsys_sqlite.parse("k", str(nsys)).kernels) == 20_000
    with pytest.raises(ProfileRejected, match="time limit of 0 s") as exc:
        nsys_sqlite.parse("k", str(nsys), time_limit=0.0)
    assert exc.value.kind == "time"
    d = DropDir(tmp_path / "drop", settle=0)
    d.setup()
    os.rename(nsys, tmp_path / "drop" / "k.sqlite")
    d.stopping.set()  # the daemon is stopping: the import ends at once
    [out] = d.scan(now=time.time() + 10)
    assert out.kind == "stopped" and out.deferred and "at shutdown" in out.reason
    assert (tmp_path / "drop" / "k.sqlite").is_file() and not list((tmp_path / "drop" / "rejected").iterdir())
    d.close()


def test_child_and_in_process_give_the_same_series(shared_fixtures, tmp_path):
    mdir = default_mappings_dir()
    allowed = MappingSet.load_dir(mdir, load_schema(mdir / "canonical.yaml")).raw_fields()
    files = sorted(p for p in (shared_fixtures / "profilers").iterdir()
                   if p.suffix in (".csv", ".json", ".gz", ".sqlite", ".txt") and "schema" not in p.name)
    child, here = Importer(top_n=10, allowed=allowed), Importer(top_n=10, allowed=allowed, isolated=False)
    compared = 0
    dir_fd = os.open(shared_fixtures / "profilers", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for f in files:
            try:
                want = here(dir_fd, f.name, path=str(f))
            except ProfileRejected as exc:
                with pytest.raises(type(exc), match="."):
                    child(dir_fd, f.name, path=str(f))
                continue
            got = child(dir_fd, f.name, path=str(f))
            assert got.devices == want.devices, f
            assert got.sample.readings == want.sample.readings, f
            assert (got.profile.tool, got.profile.variant, got.profile.trace_id) == \
                (want.profile.tool, want.profile.variant, want.profile.trace_id)
            compared += 1
    finally:
        os.close(dir_fd)
    assert compared >= 15


@pytest.mark.parametrize("answer,match", [
    (b'{"ok": true, "profile": {}}', "not valid"),
    (b'{"ok": false, "reason": 7}', "not valid"),
    (b"not json", "not valid"),
])
def test_a_forged_answer_is_refused(answer, match):
    with pytest.raises(ProfileRejected, match=match):
        isolate._decode(answer, ImportLimits())


def test_an_answer_with_a_non_finite_value_or_a_bad_index_is_refused():
    good = {"ok": True, "profile": {"tool": "kineto", "variant": "v", "path": "p", "trace_id": "", "trace_id_from": "",
                                    "wall_zero_ns": None, "warnings": []},
            "devices": [{"key": "profiles:kineto:0", "vendor": "nvidia", "index": "0", "mapping": "profiles/kineto", "uuid": "",
                         "model": "", "pci_bus_id": ""}],
            "labels": [[["kernel", "k"]]], "readings": [[0, "kernel.executions", 1.0, 0]], "errors": {},
            "summary": None}
    assert isolate._decode(json.dumps(good).encode(), ImportLimits()).sample.readings[0].value == 1.0
    for bad in ('[0, "f", NaN, 0]', '[0, "f", 1.0, 5]', '[-1, "f", 1.0, 0]', '[0, "f", "1", 0]'):
        text = json.dumps(good).replace('[0, "kernel.executions", 1.0, 0]', bad)
        with pytest.raises(ProfileRejected, match="not valid"):
            isolate._decode(text.encode(), ImportLimits())


def test_limits_are_strict_config_options(tmp_path):
    from exporter.config import load_config
    from exporter.yamlfile import ConfigError
    base = f"collectors:\n  profiles:\n    enabled: true\n    options:\n      dir: {tmp_path}\n"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(base + "      import_memory_bytes: 1073741824\n      import_timeout: 30s\n"
                          "      import_cpu_seconds: 20\n      max_events_per_import: 5000\n"
                          "      max_series_total: 30000\n")
    src = ProfilesSource(SourceContext(options=load_config(cfg).collector("profiles").options_dict()))
    assert src.limits == ImportLimits(memory_bytes=1 << 30, timeout=30.0, cpu_seconds=20, max_events=5000)
    assert src.max_series_total == 30000
    # a per-import cap above the default total raises the default total with it (was: "max_series_total
    # (50000) must be at least max_series_per_import", an error for a setting the user never wrote)
    cfg.write_text(base + "      max_series_per_import: 80000\n")
    src = ProfilesSource(SourceContext(options=load_config(cfg).collector("profiles").options_dict()))
    assert src.max_series_total == 80000 and src.limits.max_series == 80000
    cfg.write_text(base + "      max_series_per_import: 80000\n      max_series_total: 60000\n")
    with pytest.raises(ConfigError, match="max_series_total \\(60000\\) must be at least max_series_per_import"):
        load_config(cfg)
    for bad, msg in (("import_memory_bytes: 1GiB", "import_memory_bytes"),
                     ("import_memory_bytes: 1000", "import_memory_bytes"),
                     ("import_cpu_seconds: '20'", "import_cpu_seconds"),
                     ("max_series_total: 100", "max_series_total \\(100\\) must be at least")):
        cfg.write_text(base + f"      {bad}\n")
        with pytest.raises(ConfigError, match=msg):
            load_config(cfg)


def test_the_child_inherits_only_the_file_no_folder(tmp_path, monkeypatch):
    """pass_fds: the fds the daemon holds (sockets, other folders) are not the child's, and the
    artifact's folder is not either (siblings come as fds the parent opened).  The package
    folder's fd (how the worker imports the package) is closed before the parse starts."""
    (tmp_path / "t.json").write_text("{}")
    secret = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)  # an fd the daemon holds
    os.set_inheritable(secret, True)
    boot = isolate.BOOT.replace(
        "sys.exit(main())",
        "fds = [(int(n), os.path.isdir(f'/proc/self/fd/{n}')) for n in os.listdir('/proc/self/fd')]\n"
        "sys.stdout.write(json.dumps({'ok': False, 'kind': '', 'reason': repr(fds)}))\n"
        "sys.exit(0)\n")
    assert boot != isolate.BOOT
    importer = Importer()
    importer.probe()  # with the real worker: who it runs as
    monkeypatch.setattr(isolate, "BOOT", boot)
    try:
        with pytest.raises(ProfileRejected) as exc:
            importer.file(tmp_path / "t.json")
    finally:
        os.close(secret)
    fds = dict(eval(str(exc.value)))
    assert secret not in fds and len(fds) <= 5, (secret, fds)  # stdin/out/err, the file, listdir's own
    assert not any(fds.values()), fds  # no directory (listdir's own is closed when it is looked at)
