"""Parsers of the amdgpu driver's sysfs text files (pp_dpm_*, link speed, pcie_bw, hwmon labels).

Pure functions over the file contents; ``amdgpu_sysfs`` reads the files and ``mappings/amdgpu.yaml``
maps the raw fields.
"""

from __future__ import annotations

import re

_DPM_LINE = re.compile(r"^\s*(\w+)\s*:\s*(\d+(?:\.\d+)?)\s*mhz\b[^*]*(\*)?", re.IGNORECASE)


def parse_dpm(text: str) -> tuple[float | None, float | None]:
    """``pp_dpm_<clk>`` text -> (current MHz, highest level MHz).

    The current level is the line marked ``*`` (the first one when a driver marks several equal
    levels).  Variants: ``1: 1000Mhz *``; old ASICs end other lines with a space; ``S: 19Mhz *`` is
    deep sleep; RDNA3/RDNA4 print three lines where the middle one (``1: 0Mhz *``) is the current
    clock rather than a level.  The deep-sleep line is not a level for the maximum.
    """
    current: float | None = None
    highest: float | None = None
    for line in text.splitlines():
        m = _DPM_LINE.match(line)
        if not m:
            continue
        value = float(m.group(2))
        if m.group(3) and current is None:
            current = value
        if m.group(1).upper() != "S":
            highest = value if highest is None else max(highest, value)
    return current, highest


def parse_link_speed(text: str) -> float | None:
    """``16.0 GT/s PCIe`` -> 16.0; ``Unknown`` -> None."""
    m = re.match(r"^\s*(\d+(?:\.\d+)?)\s*GT/s", text)
    return float(m.group(1)) if m else None


def parse_pcie_bw(text: str) -> tuple[int, int, int] | None:
    """``<received> <sent> <max payload size>`` -> ints, None when malformed."""
    parts = text.split()
    if len(parts) != 3:
        return None
    try:
        received, sent, mps = (int(p) for p in parts)
    except ValueError:
        return None
    return received, sent, mps


def label_token(text: str) -> str:
    return re.sub(r"[^a-z0-9_]+", "_", text.strip().lower()).strip("_")
