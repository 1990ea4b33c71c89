"""AMD GPUs through the amdgpu driver's sysfs files (works with or without ROCm).

Cards are ``<sysfs>/class/drm/card<N>`` for any number of digits (card10+ exist on partitioned
MI300X nodes; node_exporter's ``card[0-9]`` glob misses them), whose driver is amdgpu (the
``device/driver`` symlink or ``DRIVER=amdgpu`` in ``device/uevent``).  Connector entries
(``card1-DP-1``) are skipped.

Raw field names are the sysfs file names, in their units (bytes, percent, MHz):
    gpu_busy_percent, mem_busy_percent, vcn_busy_percent, mem_info_{vram,vis_vram,gtt}_{used,total},
    current_link_speed (GT/s), current_link_width, max_link_speed, max_link_width, pcie_replay_count,
    pp_dpm_<clk> (current level, MHz) and pp_dpm_<clk>.max (highest level, MHz),
    hwmon.temp.<label> (millidegrees; label edge/junction/mem, else hwmon.temp<N>_input),
    hwmon.power<N>_{average,input,cap,cap_max,cap_min,cap_default} (microwatts),
    hwmon.energy<N>_input (microjoules), hwmon.fan<N>_input (RPM), hwmon.pwm<N> (0-255),
    hwmon.in.<label> (millivolts), hwmon.freq.<label> (Hz),
    gpu_metrics.<field> (see ``amd_gpu_metrics.table_readings``),
    pcie_bw.{received,sent,max_payload_size} (last 1 s sample) and pcie_bw.{received,sent}_bytes
    (running estimate of bytes: messages x max payload size, integrated over time).

``pcie_bw`` sleeps about 1 s in the kernel on every read, so it is read by one background thread
per card (started in ``open``, stopped in ``close``); ``poll`` only returns its last values.

Device identity: key and ``pci_bus_id`` = PCI address (the ``device`` symlink target, else
``PCI_SLOT_NAME`` of ``device/uevent``), ``gpu`` = card number, ``uuid`` = ``unique_id`` when the
ASIC has one, else ``pci-<PCI address>`` (stable for the slot).

Tests and special setups can pass ``reader=`` (a function ``Path -> bytes``) to replace file
reads; an ``OSError`` it raises is classified like a real one (``EOPNOTSUPP`` -> not_supported).
"""

from __future__ import annotations

import errno
import functools
import os
import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from .amd_gpu_metrics import PREFIX as TABLE_PREFIX
from .amd_gpu_metrics import GpuMetricsError, readings
from .amdgpu_card import (  # noqa: F401 - INT_FILES etc. stay importable from here
    DPM_FILES,
    HWMON_PATTERNS,
    INT_FILES,
    SPEED_FILES,
    Card,
)
from .amdgpu_pcie_bw import PCIE_BW_FIELDS, PcieBw, PcieBwReaders, PcieBwThreads  # noqa: F401
from .amdgpu_text import label_token, parse_dpm, parse_link_speed, parse_pcie_bw  # noqa: F401
from .base import Abilities, Device, PollResult, SourceBase, SourceUnavailable
from .context import DEFAULT_CONTEXT, SourceContext
from .options import AmdgpuOptions
from .sysfs_util import KeptFiles, error_kind, fd_budget, on_sysfs, parse_int

Reader = Callable[[Path], bytes]


@functools.lru_cache(maxsize=1024)
def parsed_dpm(text: str) -> tuple[float | None, float | None]:
    """``parse_dpm``, remembered: a card's pp_dpm_* text takes a handful of values (the level
    marked current moves), so most polls parse nothing."""
    return parse_dpm(text)


_CARD_RE = re.compile(r"^card(\d+)$")
_PCI_RE = re.compile(r"^[0-9a-fA-F]{4,}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_ABSENT = (errno.ENOENT, errno.ENOTDIR)

def default_reader(path: Path) -> bytes:
    """Whole file to EOF (``read()`` on an unbuffered file loops until the kernel returns 0)."""
    with open(path, "rb", buffering=0) as fh:
        return fh.readall()


class AmdgpuSysfsSource(SourceBase):
    name = "amdgpu"
    abilities = Abilities(fast_poll=True)

    def __init__(self, context: SourceContext = DEFAULT_CONTEXT, *, reader: Reader | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.sysfs = Path(context.sysfs)
        # raw fields mappings/amdgpu.yaml maps: files and table fields nothing maps are not read
        # (None without a mapping set: everything is read, as tools and tests expect)
        self._wanted = context.fields("amdgpu")
        # what poll_fast reads: the attribute files and table fields feeding a `fast: true`
        # metric (None without a mapping set: poll_fast is a full poll)
        fast = context.fast_fields("amdgpu")
        self._fast_files = None if fast is None else frozenset(f for f in fast if f in INT_FILES)
        self._fast_table = None if fast is None else frozenset(f for f in fast if f.startswith(TABLE_PREFIX))
        self.options = context.typed(AmdgpuOptions)
        self._reader = reader or default_reader
        self._clock = clock
        self._cards: list[Card] = []
        self._pcie: PcieBwReaders | None = None  # the pcie_bw threads while open
        self._kept: KeptFiles | None = None  # set in open() unless a reader= is given or keep_open: never

    # -------------------------------------------------------------------------------- reading
    def _read(self, path: Path | str, errors: Counter[str] | None,
              kept: KeptFiles | None = None) -> bytes | None:
        """Whole file; a ``str`` path is a poll path (kept open when enabled: in ``kept``, else
        the poll's descriptors), a ``Path`` is not."""
        try:
            kept = kept if kept is not None else self._kept
            if kept is not None and type(path) is str:
                return kept.read(path)
            return self._reader(Path(path))
        except OSError as exc:
            if exc.errno not in _ABSENT and errors is not None:
                errors[error_kind(exc)] += 1
            return None

    def _text(self, path: Path | str, errors: Counter[str] | None,
              kept: KeptFiles | None = None) -> str | None:
        data = self._read(path, errors, kept)
        if data is None:
            return None
        return self._decoded(data, errors)

    @staticmethod
    def _decoded(data: bytes, errors: Counter[str] | None) -> str | None:
        try:
            return data.decode("utf-8").strip()
        except UnicodeDecodeError:
            if errors is not None:
                errors["malformed_value"] += 1
            return None

    def _int(self, path: Path | str, errors: Counter[str]) -> int | None:
        data = self._read(path, errors)
        if data is None:
            return None
        try:
            return int(data)  # the common case: decimal digits and a newline
        except ValueError:
            pass
        text = self._decoded(data, errors)
        if text is None:
            return None
        value = parse_int(text) if text else None
        if value is None:
            errors["malformed_value"] += 1
        return value

    # -------------------------------------------------------------------------------- discovery
    def _is_amdgpu(self, device_dir: Path) -> bool:
        try:
            if Path(os.readlink(device_dir / "driver")).name == "amdgpu":
                return True
        except OSError:
            pass
        uevent = self._text(device_dir / "uevent", None) or ""
        return any(line.strip() == "DRIVER=amdgpu" for line in uevent.splitlines())

    def _identity(self, number: int, device_dir: Path) -> Device:
        uevent: dict[str, str] = {}
        for line in (self._text(device_dir / "uevent", None) or "").splitlines():
            key, sep, value = line.partition("=")
            if sep:
                uevent[key.strip()] = value.strip()
        target = Path(os.path.realpath(device_dir)).name
        pci = target if _PCI_RE.match(target) else uevent.get("PCI_SLOT_NAME", "")
        unique_id = self._text(device_dir / "unique_id", None) or ""
        product = self._text(device_dir / "product_name", None) or ""
        pci_id = uevent.get("PCI_ID", "")
        return Device(
            key=pci or f"card{number}",
            vendor="amd",
            index=str(number),
            mapping="amdgpu",
            uuid=unique_id or f"pci-{pci or f'card{number}'}",
            model=product or (f"AMD GPU {pci_id}" if pci_id else "AMD GPU"),
            pci_bus_id=pci,
            driver="amdgpu",
            serial=self._text(device_dir / "serial_number", None) or "",
        )

    def _hwmon_files(self, device_dir: Path) -> list[tuple[Path, str]]:
        out: list[tuple[Path, str]] = []
        hw_root = device_dir / "hwmon"
        try:
            hw_dirs = sorted(p for p in hw_root.iterdir() if p.name.startswith("hwmon"))
        except OSError:
            return out
        for hw in hw_dirs:
            try:
                names = sorted(os.listdir(hw))
            except OSError:
                continue
            for fname in names:
                for pattern, kind in HWMON_PATTERNS:
                    m = pattern.match(fname)
                    if not m:
                        continue
                    raw = f"hwmon.{fname}"
                    if kind is not None:
                        label = label_token(self._text(hw / f"{kind}{m.group(1)}_label", None) or "")
                        if label:
                            raw = f"hwmon.{kind}.{label}"
                    if self._wanted is None or raw in self._wanted:
                        out.append((hw / fname, raw))
                    break
        return out

    def _wants_file(self, fname: str) -> bool:
        """A device attribute file is read when a rule maps what it gives (a pp_dpm_* file gives
        the current level and ``.max``, the highest)."""
        wanted = self._wanted
        return wanted is None or fname in wanted or (fname in DPM_FILES and f"{fname}.max" in wanted)

    def discover(self) -> list[Card]:
        cards: list[Card] = []
        drm = self.sysfs / "class" / "drm"
        try:
            entries = sorted(os.listdir(drm))
        except OSError:
            return cards
        for entry in entries:
            m = _CARD_RE.match(entry)
            if not m:
                continue
            device_dir = drm / entry / "device"
            if not device_dir.is_dir() or not self._is_amdgpu(device_dir):
                continue
            number = int(m.group(1))
            present = [f for f in INT_FILES + SPEED_FILES + DPM_FILES
                       if self._wants_file(f) and os.path.lexists(device_dir / f)]
            cards.append(Card(
                number=number, device_dir=device_dir, device=self._identity(number, device_dir),
                files=present, hwmon=self._hwmon_files(device_dir),
                has_gpu_metrics=os.path.lexists(device_dir / "gpu_metrics"),
                has_pcie_bw=os.path.lexists(device_dir / "pcie_bw"),
                fast_files=self._fast_files or frozenset()))
        cards.sort(key=lambda c: c.number)
        return cards

    # -------------------------------------------------------------------------------- lifecycle
    def open(self) -> None:
        self._cards = self.discover()
        if not self._cards:
            raise SourceUnavailable(f"no amdgpu cards under {self.sysfs / 'class' / 'drm'}")
        keep = self.options.keep_open
        if self._reader is default_reader and (keep == "always" or keep == "auto" and on_sysfs(self.sysfs)):
            wanted = sum(len(c.plan) + len(c.hwmon_plan) + c.has_gpu_metrics for c in self._cards)
            if self._kept is not None:
                self._kept.close()
            self._kept = KeptFiles(fd_budget(wanted))
        if self._pcie is not None:
            self._pcie.stop()
            self._pcie = None
        if self.options.pcie_bw and (
                self._wanted is None or not self._wanted.isdisjoint(PCIE_BW_FIELDS)):
            self._pcie = PcieBwReaders(self._clock, self.options.pcie_bw_interval)
            for card in self._cards:
                if card.has_pcie_bw:
                    self._pcie.start(card.device.key, card.number, card.device_dir / "pcie_bw",
                                     *self._pcie_bw_reader())

    def close(self) -> None:
        if self._pcie is not None:
            self._pcie.stop()
        if self._kept is not None:
            self._kept.close()

    @property
    def devices(self) -> list[Device]:
        return [c.device for c in self._cards]

    def _pcie_bw_reader(self) -> tuple[Callable[[Path, Counter[str]], str | None], Callable[[], None]]:
        """How one pcie_bw thread reads its file, and what it closes at the end: a descriptor of
        its own, kept open and re-read with pread, where attribute files are kept open (an
        open/read/close a second per card costs ~100 us of CPU each); else ``_text``."""
        if self._kept is None:
            return self._text, lambda: None
        own = KeptFiles(1)
        return (lambda path, errors: self._text(str(path), errors, own)), own.close

    def pcie_bw_ready(self, timeout: float = 5.0) -> bool:
        """True once every card's pcie_bw thread has finished its first read (for tests, --once)."""
        return self._pcie.ready(timeout) if self._pcie is not None else True

    # -------------------------------------------------------------------------------- poll
    def poll(self) -> PollResult:
        sample = PollResult()
        bw: dict[str, tuple[float, ...]] = {}
        if self._pcie is not None:
            bw_errors, bw = self._pcie.take()
            sample.errors.update(bw_errors)
        wanted = self._wanted
        for card in self._cards:
            sample.devices.append(card.device)
            key = card.device.key
            if not os.path.isdir(card.dir_str):
                if self._kept is not None:
                    self._kept.drop_under(card.dir_str + "/")
                sample.device_up[key] = False
                sample.errors["device_lost"] += 1
                continue
            sample.device_up[key] = True
            try:
                self._poll_card(card, sample)
            except Exception:  # one card must never break the others
                sample.errors["read_error"] += 1
            if key in bw:
                for fname, value in zip(PCIE_BW_FIELDS, bw[key], strict=True):
                    if wanted is None or fname in wanted:
                        sample.add(key, fname, value)
        return sample

    def poll_fast(self) -> PollResult:
        """Cheap signals for the contention indicators between full polls: the raw fields
        feeding a ``fast: true`` metric (the busy percentages, one small sysfs read each).
        Errors and lost cards are left to poll().  Without a mapping set there is nothing to go
        by: a full poll."""
        if self._fast_files is None:  # _fast_table too: both are set from one value
            return self.poll()
        sample = PollResult()
        scratch: Counter[str] = Counter()
        for card in self._cards:
            key = card.device.key
            sample.devices.append(card.device)
            complete = len(card.fast_plan) == len(self._fast_files)
            for fname, path in card.fast_plan:
                value = self._int(path, scratch)
                if value is None:
                    complete = False
                sample.add(key, fname, value)
            # mappings/amdgpu.yaml lists the busy files before the table's activity averages, so
            # the files win where they give a value: the table (only its two fields unpacked) is
            # read for a card whose busy file is missing or failed (tests pin that order)
            if not complete:
                self._gpu_metrics(card, sample, scratch, self._fast_table)
        return sample

    def _gpu_metrics(self, card: Card, sample: PollResult, errors: Counter[str],
                     wanted: frozenset[str] | None = None) -> None:
        """The table's readings: those ``wanted`` (a fast poll's), else those the mapping maps."""
        if not (card.has_gpu_metrics and self.options.gpu_metrics):
            return
        data = self._read(card.gpu_metrics_path, errors)
        if data is None:
            return
        try:
            rows = readings(data, self._wanted if wanted is None else wanted)
        except GpuMetricsError:
            errors["parse_error"] += 1
            return
        key = card.device.key
        for raw, value, labels in rows:
            sample.add(key, raw, value, labels)

    def _poll_card(self, card: Card, sample: PollResult) -> None:
        key, errors = card.device.key, sample.errors
        for fname, kind, path in card.plan:
            if kind == "int":
                sample.add(key, fname, self._int(path, errors))
            elif kind == "speed":
                text = self._text(path, errors)
                if text is not None:
                    speed = parse_link_speed(text)
                    if speed is None:
                        errors["not_supported"] += 1
                    sample.add(key, fname, speed)
            else:  # pp_dpm_*
                text = self._text(path, errors)
                if text is None:
                    continue
                current, highest = parsed_dpm(text)
                if current is None:
                    errors["malformed_value"] += 1
                wanted = self._wanted
                if wanted is None or fname in wanted:
                    sample.add(key, fname, current)
                if wanted is None or f"{fname}.max" in wanted:
                    sample.add(key, f"{fname}.max", highest)
        for path, raw in card.hwmon_plan:
            sample.add(key, raw, self._int(path, errors))
        self._gpu_metrics(card, sample, errors)
