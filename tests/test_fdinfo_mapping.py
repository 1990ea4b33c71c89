"""Per-process canonical series from DRM fdinfo through mappings/drm_fdinfo.yaml."""

from __future__ import annotations

import pytest

from exporter.sources.context import SourceContext
from exporter.sources.drm_fdinfo import DrmFdinfoSource
from exporter.testing import map_source_once
from tests.fdinfo_trees import add_card, add_fd, set_fdinfo, some_card

KiB = 1024


class StepClock:
    """Advances 1 s per poll, like map_source_once's own fake clock."""

    def __init__(self):
        self.t = 999.0

    def __call__(self):
        self.t += 1.0
        return self.t


class Stepping:
    name = "fdinfo"

    def __init__(self, source, steps):
        self.source, self.steps = source, list(steps)

    def open(self):
        self.source.open()

    def close(self):
        self.source.close()

    def poll(self):
        if self.steps:
            self.steps.pop(0)()
        return self.source.poll()


def test_process_series_carry_each_gpus_vendor_and_index(tmp_path):
    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    add_card(sysfs, 0, "0000:03:00.0")

    def xe(c, t):
        return (f"drm-driver:\txe\ndrm-pdev:\t0000:03:00.0\ndrm-client-id:\t3\ndrm-cycles-ccs:\t{c}\n"
                f"drm-total-cycles-ccs:\t{t}\ndrm-engine-capacity-ccs:\t4\ndrm-resident-vram0:\t1 MiB\n")

    def amd(ns):
        return (f"drm-driver: amdgpu\ndrm-pdev: 0000:08:00.0\ndrm-client-id: 9\ndrm-engine-gfx: {ns} ns\n"
                "drm-memory-vram: 2068 KiB\n")

    add_fd(proc, 10, 4, "/dev/dri/renderD128", xe(0, 0), comm="trainer")
    add_fd(proc, 20, 4, "/dev/dri/renderD129", amd(0), comm="infer")

    def second():
        set_fdinfo(proc, 10, 4, xe(3_000_000, 1_000_000))  # 300 % of one ccs / capacity 4 = 75 %
        set_fdinfo(proc, 20, 4, amd(400_000_000))  # 0.4 s busy in 1 s

    some_card(sysfs)  # a node with a DRM card (else the source is absent)
    src = DrmFdinfoSource(SourceContext(sysfs=sysfs, procfs=proc, options={"processes": "series"}), clock=StepClock())
    res = map_source_once(Stepping(src, [lambda: None, second]))
    # the client count's internal series (gpu_client_*, never served) aside
    got = {(name, tuple(sorted(labels))): v for (name, labels), v in res.items() if not name.startswith("gpu_client_")}
    intel = (("gpu", "0"), ("pid", "10"), ("process", "trainer"), ("uuid", ""), ("vendor", "intel"))
    amdl = (("gpu", "0000:08:00.0"), ("pid", "20"), ("process", "infer"), ("uuid", ""), ("vendor", "amd"))

    def lab(base, **extra):
        return tuple(sorted(base + tuple(extra.items())))

    assert got == pytest.approx({
        ("gpu_process_utilization_percent", lab(intel, engine="ccs")): 75.0,
        ("gpu_process_memory_bytes", lab(intel, region="vram0")): 1024 * KiB,
        ("gpu_process_utilization_percent", lab(amdl, engine="gfx")): 40.0,
        ("gpu_process_memory_bytes", lab(amdl, region="vram")): 2068 * KiB,
    })
