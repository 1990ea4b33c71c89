"""Which cloud this machine says it is, from its own firmware identity: no request is sent.

The cloud enricher asks a metadata service only for the provider named here (``cloud.py``), the
way cloud-init's datasource detection and OpenTelemetry's resource detectors decide first from
DMI (SMBIOS) strings under ``<sysfs>/class/dmi/id/`` (``--path.sysfs`` applies, so a fixture tree
gives the same answer on every machine).  The strings are the providers' documented ones:

* AWS: ``sys_vendor``, ``bios_vendor`` or ``board_vendor`` is ``Amazon EC2`` (Nitro instances);
  older Xen instances: ``bios_version`` contains ``amazon``, or the system UUID (``product_uuid``,
  readable by root only, or the world-readable ``<sysfs>/hypervisor/uuid``) starts with ``ec2``.
* Azure: ``chassis_asset_tag`` is ``7783-7084-3265-9085-8269-3286-77`` (``Microsoft
  Corporation`` / ``Virtual Machine`` alone is any Hyper-V guest, on premises too).
* GCP: ``product_name`` is ``Google Compute Engine``, or ``sys_vendor`` / ``bios_vendor`` is
  ``Google``.

No DMI (a container without ``/sys/class/dmi``, other clouds, bare metal of other vendors): no
cloud claimed, no request.  Each file is read bounded (firmware strings are short): a value
longer than ``MAX_VALUE_BYTES`` is not an identity and counts as absent.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path

MAX_VALUE_BYTES = 256
DMI_FIELDS = ("sys_vendor", "product_name", "bios_vendor", "bios_version", "board_vendor",
              "chassis_asset_tag", "product_uuid")
AZURE_CHASSIS_ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"


@dataclass(frozen=True)
class Claim:
    """The providers the machine's DMI names (at most one in practice) and why."""

    providers: tuple[str, ...]
    evidence: str  # "sys_vendor=Amazon EC2", or why nothing was claimed

    def __bool__(self) -> bool:
        return bool(self.providers)


def _read(path: Path) -> str:
    """A short firmware string, "" when absent, unreadable, not a regular file or too long."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        data = os.read(fd, MAX_VALUE_BYTES + 1)
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EINVAL, errno.EISDIR, errno.EAGAIN):
            raise
        return ""
    finally:
        os.close(fd)
    if len(data) > MAX_VALUE_BYTES:
        return ""
    return data.decode("utf-8", "replace").strip().strip("\x00")


def read_dmi(sysfs: Path) -> dict[str, str]:
    """The DMI strings this module reads (absent ones left out)."""
    base = sysfs / "class" / "dmi" / "id"
    found = {name: _read(base / name) for name in DMI_FIELDS}
    hyper = _read(sysfs / "hypervisor" / "uuid")
    if hyper:
        found["hypervisor_uuid"] = hyper
    return {k: v for k, v in found.items() if v}


def _provider(dmi: dict[str, str]) -> tuple[str, str] | None:
    for field in ("sys_vendor", "bios_vendor", "board_vendor"):
        if dmi.get(field) == "Amazon EC2":
            return "aws", f"{field}={dmi[field]}"
    if "amazon" in dmi.get("bios_version", "").lower():
        return "aws", f"bios_version={dmi['bios_version']}"
    for field in ("product_uuid", "hypervisor_uuid"):
        if dmi.get(field, "").lower().startswith("ec2"):
            return "aws", f"{field} starts with ec2"
    if dmi.get("chassis_asset_tag") == AZURE_CHASSIS_ASSET_TAG:
        return "azure", f"chassis_asset_tag={AZURE_CHASSIS_ASSET_TAG}"
    if dmi.get("product_name") == "Google Compute Engine":
        return "gcp", "product_name=Google Compute Engine"
    for field in ("sys_vendor", "bios_vendor"):
        if dmi.get(field) == "Google":
            return "gcp", f"{field}=Google"
    return None


def claimed_cloud(sysfs: Path) -> Claim:
    """The provider this machine's firmware names, or none and why (for the log)."""
    dmi = read_dmi(sysfs)
    if not dmi:
        return Claim((), f"no DMI identity under {sysfs / 'class' / 'dmi' / 'id'}")
    found = _provider(dmi)
    if found is None:
        named = ", ".join(f"{k}={dmi[k]!r}" for k in ("sys_vendor", "product_name") if k in dmi)
        return Claim((), f"DMI names no cloud ({named or 'no vendor or product name'})")
    return Claim((found[0],), found[1])
