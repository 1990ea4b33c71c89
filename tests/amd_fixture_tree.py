"""Build amdgpu sysfs roots under a temporary directory for the AMD source tests.

Layout made (as on a real node, with symlinks):
    <root>/devices/pci0000:00/<PCI address>/            the device directory (attribute files, hwmon/)
    <root>/devices/pci0000:00/<PCI address>/drm/cardN/device -> ../..
    <root>/class/drm/cardN -> ../../devices/pci0000:00/<PCI address>/drm/cardN
    <root>/bus/pci/devices/<PCI address> -> ../../../devices/pci0000:00/<PCI address>
so ``class/drm/cardN/device`` resolves to a directory named by the PCI address.

Real card dumps (``../shared/fixtures/amd/sysfs-amdgpu-sysfs-rs/<card>``) are copied into the
temporary tree, never into the repository.  ``pack_gpu_metrics_v1_5`` writes a v1_5 table with
``struct.pack_into`` at the offsets documented in ``gpu_metrics_struct_layouts.txt`` (written out
here independently of the parser's layout engine); unset fields stay all-ones ("not supported").

Unreadable files: the tests run as root, where chmod does not stop reads, so a read that fails
with EOPNOTSUPP is emulated with the source's ``reader=`` hook (``failing_reader``).
"""

from __future__ import annotations

import errno
import os
import shutil
import struct
from collections.abc import Callable, Iterable
from pathlib import Path

from exporter.sources.amdgpu_sysfs import default_reader

REAL_CARDS = ("vega56", "rx580", "rx6900xt", "rx7800xt")


def _rel_symlink(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(target, link.parent), link)


def add_card(root: Path, number: int, pci: str, files: dict[str, str | bytes] | None = None,
             source_dir: Path | None = None) -> Path:
    """Create card ``number`` at PCI address ``pci``; returns its device directory."""
    dev = root / "devices" / "pci0000:00" / pci
    if source_dir is not None:
        shutil.copytree(source_dir, dev, symlinks=True)
        for p in [dev, *dev.rglob("*")]:  # the shared fixtures are read-only
            if not p.is_symlink():
                p.chmod(0o755 if p.is_dir() else 0o644)
    dev.mkdir(parents=True, exist_ok=True)
    for rel, content in (files or {}).items():
        path = dev / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    drm_card = dev / "drm" / f"card{number}"
    drm_card.mkdir(parents=True, exist_ok=True)
    _rel_symlink(drm_card / "device", dev)
    _rel_symlink(root / "class" / "drm" / f"card{number}", drm_card)
    _rel_symlink(root / "bus" / "pci" / "devices" / pci, dev)
    return dev


def pci_of_dump(dump: Path) -> str:
    for line in (dump / "uevent").read_text().splitlines():
        if line.startswith("PCI_SLOT_NAME="):
            return line.split("=", 1)[1].strip()
    raise AssertionError(f"no PCI_SLOT_NAME in {dump}/uevent")


def arrange_real_card(root: Path, shared_fixtures: Path, name: str, number: int,
                      gpu_metrics: bytes | None = None) -> Path:
    dump = shared_fixtures / "amd" / "sysfs-amdgpu-sysfs-rs" / name
    files: dict[str, str | bytes] = {}
    if gpu_metrics is not None:
        files["gpu_metrics"] = gpu_metrics
    return add_card(root, number, pci_of_dump(dump), files, source_dir=dump)


# ------------------------------------------------------------------------------------------------
# gpu_metrics v1_5 (360 bytes), offsets from gpu_metrics_struct_layouts.txt

V1_5_SIZE = 360
V1_5_OFFSETS: dict[str, tuple[int, str, int]] = {   # name: (offset, struct code, count)
    "temperature_hotspot": (4, "H", 1), "temperature_mem": (6, "H", 1), "temperature_vrsoc": (8, "H", 1),
    "curr_socket_power": (10, "H", 1), "average_gfx_activity": (12, "H", 1),
    "average_umc_activity": (14, "H", 1), "vcn_activity": (16, "H", 4), "jpeg_activity": (24, "H", 32),
    "energy_accumulator": (88, "Q", 1), "system_clock_counter": (96, "Q", 1),
    "throttle_status": (104, "I", 1), "gfxclk_lock_status": (108, "I", 1),
    "pcie_link_width": (112, "H", 1), "pcie_link_speed": (114, "H", 1),
    "xgmi_link_width": (116, "H", 1), "xgmi_link_speed": (118, "H", 1),
    "gfx_activity_acc": (120, "I", 1), "mem_activity_acc": (124, "I", 1),
    "pcie_bandwidth_acc": (128, "Q", 1), "pcie_bandwidth_inst": (136, "Q", 1),
    "pcie_l0_to_recov_count_acc": (144, "Q", 1), "pcie_replay_count_acc": (152, "Q", 1),
    "pcie_replay_rover_count_acc": (160, "Q", 1), "pcie_nak_sent_count_acc": (168, "I", 1),
    "pcie_nak_rcvd_count_acc": (172, "I", 1), "xgmi_read_data_acc": (176, "Q", 8),
    "xgmi_write_data_acc": (240, "Q", 8), "firmware_timestamp": (304, "Q", 1),
    "current_gfxclk": (312, "H", 8), "current_socclk": (328, "H", 4), "current_vclk0": (336, "H", 4),
    "current_dclk0": (344, "H", 4), "current_uclk": (352, "H", 1),
}


def pack_gpu_metrics_v1_5(**values: int | list[int]) -> bytes:
    buf = bytearray(b"\xff" * V1_5_SIZE)
    struct.pack_into("<HBB", buf, 0, V1_5_SIZE, 1, 5)
    for name, value in values.items():
        offset, code, count = V1_5_OFFSETS[name]
        items = value if isinstance(value, list) else [value]
        assert len(items) <= count, name
        struct.pack_into(f"<{len(items)}{code}", buf, offset, *items)
    return bytes(buf)


def mi300x_table(i: int) -> bytes:
    """A plausible MI300X v1_5 table for GPU ``i`` (values derived from i so each card differs)."""
    return pack_gpu_metrics_v1_5(
        temperature_hotspot=40 + i, temperature_mem=35 + i, temperature_vrsoc=30,
        curr_socket_power=300 + i, average_gfx_activity=50 + i, average_umc_activity=80 + i,
        vcn_activity=[0, 0, 0, 0], energy_accumulator=65536 * (1000 + i),
        throttle_status=0, pcie_link_width=16, pcie_link_speed=320, xgmi_link_width=16,
        xgmi_link_speed=32, pcie_replay_count_acc=i,
        xgmi_read_data_acc=[1000 * (i + 1) + link for link in range(7)],
        xgmi_write_data_acc=[2000 * (i + 1) + link for link in range(7)],
        current_gfxclk=[2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100],
        current_socclk=[1143, 1143, 1143, 1143], current_uclk=1300,
    )


MI300X_CARDS = (0, 1, 2, 3, 4, 5, 6, 7, 10, 11)  # 10 cards: card10+ must be discovered too
MI300X_VRAM = 205822885888  # 192 GiB minus the driver's reservation, as an MI300X reports


def mi300x_pci(i: int) -> str:
    return f"0000:{0x05 + 0x10 * i:02x}:00.0"


def arrange_mi300x_node(root: Path, cards: Iterable[int] = MI300X_CARDS) -> dict[int, Path]:
    out = {}
    for i, number in enumerate(cards):
        out[number] = add_card(root, number, mi300x_pci(i), {
            "uevent": f"DRIVER=amdgpu\nPCI_ID=1002:74A1\nPCI_SLOT_NAME={mi300x_pci(i)}\n",
            "unique_id": f"{0x1122334455660000 + i:016x}",
            "product_name": "AMD Instinct MI300X",
            "gpu_busy_percent": f"{50 + i}\n",
            "mem_busy_percent": f"{80 + i}\n",
            "mem_info_vram_total": f"{MI300X_VRAM}\n",
            "mem_info_vram_used": f"{(i + 1) * 1024 ** 3}\n",
            "current_link_speed": "32.0 GT/s PCIe\n",
            "current_link_width": "16\n",
            "pp_dpm_sclk": "S: 19Mhz\n0: 500Mhz\n1: 2100Mhz *\n",
            "pp_dpm_mclk": "0: 900Mhz\n1: 1100Mhz\n2: 1200Mhz\n3: 1300Mhz *\n",
            "gpu_metrics": mi300x_table(i),
            "hwmon/hwmon2/name": "amdgpu\n",
            "hwmon/hwmon2/power1_input": f"{(300 + i) * 1_000_000}\n",
            "hwmon/hwmon2/power1_cap": "750000000\n",
            "hwmon/hwmon2/temp2_input": f"{(40 + i) * 1000}\n",
            "hwmon/hwmon2/temp2_label": "junction\n",
            "hwmon/hwmon2/temp3_input": f"{(35 + i) * 1000}\n",
            "hwmon/hwmon2/temp3_label": "mem\n",
        })
    return out


def failing_reader(fail: dict[Path, int], base: Callable[[Path], bytes] = default_reader
                   ) -> Callable[[Path], bytes]:
    """A ``reader=`` for the source that raises ``OSError(errno)`` for the given real paths."""
    resolved = {Path(os.path.realpath(p)): e for p, e in fail.items()}

    def read(path: Path) -> bytes:
        code = resolved.get(Path(os.path.realpath(path)))
        if code is not None:
            raise OSError(code, os.strerror(code), str(path))
        return base(path)

    return read


EOPNOTSUPP = errno.EOPNOTSUPP
