"""The watched drop directory: every file imported once, atomically, bad files set aside.

Layout under ``root``::

    root/              producers write here (write ``x.tmp`` / ``.x`` then rename: those are ignored)
    root/processing/   files claimed by one scan (os.rename: atomic on one filesystem)
    root/imported/     imported files (and companions such as hip_api_trace, sysinfo)
    root/rejected/     bad files, each with ``<name>.reason`` saying why

A file is claimed once it has not changed for ``settle`` seconds.  A sidecar
``<name>.meta.json`` ({"trace_id": ...}) travels with its file.  Files left in processing/ by a
daemon that stopped mid-import are moved to rejected/ at start (not retried: a file that
crashed or hung the importer must not do it again); drop them again to retry.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from .detect import MAX_BYTES, import_file
from .model import CompanionFile, Profile, ProfileRejected

log = logging.getLogger("unified_gpu_exporter")
SIDECAR = ".meta.json"
_IGNORED_SUFFIXES = (".tmp", ".part", ".partial", ".reason", ".crdownload", SIDECAR)


@dataclass
class Outcome:
    name: str
    profile: Profile | None = None
    reason: str = ""
    companion: bool = False


def _unique(dest: Path) -> Path:
    if not dest.exists():
        return dest
    stem = f"{dest.name}.{time.time_ns()}"
    return dest.with_name(stem)


class DropDir:
    def __init__(self, root: str | os.PathLike, settle: float = 1.0, max_bytes: int = MAX_BYTES):
        self.root = Path(root)
        self.processing = self.root / "processing"
        self.imported = self.root / "imported"
        self._last_stamp = 0
        self.rejected = self.root / "rejected"
        self.settle = settle
        self.max_bytes = max_bytes
        self._complete: set[str] = set()

    def mark_complete(self, paths) -> None:
        """Files known to be fully written (a finished capture): no settle wait for them."""
        self._complete.update(Path(p).name for p in paths)

    def setup(self) -> int:
        """Create the folders; move files left in processing/ aside.  Returns how many were moved."""
        for d in (self.root, self.processing, self.imported, self.rejected):
            d.mkdir(parents=True, exist_ok=True)
        moved = 0
        for p in sorted(self.processing.iterdir()):
            if p.is_file() and not p.name.endswith(SIDECAR):
                self._reject(p, "interrupted: the exporter stopped while importing this file; "
                                "drop it again to retry")
                moved += 1
        return moved

    def ready(self, now: float | None = None) -> list[Path]:
        now = time.time() if now is None else now
        out = []
        try:
            entries = list(os.scandir(self.root))
        except OSError:
            return []
        for e in entries:
            if e.name.startswith(".") or e.name.endswith(_IGNORED_SUFFIXES):
                continue
            try:
                if not e.is_file(follow_symlinks=False):
                    continue
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if now - st.st_mtime >= self.settle or e.name in self._complete:
                self._complete.discard(e.name)
                out.append((st.st_mtime, e.name))
        return [self.root / n for _, n in sorted(out)]

    def scan(self, now: float | None = None) -> list[Outcome]:
        """Claim every ready file, import each, move it to imported/ or rejected/."""
        claimed: list[Path] = []
        for p in self.ready(now):
            dest = _unique(self.processing / p.name)
            side = p.with_name(p.name + SIDECAR)
            try:
                if side.is_file():
                    os.rename(side, dest.with_name(dest.name + SIDECAR))
                os.rename(p, dest)  # atomic: a second scanner finds it gone
            except FileNotFoundError:
                continue  # claimed by someone else
            except OSError as exc:
                log.warning("profile claim failed", extra={"file": p.name, "reason": str(exc)})
                continue
            claimed.append(dest)
        outcomes = []
        for p in claimed:  # all claimed first: companions of one run sit together in processing/
            try:
                prof = import_file(p, max_bytes=self.max_bytes)
            except CompanionFile as exc:
                outcomes.append(Outcome(p.name, reason=str(exc), companion=True))
                continue
            except ProfileRejected as exc:
                outcomes.append(Outcome(p.name, reason=str(exc)))
                self._reject(p, str(exc))
                continue
            prof.path = str(self.imported / p.name)
            outcomes.append(Outcome(p.name, profile=prof))
        for o in outcomes:
            src = self.processing / o.name
            if (o.profile is not None or o.companion) and src.exists():
                self._move(src, self.imported)
        return outcomes

    def restore(self, limit: int) -> list[Profile]:
        """Re-read the newest ``limit`` imported files (after a restart), oldest first."""
        try:
            files = [p for p in self.imported.iterdir() if p.is_file() and not p.name.endswith(SIDECAR)]
        except OSError:
            return []
        files.sort(key=lambda p: (p.stat().st_mtime_ns, p.name))
        out = []
        for p in files[-limit:] if limit > 0 else []:
            try:
                out.append(import_file(p, max_bytes=self.max_bytes))
            except ProfileRejected:
                continue
        return out

    def _move(self, src: Path, folder: Path) -> Path:
        dest = _unique(folder / src.name)
        side = src.with_name(src.name + SIDECAR)
        if side.exists():
            os.replace(side, dest.with_name(dest.name + SIDECAR))
        os.replace(src, dest)
        if folder == self.imported:
            # stamp the import order: file times are coarse (a kernel tick), and restore() keeps
            # the newest files, so two imports in one tick must still be ordered
            stamp = max(time.time_ns(), self._last_stamp + 1)
            self._last_stamp = stamp
            try:
                os.utime(dest, ns=(stamp, stamp))
            except OSError:
                pass
        return dest

    def _reject(self, src: Path, reason: str) -> None:
        try:
            dest = self._move(src, self.rejected)
            dest.with_name(dest.name + ".reason").write_text(reason + "\n")
        except OSError as exc:
            log.error("cannot move a rejected profile aside", extra={"file": src.name, "reason": str(exc)})
        log.warning("profile rejected", extra={"file": src.name, "reason": reason})
