"""The fdinfo client count lands on the GPU a native source reads (issue 35's profile found it on
a second, uuid-less copy of every card: the indicators stepped each GPU twice, and the GPU itself
read evidence "none" with the count on)."""

from __future__ import annotations

from exporter.map.store import Store
from exporter.model import Device
from exporter.run.runner import build_runner
from exporter.sources.context import SourceContext
from exporter.sources.registry import COLLECTORS
from exporter.testing import load_mappings
from tests.fdinfo_trees import add_card

PCI = "0000:10:00.0"


def test_fdinfo_borrows_the_native_sources_identity_by_pci_address(tmp_path):
    sysfs, proc = tmp_path / "sys", tmp_path / "proc"
    add_card(sysfs, 0, PCI, driver="amdgpu")
    (proc / "2").mkdir(parents=True)
    store = Store()
    native = build_runner(COLLECTORS["amdgpu"], False, SourceContext(sysfs=sysfs, procfs=proc),
                          load_mappings(), 1.0, 1.0, store)
    native.state.devices = {PCI: Device(key=PCI, vendor="amd", index="0", mapping="amdgpu",
                                        uuid="pci-" + PCI, pci_bus_id=PCI)}
    rt = build_runner(COLLECTORS["fdinfo"], False, SourceContext(sysfs=sysfs, procfs=proc),
                      load_mappings(), 1.0, 1.0, store)
    assert rt.source is not None
    rt.source.open()
    try:
        sample = rt.source.poll()
    finally:
        rt.source.close()
        native.worker.stop()
        rt.worker.stop()
    devices = store.resolve_devices(rt.state, sample.devices)
    assert [d.id for d in devices.values()] == [("amd", "0", "pci-" + PCI)]
    # one gpu_info per GPU: the native source's
    assert [src for src, _ in store.info_devices()] == ["amdgpu"]
