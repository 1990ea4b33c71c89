"""DrmFdinfoSource: two-sample per-process percentages for i915, xe and amdgpu clients."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.sources.base import SourceUnavailable
from exporter.sources.context import SourceContext
from exporter.sources.drm_fdinfo import DrmFdinfoSource
from tests.fdinfo_trees import add_card, add_fd, set_fdinfo, some_card

KiB = 1024
I915 = "0000:00:02.0"
XE = "0000:03:00.0"
AMD = "0000:08:00.0"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _bump(text: str, changes: dict[str, int]) -> str:
    """The fdinfo text with the integer value of some keys increased."""
    out = []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in changes:
            parts = value.split()
            parts[0] = str(int(parts[0]) + changes[key.strip()])
            line = f"{key}:\t{' '.join(parts)}"
        out.append(line)
    return "\n".join(out) + "\n"


def _util(sample, device=None):
    return {(r.device, dict(r.labels)["pid"], dict(r.labels)["process"], dict(r.labels)["engine"]): r.value
            for r in sample.readings if r.field == "process.engine_utilization" and device in (None, r.device)}


def _mem(sample):
    return {(r.device, dict(r.labels)["pid"], dict(r.labels)["region"]): r.value
            for r in sample.readings if r.field == "process.memory"}


@pytest.fixture
def node(tmp_path, shared_fixtures):
    """A procfs with one i915 (two fds + a forked child sharing the client), one xe and one
    amdgpu client, built from the real fdinfo samples; sysfs knows cards 0 (i915) and 1 (xe)."""
    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    texts = {n: (shared_fixtures / "intel" / f"fdinfo-{n}-1.txt").read_text() for n in ("i915", "xe", "amdgpu")}
    add_fd(proc, 100, 0, "/dev/null", comm="glxgears")
    add_fd(proc, 100, 1, "socket:[4242]", comm="glxgears")
    add_fd(proc, 100, 5, "/dev/dri/renderD128", texts["i915"], comm="glxgears")
    add_fd(proc, 100, 6, "/dev/dri/card0", texts["i915"], comm="glxgears")  # dup() of the same client
    add_fd(proc, 101, 5, "/dev/dri/renderD128", texts["i915"], comm="glxgears-child")  # fork: same client
    add_fd(proc, 200, 7, "/dev/dri/renderD129", texts["xe"], comm="xe_app")
    add_fd(proc, 300, 9, "/dev/dri/renderD130", texts["amdgpu"], comm="amd_app")
    add_fd(proc, 300, 10, "pipe:[1]", "drm-driver:\tamdgpu\n", comm="amd_app")  # not a DRM fd: never read
    add_card(sysfs, 0, I915, symlink=False)
    add_card(sysfs, 1, XE)
    clock = Clock()
    some_card(sysfs)  # a node with a DRM card (else the source is absent)
    src = DrmFdinfoSource(SourceContext(sysfs=sysfs, procfs=proc, options={"processes": "series"}), clock=clock)
    src.open()
    return proc, src, clock, texts


def test_devices_keyed_by_pci_address_with_vendor_and_card_index(node):
    _, src, _, _ = node
    devs = {d.key: d for d in src.poll().devices}
    assert {k: (d.vendor, d.index, d.mapping, d.driver) for k, d in devs.items()} == {
        I915: ("intel", "0", "drm_fdinfo", "i915"),
        XE: ("intel", "1", "drm_fdinfo", "xe"),
        AMD: ("amd", AMD, "drm_fdinfo", "amdgpu"),  # no DRM card for it in sysfs: the address
    }


def test_first_poll_has_memory_but_no_utilization(node):
    _, src, _, _ = node
    s = src.poll()
    assert _util(s) == {}
    assert _mem(s) == {
        (XE, "200", "system"): 0, (XE, "200", "gtt"): 192 * KiB, (XE, "200", "vram0"): 23992 * KiB,
        (XE, "200", "stolen"): 0,
        (AMD, "300", "vram"): 2068 * KiB, (AMD, "300", "gtt"): 8192 * KiB, (AMD, "300", "cpu"): 0,
    }


def test_two_samples_give_per_process_percentages(node):
    proc, src, clock, texts = node
    src.poll()
    clock.t += 2.0
    # i915: ns over 2 s wall; video has capacity 2
    i915 = _bump(texts["i915"], {"drm-engine-render": 1_000_000_000, "drm-engine-copy": 500_000_000,
                                 "drm-engine-video": 2_000_000_000})
    for pid, fd in ((100, 5), (100, 6), (101, 5)):
        set_fdinfo(proc, pid, fd, i915)
    # xe: cycles over total-cycles (one GPU timestamp for all classes); ccs has capacity 4
    xe = _bump(texts["xe"], {f"drm-total-cycles-{e}": 1_000_000_000 for e in ("rcs", "bcs", "vcs", "vecs", "ccs")}
               | {"drm-cycles-rcs": 250_000_000, "drm-cycles-ccs": 2_000_000_000})
    set_fdinfo(proc, 200, 7, xe)
    set_fdinfo(proc, 300, 9, _bump(texts["amdgpu"], {"drm-engine-gfx": 1_500_000_000}))
    s = src.poll()
    got = {k: round(v, 6) for k, v in _util(s).items()}
    assert got == {
        (I915, "100", "glxgears", "render"): 50.0,   # 1e9 ns / 2e9 ns
        (I915, "100", "glxgears", "copy"): 25.0,
        (I915, "100", "glxgears", "video"): 50.0,    # 2e9 / 2e9 / capacity 2
        (I915, "100", "glxgears", "video-enhance"): 0.0,
        (XE, "200", "xe_app", "rcs"): 25.0,          # 2.5e8 / 1e9
        (XE, "200", "xe_app", "bcs"): 0.0,
        (XE, "200", "xe_app", "vcs"): 0.0,
        (XE, "200", "xe_app", "vecs"): 0.0,
        (XE, "200", "xe_app", "ccs"): 50.0,          # 2e9 / 1e9 / capacity 4
        (AMD, "300", "amd_app", "gfx"): 75.0,        # 1.5e9 ns / 2e9 ns
    }
    # the client shared by pids 100 (two fds) and 101 is counted once, for the first pid
    assert not any(pid == "101" for _, pid, _, _ in got)


def test_counter_going_backwards_is_ignored_until_it_catches_up(node):
    proc, src, clock, texts = node
    src.poll()
    clock.t += 1.0
    back = _bump(texts["i915"], {"drm-engine-render": -1_000_000_000, "drm-engine-copy": 100_000_000})
    for pid, fd in ((100, 5), (100, 6), (101, 5)):
        set_fdinfo(proc, pid, fd, back)
    s = src.poll()
    u = _util(s, I915)
    assert (I915, "100", "glxgears", "render") not in u
    assert u[(I915, "100", "glxgears", "copy")] == pytest.approx(10.0)
    clock.t += 1.0
    # render is back at original + 0.5 s: measured against the larger, pre-drop value
    ahead = _bump(texts["i915"], {"drm-engine-render": 500_000_000, "drm-engine-copy": 100_000_000})
    for pid, fd in ((100, 5), (100, 6), (101, 5)):
        set_fdinfo(proc, pid, fd, ahead)
    u = _util(src.poll(), I915)
    assert u[(I915, "100", "glxgears", "render")] == pytest.approx(50.0)
    assert u[(I915, "100", "glxgears", "copy")] == pytest.approx(0.0)


def test_top_n_keeps_busiest_and_sums_the_rest_as_other(tmp_path):
    proc = tmp_path / "proc"
    clock = Clock()

    def text(client: int, ns: int) -> str:
        return (f"drm-driver:\tamdgpu\ndrm-pdev:\t{AMD}\ndrm-client-id:\t{client}\n"
                f"drm-engine-gfx:\t{ns} ns\ndrm-memory-vram:\t{client} KiB\n")

    for i in range(1, 8):
        add_fd(proc, 1000 + i, 3, "/dev/dri/renderD128", text(i, 0), comm=f"job{i}")
    some_card(tmp_path / "sys")  # a node with a DRM card (else the source is absent)
    src = DrmFdinfoSource(SourceContext(sysfs=tmp_path / "sys", procfs=proc, options={"top_n": 2, "processes": "series"}), clock=clock)
    src.open()
    src.poll()
    clock.t += 1.0
    for i in range(1, 8):  # job i was busy i * 10 ms during the second
        set_fdinfo(proc, 1000 + i, 3, text(i, i * 10_000_000))
    s = src.poll()
    got = {k: round(v, 6) for k, v in _util(s).items()}
    assert got == {(AMD, "1007", "job7", "gfx"): 7.0, (AMD, "1006", "job6", "gfx"): 6.0,
                   (AMD, "other", "other", "gfx"): 15.0}  # 1+2+3+4+5
    assert _mem(s)[(AMD, "other", "vram")] == 15 * KiB


def test_tree_without_fd_links_reads_fdinfo_directly(tmp_path, shared_fixtures):
    proc = tmp_path / "proc"
    (proc / "42" / "fdinfo").mkdir(parents=True)
    (proc / "42" / "comm").write_text("render\n")
    (proc / "42" / "fdinfo" / "3").write_text((shared_fixtures / "intel" / "fdinfo-xe-1.txt").read_text())
    (proc / "42" / "fdinfo" / "4").write_text("pos:\t0\n")
    some_card(tmp_path / "sys")  # a node with a DRM card (else the source is absent)
    src = DrmFdinfoSource(SourceContext(sysfs=tmp_path / "sys", procfs=proc, options={"processes": "series"}))
    src.open()
    s = src.poll()
    assert [d.key for d in s.devices] == [XE]
    assert _mem(s)[(XE, "42", "vram0")] == 23992 * KiB


def test_platform_and_unknown_drivers_are_not_attributed(tmp_path, shared_fixtures):
    proc = tmp_path / "proc"
    add_fd(proc, 7, 3, "/dev/dri/renderD128", (shared_fixtures / "intel" / "fdinfo-msm-1.txt").read_text())
    add_fd(proc, 8, 3, "/dev/dri/renderD129", f"drm-driver: vgem\ndrm-pdev: {XE}\ndrm-client-id: 1\n")
    some_card(tmp_path / "sys")  # a node with a DRM card (else the source is absent)
    src = DrmFdinfoSource(SourceContext(sysfs=tmp_path / "sys", procfs=proc, options={"processes": "series"}))
    src.open()
    s = src.poll()
    assert s.devices == [] and s.readings == [] and not s.errors


def test_missing_procfs_is_unavailable(tmp_path):
    with pytest.raises(SourceUnavailable):
        DrmFdinfoSource(SourceContext(sysfs=tmp_path, procfs=tmp_path / "nope", options={})).open()


def test_process_exit_between_polls_drops_its_state(node):
    proc, src, clock, texts = node
    src.poll()
    (proc / "300" / "fdinfo" / "9").unlink()
    (proc / "300" / "fd" / "9").unlink()
    clock.t += 1.0
    s = src.poll()
    # only the count's mark remains: the GPU is still watched, with no client now
    assert all(r.device != AMD or r.field == "client.evidence" for r in s.readings)
    assert not s.errors


def test_malformed_drm_lines_are_counted(tmp_path):
    proc = tmp_path / "proc"
    add_fd(proc, 5, 3, "/dev/dri/renderD128",
           f"drm-driver: i915\ndrm-pdev: {I915}\ndrm-client-id: 1\ndrm-engine-render: x ns\n")
    some_card(tmp_path / "sys")  # a node with a DRM card (else the source is absent)
    src = DrmFdinfoSource(SourceContext(sysfs=tmp_path / "sys", procfs=proc, options={"processes": "series"}))
    src.open()
    assert src.poll().errors["parse_error"] == 1


def test_unused_path_arg_types(tmp_path):
    # the context's trees may be str or Path (the registry passes one SourceContext, nothing else)
    src = DrmFdinfoSource(SourceContext(sysfs=str(tmp_path), procfs=str(tmp_path), options={}))
    assert src.procfs == Path(tmp_path)
