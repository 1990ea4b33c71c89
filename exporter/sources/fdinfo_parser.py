"""Parser of one DRM fdinfo text (``/proc/<pid>/fdinfo/<fd>``), per drm-usage-stats.rst.

Pure: text in, ``FdinfoRecord`` out (or ``None`` for a file that is not a DRM client).  Never
raises.  Accepts ``key:\\tvalue``, ``key: value`` and ``key:value``.  Values keep their raw
meaning; only units are normalised (memory to bytes, engine time to ns, max frequency to Hz).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MEMORY_KINDS = ("total", "shared", "resident", "purgeable", "active")

_MEM_UNITS = {"": 1, "b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3}
_FREQ_UNITS = {"hz": 1.0, "khz": 1e3, "mhz": 1e6, "ghz": 1e9}
_PDEV_RE = re.compile(r"^(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])$")


@dataclass(slots=True)
class FdinfoRecord:
    """The DRM keys of one fdinfo file."""

    driver: str
    pdev: str = ""  # normalised PCI address 0000:03:00.0, "" when absent (platform devices)
    client_id: str = ""
    client_name: str = ""
    engine_ns: dict[str, int] = field(default_factory=dict)  # drm-engine-<e>: N ns
    cycles: dict[str, int] = field(default_factory=dict)  # drm-cycles-<e>
    total_cycles: dict[str, int] = field(default_factory=dict)  # drm-total-cycles-<e>
    capacity: dict[str, int] = field(default_factory=dict)  # drm-engine-capacity-<e>
    maxfreq_hz: dict[str, float] = field(default_factory=dict)  # drm-maxfreq-<e>
    memory: dict[str, dict[str, int]] = field(default_factory=dict)  # kind -> region -> bytes
    malformed: int = 0  # drm- lines whose value could not be parsed

    def resident(self) -> dict[str, int]:
        """Resident bytes per region: drm-resident-*, else the deprecated drm-memory-* alias,
        else drm-total-* for regions that report nothing else."""
        out = dict(self.memory.get("total", {}))
        out.update(self.memory.get("memory", {}))
        out.update(self.memory.get("resident", {}))
        return out


def normalize_pdev(text: str) -> str:
    """``0000:03:00.0`` lowercase with a domain; "" when not a PCI address."""
    m = _PDEV_RE.match(text.strip().lower())
    if not m:
        return ""
    dom, bus, dev, fn = m.groups()
    return f"{int(dom or '0', 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{fn}"


def _number_unit(value: str) -> tuple[int, str] | None:
    parts = value.split()
    if not parts or len(parts) > 2:
        return None
    num = parts[0]
    if not num.isascii() or not num.isdigit():
        return None
    return int(num), (parts[1].lower() if len(parts) == 2 else "")


def parse_fdinfo(text: str) -> FdinfoRecord | None:
    """Parse one fdinfo file; ``None`` when it has no ``drm-driver`` key."""
    if "drm-driver" not in text:
        return None
    pairs: list[tuple[str, str]] = []
    driver = ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        value = value.strip()
        if key == "drm-driver":
            driver = value
        elif key.startswith("drm-"):
            pairs.append((key, value))
    if not driver:
        return None
    rec = FdinfoRecord(driver=driver)
    for key, value in pairs:
        if not _apply(rec, key[4:], value):
            rec.malformed += 1
    return rec


def _apply(rec: FdinfoRecord, key: str, value: str) -> bool:  # noqa: PLR0911 - one branch per key family
    if key == "pdev":
        rec.pdev = normalize_pdev(value)
        return bool(rec.pdev)
    if key == "client-id":
        rec.client_id = value
        return bool(value)
    if key == "client-name":
        rec.client_name = value
        return True
    nu = _number_unit(value)
    if key.startswith("engine-capacity-"):
        if nu is None or nu[1] or nu[0] < 1:
            return False
        rec.capacity[key[16:]] = nu[0]
        return True
    if key.startswith("engine-"):
        if nu is None or nu[1] not in ("", "ns"):
            return False
        rec.engine_ns[key[7:]] = nu[0]
        return True
    if key.startswith("total-cycles-"):
        if nu is None or nu[1]:
            return False
        rec.total_cycles[key[13:]] = nu[0]
        return True
    if key.startswith("cycles-"):
        if nu is None or nu[1]:
            return False
        rec.cycles[key[7:]] = nu[0]
        return True
    if key.startswith("maxfreq-"):
        if nu is None or nu[1] not in _FREQ_UNITS:
            return False
        rec.maxfreq_hz[key[8:]] = nu[0] * _FREQ_UNITS[nu[1]]
        return True
    kind, sep, region = key.partition("-")
    if sep and region and kind in (*MEMORY_KINDS, "memory"):
        if nu is None or nu[1] not in _MEM_UNITS:
            return False
        rec.memory.setdefault(kind, {})[region] = nu[0] * _MEM_UNITS[nu[1]]
        return True
    return True  # a drm- key this parser does not use (drm-curfreq-, future keys)
