"""Intel GPUs (i915 and xe kernel drivers) from sysfs and hwmon: unprivileged, no library.

Discovery: ``<sysfs>/class/drm/card<N>`` whose driver (``device/driver`` symlink, else
``DRIVER=`` in ``device/uevent``) is i915 or xe.  ``Device.key`` is the PCI address.

Raw readings (raw units, vendor file names; ``mappings/intel.yaml`` translates them):

- i915 per GT ``gt/gt<G>/``: ``i915.gt.<file>`` for ``rps_*_freq_mhz``, ``punit_req_freq_mhz``,
  ``rc6_residency_ms`` and every ``throttle_reason_*`` (0/1), label ``gt``.  Card-level legacy
  files ``i915.card.gt_*_freq_mhz`` / ``i915.card.rc6_residency_ms`` only when no per-GT
  directory exists (on multi-GT parts they are max/min aggregates, not one GT).
- xe per GT ``device/tile<T>/gt<G>/``: ``xe.freq0.<file>`` (``*_freq``, MHz), label ``gt``;
  throttle ``xe.throttle.<reason_x>`` 0/1 from ``throttle/reasons`` when present (the kernel's
  race-free list), else from the ``throttle/reason_*`` files, plus ``xe.throttle.status``;
  idle ``xe.gtidle.<kind>.idle_residency_ms`` where kind is ``rc`` (render/compute GT) or ``mc``
  (media GT) from ``gtidle/name``; VRAM ``xe.physical_vram_size_bytes`` (sum over tiles).
- hwmon (``name`` i915 or xe): ``<drv>.hwmon.energy_uj`` (see ``EnergyChannel``),
  ``<drv>.hwmon.power<N>_{max,cap,crit,rated_max}`` (µW), ``<drv>.hwmon.temp.<label>`` (m°C;
  label from ``temp<N>_label``, else ``temp<N>``), ``<drv>.hwmon.fan_input`` (RPM, label
  ``fan``), ``<drv>.hwmon.in<N>_input`` (mV).

Energy is read on every poll: the driver widens the 32-bit hardware register only when the file
is read, so polling often never misses a wrap; the file itself is a 64-bit µJ count.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from .base import Device, PollResult, SourceBase, SourceUnavailable
from .context import DEFAULT_CONTEXT, SourceContext
from .fdinfo_parser import normalize_pdev
from .sysfs_util import link_name, read_int, read_kv, read_text

log = logging.getLogger(__name__)

DRIVERS = ("i915", "xe")
_CARD_RE = re.compile(r"^card(\d+)$")
_NUM_RE = re.compile(r"(\d+)$")
_I915_GT_FILES = (
    "rps_act_freq_mhz", "rps_cur_freq_mhz", "rps_min_freq_mhz", "rps_max_freq_mhz",
    "rps_boost_freq_mhz", "rps_RP0_freq_mhz", "rps_RP1_freq_mhz", "rps_RPn_freq_mhz",
    "punit_req_freq_mhz", "rc6_residency_ms",
)
_I915_CARD_FILES = (
    "gt_act_freq_mhz", "gt_cur_freq_mhz", "gt_min_freq_mhz", "gt_max_freq_mhz",
    "gt_boost_freq_mhz", "gt_RP0_freq_mhz", "gt_RP1_freq_mhz", "gt_RPn_freq_mhz",
)
_XE_FREQ_FILES = ("act_freq", "cur_freq", "min_freq", "max_freq", "rp0_freq", "rpa_freq", "rpe_freq", "rpn_freq")
_HWMON_POWER = re.compile(r"^power(\d+)_(max|cap|crit|rated_max)$")
_HWMON_TEMP = re.compile(r"^temp(\d+)_input$")
_HWMON_FAN = re.compile(r"^fan(\d+)_input$")
_HWMON_IN = re.compile(r"^in(\d+)_input$")
_HWMON_ENERGY = re.compile(r"^energy(\d+)_input$")


_LINK_SPEED = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*GT/s")


def _num(name: str) -> int:
    m = _NUM_RE.search(name)
    return int(m.group(1)) if m else 0


def _subdirs(path: Path, prefix: str) -> list[Path]:
    """``path/<prefix><N>`` directories in numeric order."""
    try:
        found = [p for p in path.iterdir() if p.name.startswith(prefix) and p.name[len(prefix):].isdigit()]
    except OSError:
        return []
    return sorted(found, key=lambda p: _num(p.name))


@dataclass(slots=True)
class EnergyChannel:
    """Which hwmon energy file is this GPU's energy counter; chosen once, then kept.

    Preference: the channel labelled ``card`` (whole board), then ``pkg``, then any other in
    channel order.  A channel that reads 0 is never chosen (B580 on 6.16 reports card energy 0
    while pkg counts).  The choice is sticky: switching between two different counters from one
    poll to the next would look like a counter reset.  It is revisited only if the chosen file
    disappears.
    """

    path: Path | None = None

    def read(self, hwmon: Path, errors) -> int | None:
        if self.path is not None:
            value = read_int(self.path, errors)
            if value is not None:
                return value
            if self.path.exists():
                return None
            self.path = None
        candidates = []
        for f in _files(hwmon):
            m = _HWMON_ENERGY.match(f)
            if m:
                label = read_text(hwmon / f"energy{m.group(1)}_label") or ""
                rank = {"card": 0, "pkg": 1}.get(label, 2)
                candidates.append((rank, int(m.group(1)), hwmon / f))
        for _, _, path in sorted(candidates):
            value = read_int(path, errors)
            if value:
                self.path = path
                log.info("intel: energy counter %s (label %s)", path,
                         read_text(path.with_name(path.name.replace("_input", "_label"))) or "none")
                return value
        return None


def _files(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


@dataclass(slots=True)
class _Card:
    device: Device
    path: Path  # class/drm/cardN
    driver: str
    energy: EnergyChannel = field(default_factory=EnergyChannel)


def discover(sysfs: Path) -> list[_Card]:
    """i915/xe cards under ``<sysfs>/class/drm``, keyed by PCI address."""
    out: list[_Card] = []
    drm = Path(sysfs) / "class" / "drm"
    seen: set[str] = set()
    for entry in sorted(_files(drm), key=lambda n: (len(n), n)):
        m = _CARD_RE.match(entry)
        if not m:
            continue
        card = drm / entry
        dev_dir = card / "device"
        uevent = read_kv(dev_dir / "uevent")
        driver = link_name(dev_dir / "driver") or uevent.get("DRIVER", "")
        if driver not in DRIVERS:
            continue
        addr = ""
        try:
            addr = normalize_pdev(Path(os.readlink(dev_dir)).name)
        except OSError:
            pass
        addr = addr or normalize_pdev(uevent.get("PCI_SLOT_NAME", ""))
        key = addr or f"card{m.group(1)}"
        if key in seen:
            continue
        seen.add(key)
        model = uevent.get("PCI_ID", "").lower()
        out.append(_Card(Device(key=key, vendor="intel", index=m.group(1), mapping="intel",
                                model=model, pci_bus_id=addr, driver=driver), card, driver))
    return out


class IntelSysfsSource(SourceBase):
    """Intel i915/xe GPUs from ``<sysfs>/class/drm`` and their hwmon directories."""

    name: ClassVar[str] = "intel"

    def __init__(self, context: SourceContext = DEFAULT_CONTEXT) -> None:
        self.sysfs = Path(context.sysfs)
        self._cards: list[_Card] = []

    def open(self) -> None:
        self._cards = discover(self.sysfs)
        if not self._cards:
            raise SourceUnavailable(f"no i915 or xe GPU under {self.sysfs / 'class' / 'drm'}")

    def close(self) -> None:
        self._cards = []

    def poll(self) -> PollResult:
        sample = PollResult()
        for card in self._cards:
            sample.devices.append(card.device)
            if not (card.path / "device").exists():
                sample.device_up[card.device.key] = False
                sample.errors["device_lost"] += 1
                continue
            sample.device_up[card.device.key] = True
            try:
                if card.driver == "i915":
                    self._poll_i915(sample, card)
                else:
                    self._poll_xe(sample, card)
                self._poll_hwmon(sample, card)
                self._poll_pcie(sample, card)
            except OSError:  # a directory vanished mid-walk: count, keep the other cards
                sample.errors["read_error"] += 1
        return sample

    # -- i915 ---------------------------------------------------------------------------------
    def _poll_i915(self, sample: PollResult, card: _Card) -> None:
        key, err = card.device.key, sample.errors
        gts = _subdirs(card.path / "gt", "gt")
        for gt in gts:
            labels = (("gt", str(_num(gt.name))),)
            for f in _I915_GT_FILES:
                sample.add(key, f"i915.gt.{f}", read_int(gt / f, err), labels)
            for f in _files(gt):
                if f.startswith("throttle_reason_"):
                    sample.add(key, f"i915.gt.{f}", read_int(gt / f, err), labels)
        if not gts:  # older kernels / single-GT iGPUs: card-level files only
            for f in _I915_CARD_FILES:
                sample.add(key, f"i915.card.{f}", read_int(card.path / f, err))
            sample.add(key, "i915.card.rc6_residency_ms", read_int(card.path / "power" / "rc6_residency_ms", err))
        sample.add(key, "i915.lmem_total_bytes", read_int(card.path / "device" / "lmem_total_bytes", err))

    # -- xe -----------------------------------------------------------------------------------
    def _poll_xe(self, sample: PollResult, card: _Card) -> None:
        key, err = card.device.key, sample.errors
        vram_total, vram_seen = 0, False
        for tile in _subdirs(card.path / "device", "tile"):
            vram = read_int(tile / "physical_vram_size_bytes", err)
            if vram is not None:
                vram_total, vram_seen = vram_total + vram, True
            for gt in _subdirs(tile, "gt"):
                labels = (("gt", str(_num(gt.name))),)
                freq = gt / "freq0"
                for f in _XE_FREQ_FILES:
                    sample.add(key, f"xe.freq0.{f}", read_int(freq / f, err), labels)
                self._xe_throttle(sample, key, freq / "throttle", labels)
                name = read_text(gt / "gtidle" / "name", err) or ""
                kind = "mc" if name.endswith("-mc") else "rc"
                sample.add(key, f"xe.gtidle.{kind}.idle_residency_ms",
                           read_int(gt / "gtidle" / "idle_residency_ms", err), labels)
        if vram_seen:
            sample.add(key, "xe.physical_vram_size_bytes", vram_total)

    @staticmethod
    def _xe_throttle(sample: PollResult, key: str, throttle: Path, labels: tuple) -> None:
        err = sample.errors
        files = _files(throttle)
        reason_files = [f for f in files if f.startswith("reason_")]
        reasons_text = read_text(throttle / "reasons", err) if "reasons" in files else None
        if reasons_text is not None:
            active = set() if reasons_text in ("", "none") else set(reasons_text.split())
            names = {f[len("reason_"):] for f in reason_files} | active
            for name in sorted(names):
                sample.add(key, f"xe.throttle.reason_{name}", 1 if name in active else 0, labels)
            sample.add(key, "xe.throttle.status", 1 if active else 0, labels)
            return
        for f in reason_files:
            sample.add(key, f"xe.throttle.{f}", read_int(throttle / f, err), labels)
        if "status" in files:
            sample.add(key, "xe.throttle.status", read_int(throttle / "status", err), labels)

    # -- PCIe link (the PCI device directory) ------------------------------------------------
    @staticmethod
    def _poll_pcie(sample: PollResult, card: _Card) -> None:
        """current/max link speed and width of the card's PCI function.  Absent files (an
        integrated GPU has no link) are not an error.  On discrete cards behind the on-board
        switch this is the link to that switch."""
        key, err, dev = card.device.key, sample.errors, card.path / "device"
        for name in ("current_link_speed", "max_link_speed"):
            if not (dev / name).exists():
                continue
            text = read_text(dev / name, err)
            if text is None:
                continue
            m = _LINK_SPEED.match(text)
            if m is None:  # "Unknown" (link down, or a virtual function)
                err["not_supported"] += 1
                continue
            sample.add(key, f"pcie.{name}", float(m.group(1)))
        for name in ("current_link_width", "max_link_width"):
            if (dev / name).exists():
                width = read_int(dev / name, err)
                if width:  # 0: no link (integrated GPUs report current_link_width 0)
                    sample.add(key, f"pcie.{name}", width)

    # -- hwmon --------------------------------------------------------------------------------
    def _poll_hwmon(self, sample: PollResult, card: _Card) -> None:
        key, err = card.device.key, sample.errors
        for hwmon in _subdirs(card.path / "device" / "hwmon", "hwmon"):
            drv = read_text(hwmon / "name", err)
            if drv not in DRIVERS:
                continue  # per-tile i915_gtN channels would double count the device channel
            prefix = f"{drv}.hwmon"
            sample.add(key, f"{prefix}.energy_uj", card.energy.read(hwmon, err))
            for f in _files(hwmon):
                if m := _HWMON_POWER.match(f):
                    sample.add(key, f"{prefix}.{f}", read_int(hwmon / f, err))
                elif m := _HWMON_TEMP.match(f):
                    label = read_text(hwmon / f"temp{m.group(1)}_label") or f"temp{m.group(1)}"
                    sample.add(key, f"{prefix}.temp.{label}", read_int(hwmon / f, err))
                elif m := _HWMON_FAN.match(f):
                    sample.add(key, f"{prefix}.fan_input", read_int(hwmon / f, err), (("fan", m.group(1)),))
                elif _HWMON_IN.match(f):
                    sample.add(key, f"{prefix}.{f}", read_int(hwmon / f, err))
            break
