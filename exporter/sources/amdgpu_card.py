"""What the amdgpu sysfs source reads per card: the attribute files, hwmon patterns and the per-card
read plan built at discovery (the ``pcie_bw`` threads are in ``amdgpu_pcie_bw``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..model import Device

INT_FILES = (
    "gpu_busy_percent", "mem_busy_percent", "vcn_busy_percent",
    "mem_info_vram_used", "mem_info_vram_total", "mem_info_vis_vram_used", "mem_info_vis_vram_total",
    "mem_info_gtt_used", "mem_info_gtt_total", "current_link_width", "max_link_width", "pcie_replay_count",
)
SPEED_FILES = ("current_link_speed", "max_link_speed")
DPM_FILES = ("pp_dpm_sclk", "pp_dpm_mclk", "pp_dpm_socclk", "pp_dpm_fclk", "pp_dpm_vclk", "pp_dpm_dclk")

HWMON_PATTERNS = (
    (re.compile(r"^temp(\d+)_input$"), "temp"),
    (re.compile(r"^in(\d+)_input$"), "in"),
    (re.compile(r"^freq(\d+)_input$"), "freq"),
    (re.compile(r"^power\d+_(average|input|cap|cap_max|cap_min|cap_default)$"), None),
    (re.compile(r"^energy\d+_input$"), None),
    (re.compile(r"^fan\d+_input$"), None),
    (re.compile(r"^pwm\d+$"), None),
)


@dataclass
class Card:
    number: int
    device_dir: Path
    device: Device
    files: list[str]                             # device-level attribute files present at open
    hwmon: list[tuple[Path, str]]                # (path, raw field name)
    has_gpu_metrics: bool
    has_pcie_bw: bool
    fast_files: frozenset[str] = frozenset()     # attribute files feeding a `fast: true` metric
    # built at discovery, read every poll: (file name, kind int|speed|dpm, path) and (path, raw)
    plan: list[tuple[str, str, str]] = field(default_factory=list)
    hwmon_plan: list[tuple[str, str]] = field(default_factory=list)
    fast_plan: list[tuple[str, str]] = field(default_factory=list)
    gpu_metrics_path: str = ""
    dir_str: str = ""

    def __post_init__(self) -> None:
        d = str(self.device_dir)
        self.dir_str = d
        self.plan = [(f, "int" if f in INT_FILES else "speed" if f in SPEED_FILES else "dpm", f"{d}/{f}")
                     for f in self.files]
        self.hwmon_plan = [(str(path), raw) for path, raw in self.hwmon]
        self.fast_plan = [(f, f"{d}/{f}") for f in self.files if f in self.fast_files]
        self.gpu_metrics_path = f"{d}/gpu_metrics"
