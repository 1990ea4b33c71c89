"""Issue 20, High 1 and 2: hostile input never freezes the exposition; the drop directory is a
spool someone else owns (symlinks, swapped folders, hard links, pre-created folders)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from exporter.importers.dropdir import DropDir, UnsafeDropDir
from exporter.importers.profiles_source import ProfilesSource
from exporter.map.mapper import Mapper
from exporter.map.mapping import MappingSet
from exporter.map.schema import default_mappings_dir, load_schema
from exporter.map.store import SourceState, Store
from exporter.model import SourceStats
from exporter.render.exposition import Renderer
from exporter.render.textformat import Counts, Family, PrefixCache, body, write
from exporter.sources.context import SourceContext
from exporter.testing import flat, frames_of

# the 130-byte reproduction: a Kineto kernel named by a lone surrogate escape
SURROGATE_KINETO = ('{"traceEvents":[{"ph":"X","cat":"kernel","name":"\\ud800","pid":0,"tid":7,'
                    '"ts":1,"dur":5,"args":{"device":0,"stream":7}}]}')


@pytest.fixture(scope="module")
def mappings():
    mdir = default_mappings_dir()
    return MappingSet.load_dir(mdir, load_schema(mdir / "canonical.yaml"))


@pytest.fixture(scope="module")
def schema():
    return load_schema(default_mappings_dir() / "canonical.yaml")


# ---------------------------------------------------------------- High 1: UTF-8 and render failure
def test_writer_replaces_lone_surrogates_and_counts_them():
    before = Counts.invalid_utf8
    fam = Family("gpu_x", "gauge", "help \udcff", "", [("gpu_x", (("kernel", "\ud800"),), 1.0)])
    for om in (False, True):
        out = write([(fam, body(fam, PrefixCache()))], openmetrics=om)
        text = out.decode("utf-8")  # strict: valid UTF-8 throughout
        assert 'kernel="\ufffd' in text
    assert Counts.invalid_utf8 > before


def test_surrogate_kernel_name_imports_and_renders(tmp_path, mappings, schema):
    src = ProfilesSource(SourceContext(options={"dir": str(tmp_path / "drop"), "settle": 0, "scan_interval": 3600}, wanted=mappings.raw_fields()))
    src.open()
    try:
        (tmp_path / "drop" / "trace.json").write_text(SURROGATE_KINETO)
        assert src.scan_once() == 1
        sample = src.poll()
        sample.monotonic = time.monotonic()
        devices = {d.key: d for d in sample.devices}
        series = flat(Mapper(mappings).map(sample, devices).frames)
    finally:
        src.close()
    assert series
    for _, labels in series:
        for _, v in labels:
            v.encode("utf-8")  # every label value valid UTF-8 where it entered
    store = Store()
    st = SourceState("profiles", stats=SourceStats(up=True, state="up"), frames=frames_of(series))
    store.add(st)
    rendered = Renderer(schema).render(store)
    assert not rendered.failed
    rendered.text.decode("utf-8")
    rendered.openmetrics.decode("utf-8")


def test_render_failure_is_visible_not_stale(schema, caplog):
    store = Store()
    # a label value that is not a string makes the writer fail: stand-in for any render bug
    store.add(SourceState("nvml", stats=SourceStats(up=True, state="up"),
                          frames=frames_of({("gpu_temperature_celsius", (("vendor", "nvidia"), ("gpu", "0"),
                                                                         ("uuid", None))): 1.0})))
    r = Renderer(schema)
    with caplog.at_level("ERROR", logger="unified_gpu_exporter"):
        first = r.render(store)
        second = r.render(store)
    assert first.failed and second.failed
    text = second.text.decode()
    assert "unified_gpu_exporter_render_errors_total 2.0" in text
    assert "gpu_temperature_celsius" not in text  # never the stale or partial bytes
    assert sum("render failed" in m for m in caplog.messages) == 1  # logged once per error
    ok = Store()
    ok.add(SourceState("nvml", stats=SourceStats(up=True, state="up")))
    assert not r.render(ok).failed


def test_readyz_not_ready_after_render_failure(schema):
    from exporter.run.daemon import Daemon, Settings
    daemon = Daemon(Settings())
    daemon.renderer = Renderer(schema)
    daemon.store.add(SourceState("nvml", stats=SourceStats(up=True, state="up"),
                                 frames=frames_of({("gpu_temperature_celsius", (("vendor", "nvidia"), ("gpu", "0"),
                                                                                ("uuid", None))): 1.0})))
    import asyncio

    async def go():
        await daemon.render()
        return daemon.ready
    assert asyncio.run(go()) is False
    daemon._render_worker.stop()
    daemon._state_worker.stop()


def test_bad_imported_file_is_quarantined_once(tmp_path):
    d = DropDir(tmp_path / "drop")
    d.setup()
    (tmp_path / "drop" / "imported" / "bad.csv").write_text("not a profile\n")
    assert d.restore(16) == []
    assert not (tmp_path / "drop" / "imported" / "bad.csv").exists()
    assert (tmp_path / "drop" / "rejected" / "bad.csv").exists()
    assert "no longer imports" in (tmp_path / "drop" / "rejected" / "bad.csv.reason").read_text()
    assert d.restore(16) == []  # not re-read: it is no longer in imported/
    assert len(list((tmp_path / "drop" / "rejected").iterdir())) == 2
    d.close()


def test_surrogate_file_in_imported_restores_cleanly(tmp_path):
    d = DropDir(tmp_path / "drop")
    d.setup()
    (tmp_path / "drop" / "imported" / "trace.json").write_text(SURROGATE_KINETO)
    profs = d.restore(16)
    assert len(profs) == 1
    assert {dict(r.labels).get("kernel") for r in profs[0].result.sample.readings} >= {"\ufffd"}
    d.close()


# ---------------------------------------------------------------- High 2: the drop directory
def _secret(tmp_path: Path) -> Path:
    vault = tmp_path / "vault"
    vault.mkdir(mode=0o700)
    secret = vault / "shadow"
    secret.write_text("root:$6$secrethash:19000:0:99999:7:::\n")
    return secret


def test_rejected_swapped_for_symlink_never_overwrites(tmp_path):
    secret = _secret(tmp_path)
    drop = tmp_path / "drop"
    d = DropDir(drop, settle=0)
    d.setup()
    # the attacker replaces rejected/ with a symlink to a directory holding a file they target
    os.rename(drop / "rejected", drop / "old-rejected")
    os.symlink(secret.parent, drop / "rejected")
    (drop / "shadow").write_text("garbage that is no profile\n")  # rejected -> shadow.reason
    (drop / "x").write_text("garbage\n")
    d.scan(now=time.time() + 10)
    assert secret.read_text().startswith("root:$6$")
    assert sorted(p.name for p in secret.parent.iterdir()) == ["shadow"]  # nothing planted
    assert (drop / "old-rejected" / "shadow.reason").exists()  # went to the held folder
    d.close()


def test_processing_swapped_for_directory_of_attacker(tmp_path):
    drop = tmp_path / "drop"
    d = DropDir(drop, settle=0)
    d.setup()
    os.rename(drop / "processing", drop / "held")
    (drop / "processing").mkdir()
    os.symlink("/etc/hostname", drop / "processing" / "trace.csv")
    (drop / "trace.csv").write_text("garbage\n")
    outs = d.scan(now=time.time() + 10)
    assert [o.name for o in outs] == ["trace.csv"]
    assert os.path.islink(drop / "processing" / "trace.csv")  # attacker's dir untouched
    assert (drop / "rejected" / "trace.csv").read_text() == "garbage\n"
    d.close()


def test_symlink_and_hardlink_drops_are_not_read(tmp_path):
    secret = _secret(tmp_path)
    drop = tmp_path / "drop"
    d = DropDir(drop, settle=0)
    d.setup()
    os.symlink(secret, drop / "link.csv")
    assert d.scan(now=time.time() + 10) == []  # a symlink is never claimed
    os.unlink(drop / "link.csv")
    os.link(secret, drop / "hard.csv")  # same filesystem: a second name for a secret file
    outs = d.scan(now=time.time() + 10)
    assert [o.reason for o in outs] == ["not a plain file with one link"]
    for p in (drop / "rejected").iterdir():
        assert "secrethash" not in p.read_text()
    assert secret.read_text().startswith("root:$6$")
    d.close()


def test_symlink_swapped_in_during_claim_is_discarded(tmp_path, monkeypatch):
    secret = _secret(tmp_path)
    drop = tmp_path / "drop"
    d = DropDir(drop, settle=0)
    d.setup()
    (drop / "t.csv").write_text("x\n")
    real_ready = d.ready

    def racing_ready(now=None):  # the race: between the scan and the rename
        out = real_ready(now)
        os.unlink(drop / "t.csv")
        os.symlink(secret, drop / "t.csv")
        return out
    monkeypatch.setattr(d, "ready", racing_ready)
    outs = d.scan(now=time.time() + 10)
    assert [o.reason for o in outs] == ["not a plain file with one link"]
    assert not list((drop / "rejected").iterdir())
    assert secret.read_text().startswith("root:$6$")
    d.close()


def test_precreated_folder_symlink_or_foreign_mode_is_refused(tmp_path):
    drop = tmp_path / "drop"
    drop.mkdir()
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", drop / "rejected")
    with pytest.raises(UnsafeDropDir, match="rejected/.*symlink"):
        DropDir(drop).setup()
    os.unlink(drop / "rejected")
    os.chmod(drop / "imported", 0o777)
    with pytest.raises(UnsafeDropDir, match="imported/ is writable by group or others"):
        DropDir(drop).setup()
    os.chmod(drop / "imported", 0o755)
    if os.geteuid() == 0:  # a folder another user created first (the attacker pre-creates it)
        os.chown(drop / "imported", 65534, 65534)
        with pytest.raises(UnsafeDropDir, match="imported/ is owned by uid 65534"):
            DropDir(drop).setup()
        os.chown(drop / "imported", 0, 0)
    os.chmod(drop, 0o777)
    with pytest.raises(UnsafeDropDir, match="sticky"):
        DropDir(drop).setup()
    os.chmod(drop, 0o1777)
    d = DropDir(drop)
    d.setup()
    d.close()


def test_unsafe_drop_dir_makes_the_source_unavailable_with_reason(tmp_path, mappings):
    from exporter.sources.base import SourceUnavailable
    drop = tmp_path / "drop"
    drop.mkdir()
    os.symlink("/tmp", drop / "processing")
    src = ProfilesSource(SourceContext(options={"dir": str(drop)}, wanted=mappings.raw_fields()))
    with pytest.raises(SourceUnavailable, match="processing/"):
        src.open()
