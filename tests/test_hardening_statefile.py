"""Issue 26, finding 17 and the smaller procfs findings: a hostile file where the exporter
expects its own state file or a procfs entry is refused at once, never followed, never read
past a limit.  Bombs run in a bounded child (``tests/bounded.py``)."""

from __future__ import annotations

import logging
import os
import textwrap
import threading
from pathlib import Path

import pytest

from exporter.indicators.baseline import BaselineStore
from exporter.run.baseline_file import STATE_FILE, BaselineFile
from exporter.sources.context import SourceContext
from exporter.sources.drm_fdinfo import DrmFdinfoSource
from tests.bounded import run_bounded
from tests.fdinfo_trees import add_card, add_fd

PCI = "0000:03:00.0"
FDINFO = f"drm-driver:\tamdgpu\ndrm-pdev:\t{PCI}\ndrm-client-id:\t7\ndrm-engine-gfx:\t1000 ns\ndrm-memory-vram:\t4 KiB\n"


def _in_thread(fn, timeout: float = 20.0):
    """fn() in a thread: (finished, result)."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(timeout)
    return (not t.is_alive()), (out[0] if out else None)


def _unblock(fifo: Path) -> None:
    """Let a reader stuck in open() of a FIFO go (old code): open the write end, close it."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


# ------------------------------------------------------------------ 17: the state file
def test_fifo_state_file_does_not_hang_the_start(tmp_path, caplog):
    fifo = tmp_path / STATE_FILE
    os.mkfifo(fifo)
    store, file = BaselineStore(), BaselineFile(tmp_path)
    try:
        with caplog.at_level(logging.WARNING):
            done, loaded = _in_thread(lambda: file.load(store))
        assert done, "load() hangs on a FIFO"
        assert loaded is False
        assert "FIFO" in caplog.text and "fresh baselines" in caplog.text
        assert (tmp_path / (STATE_FILE + ".corrupt")).is_fifo()  # set aside, not read
    finally:
        _unblock(fifo)


def test_dev_zero_symlink_state_file_is_not_read(tmp_path):
    os.symlink("/dev/zero", tmp_path / STATE_FILE)
    res = run_bounded(textwrap.dedent("""\
        import logging, sys
        from pathlib import Path
        from exporter.run.baseline_file import BaselineFile
        from exporter.indicators.baseline import BaselineStore
        logging.basicConfig(level=logging.WARNING)
        print("LOADED", BaselineFile(Path(sys.argv[1])).load(BaselineStore()))
        """), str(tmp_path), timeout=30)
    assert res.ok and "LOADED False" in res.out and "symbolic link" in res.out, res
    assert os.readlink(tmp_path / (STATE_FILE + ".corrupt")) == "/dev/zero"


def test_oversized_state_file_is_not_read(tmp_path, caplog):
    with open(tmp_path / STATE_FILE, "wb") as f:
        f.truncate(65 << 20)  # sparse: no disk used
    with caplog.at_level(logging.WARNING):
        assert BaselineFile(tmp_path).load(BaselineStore()) is False
    assert "above the limit" in caplog.text


# ------------------------------------------------------------------ smaller: fdinfo trusts procfs
def _tree(tmp_path: Path) -> tuple[Path, Path]:
    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    add_card(sysfs, 0, PCI)
    add_fd(proc, 100, 5, "/dev/dri/renderD128", FDINFO, comm="good")
    return proc, sysfs


def _poll(proc: Path, sysfs: Path):
    src = DrmFdinfoSource(SourceContext(sysfs=sysfs, procfs=proc, options={"processes": "series"}))
    src.open()
    return src.poll()


def _pids(sample) -> set[str]:
    return {dict(r.labels)["pid"] for r in sample.readings if r.field == "process.memory"}


def test_pid_dir_named_superscript_two_is_ignored(tmp_path):
    proc, sysfs = _tree(tmp_path)
    add_fd(proc, 200, 5, "/dev/dri/renderD128", FDINFO.replace("\t7\n", "\t8\n"))
    os.rename(proc / "200", proc / "\u00b2")  # "²".isdigit() is True, int("²") raises
    assert _pids(_poll(proc, sysfs)) == {"100"}


def test_fifo_as_fdinfo_does_not_hang_the_poll(tmp_path):
    proc, sysfs = _tree(tmp_path)
    add_fd(proc, 300, 6, "/dev/dri/renderD128")
    fifo = proc / "300" / "fdinfo" / "6"
    fifo.unlink()
    os.mkfifo(fifo)
    try:
        done, sample = _in_thread(lambda: _poll(proc, sysfs))
        assert done, "poll hangs on a FIFO fdinfo"
        assert _pids(sample) == {"100"} and sample.errors["read_error"] == 1
    finally:
        _unblock(fifo)


def test_huge_fdinfo_is_not_read_past_the_limit(tmp_path):
    proc, sysfs = _tree(tmp_path)
    add_fd(proc, 400, 7, "/dev/dri/renderD128", FDINFO.replace("\t7\n", "\t9\n") + "x" * (1 << 20))
    sample = _poll(proc, sysfs)
    assert _pids(sample) == {"100"} and sample.errors["read_error"] == 1


def test_symlinked_fdinfo_and_comm_are_not_followed(tmp_path):
    proc, sysfs = _tree(tmp_path)
    secret = tmp_path / "secret"
    secret.write_text(FDINFO.replace("\t7\n", "\t10\n"))
    add_fd(proc, 500, 8, "/dev/dri/renderD128")
    (proc / "500" / "fdinfo" / "8").unlink()
    os.symlink(secret, proc / "500" / "fdinfo" / "8")
    (proc / "100" / "comm").unlink()
    os.symlink(secret, proc / "100" / "comm")
    sample = _poll(proc, sysfs)
    assert _pids(sample) == {"100"} and sample.errors["read_error"] == 1
    assert {dict(r.labels)["process"] for r in sample.readings if r.field.startswith("process.")} == {"unknown"}


# ---------------------------------------------------------------- the state directory itself
def _check(tmp_path, state_dir) -> tuple[int, str]:
    import contextlib
    import io

    from exporter.cli import main
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["--check-config", "--state.dir", str(state_dir), "--config.file", str(tmp_path / "none.yaml")])
    return rc, err.getvalue()


def test_state_dir_others_can_write_or_swap_is_refused_at_start(tmp_path):
    (tmp_path / "none.yaml").write_text("{}\n")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    assert _check(tmp_path, state) == (0, "")
    os.chmod(state, 0o777)  # anyone could plant indicator-baselines.json
    rc, err = _check(tmp_path, state)
    assert rc == 1 and "--state.dir" in err and "writable by group or others (mode 777)" in err
    os.chmod(state, 0o1777)  # sticky does not help: a file another user plants first stays theirs
    assert _check(tmp_path, state)[0] == 1
    os.chmod(state, 0o755)
    exposed = tmp_path / "exposed"
    exposed.mkdir()
    os.chmod(exposed, 0o1777)  # a link in a folder others write (even sticky) could be theirs
    os.symlink(state, exposed / "link")
    rc, err = _check(tmp_path, exposed / "link")
    assert rc == 1 and "is a symlink another user could repoint" in err
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # a parent others can write: they could swap the state dir itself
    rc, err = _check(tmp_path, shared / "state")
    assert rc == 1 and f"{shared} must be owned by uid 0 or" in err
    if os.geteuid() == 0:
        os.chown(state, 65534, 65534)
        rc, err = _check(tmp_path, state)
        assert rc == 1 and "owned by uid 65534, not by the exporter's uid 0 or root" in err
    fresh = tmp_path / "fresh" / "state"
    assert _check(tmp_path, fresh) == (0, "") and oct(fresh.stat().st_mode & 0o777) == "0o700"


def _full_store(devices: int) -> BaselineStore:
    """``devices`` GPUs with every baseline window of the default config full."""
    import random

    from exporter.indicators.config import IndicatorConfig
    from exporter.indicators.robust import RobustBaseline
    cfg, rnd, store = IndicatorConfig(), random.Random(1), BaselineStore()
    b, s = cfg.baseline, cfg.state

    def vals(n: int) -> list[float]:
        return [rnd.uniform(-4000, 4000) for _ in range(n)]
    for d in range(devices):
        key = f"GPU-{d:08d}-{rnd.getrandbits(96):024x}"
        for m in ("bandwidth", "bandwidth_utilization", "l2_miss_rate", "interconnect_throughput"):
            store.get(key, m, lambda: RobustBaseline(b.bin_seconds, b.fast_bins, b.long_bin_bins, b.long_bins)) \
                .restore(vals(b.fast_bins), vals(b.long_bins), vals(b.long_bin_bins - 1), 1e6)
        for basis in ("occupancy", "sm_active", "utilization"):
            store.get(key, "memory_bound_" + basis, lambda: RobustBaseline(
                s.reference_bin_seconds, s.reference_bins, s.reference_bins, 1)) \
                .restore(vals(s.reference_bins), vals(1), vals(s.reference_bins - 1), 1e6)
    return store


def test_state_file_limit_fits_a_real_file_and_no_more(tmp_path):
    from exporter.indicators.config import IndicatorConfig
    from exporter.run.baseline_file import state_bytes_limit
    from exporter.run.feed import MAX_BASELINE_DEVICES
    limit = state_bytes_limit(IndicatorConfig(), MAX_BASELINE_DEVICES)
    assert limit < 8 << 20  # was 64 MiB: a few hundred MB of Python objects at start
    BaselineFile(tmp_path).save(_full_store(MAX_BASELINE_DEVICES))
    size = (tmp_path / STATE_FILE).stat().st_size
    assert 1 << 20 < size < limit / 2  # 64 GPUs, every window full: ~1.6 MB
    assert BaselineFile(tmp_path, limit).load(BaselineStore())
    with open(tmp_path / STATE_FILE, "r+b") as f:  # padded past the limit: set aside, not parsed
        f.seek(0, os.SEEK_END)
        f.write(b" " * (limit - size + 1))
    assert not BaselineFile(tmp_path, limit).load(BaselineStore())
    assert (tmp_path / (STATE_FILE + ".corrupt")).exists()


# ------------------------------------------------------------------ symlinks on the way to --state.dir
DYNAMIC_UID = 61234  # the transient uid systemd's DynamicUser= gives the exporter


def _dynamic_user_layout(root: Path) -> Path:
    """What ``DynamicUser=yes`` + ``StateDirectory=ugx`` make: ``var/lib/private`` (root, 0700)
    holds the real ``ugx`` (the dynamic user's, 0700) and ``var/lib/ugx`` is a root-owned
    symlink to ``private/ugx``: $STATE_DIRECTORY names the symlink."""
    lib = root / "var" / "lib"
    (lib / "private" / "ugx").mkdir(parents=True)
    os.chmod(lib / "private", 0o700)
    os.chmod(lib / "private" / "ugx", 0o700)
    os.chown(lib / "private" / "ugx", DYNAMIC_UID, DYNAMIC_UID)
    os.symlink("private/ugx", lib / "ugx")
    return lib / "ugx"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: chown simulates systemd's dynamic user")
def test_dynamic_user_state_directory_symlink_is_accepted(tmp_path, monkeypatch):
    from exporter.run.baseline_file import check_state_dir
    from exporter.yamlfile import ConfigError
    state = _dynamic_user_layout(tmp_path)
    monkeypatch.setattr(os, "geteuid", lambda: DYNAMIC_UID)  # the exporter as the dynamic user
    check_state_dir(state)  # was: "a symlink, not a directory": the unit did not start
    BaselineFile(state).save(BaselineStore())
    assert (tmp_path / "var" / "lib" / "private" / "ugx" / STATE_FILE).exists()
    # a symlinked ancestor (/var -> /data/var) in a folder only root writes: accepted too
    os.rename(tmp_path / "var", tmp_path / "data")
    os.symlink("data", tmp_path / "var")
    check_state_dir(tmp_path / "var" / "lib" / "ugx")
    # the real directory still has to be the exporter's
    os.chown(tmp_path / "data" / "lib" / "private" / "ugx", 4242, 4242)
    with pytest.raises(ConfigError, match="owned by uid 4242"):
        check_state_dir(tmp_path / "var" / "lib" / "ugx")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: chown simulates other users")
@pytest.mark.parametrize("how", ["holder_world_writable", "holder_owned_by_other", "sticky_holder"])
def test_a_symlink_another_user_could_swap_is_refused(tmp_path, monkeypatch, how):
    from exporter.run.baseline_file import check_state_dir
    from exporter.yamlfile import ConfigError
    state = _dynamic_user_layout(tmp_path)
    holder = state.parent  # var/lib, which holds the link
    if how == "holder_world_writable":
        os.chmod(holder, 0o777)
    elif how == "holder_owned_by_other":
        os.chown(holder, 4242, 4242)
    else:
        os.chmod(holder, 0o1777)  # /tmp-like: the link may have been planted by anyone
        os.lchown(state, 4242, 4242)
    monkeypatch.setattr(os, "geteuid", lambda: DYNAMIC_UID)
    with pytest.raises(ConfigError, match="is a symlink another user could repoint"):
        check_state_dir(state)
