"""Cost of one DRM fdinfo scan on a node with many fds (not a test; run by `make bench`).

Builds a fixture procfs in a temp dir: PROCS processes holding FDS fds in all (files, sockets,
pipes, /dev/null), a few of which are DRM clients, then times DrmFdinfoSource.poll().

    python bench/bench_fdinfo.py [--fds 5000] [--procs 500] [--drm 20] [--polls 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, installed or not
from exporter.sources.context import SourceContext
from exporter.sources.drm_fdinfo import DrmFdinfoSource  # noqa: E402

FDINFO = ("pos:\t0\nflags:\t02100002\nmnt_id:\t26\nino:\t{ino}\ndrm-driver:\txe\ndrm-client-id:\t{cid}\n"
          "drm-pdev:\t0000:03:00.0\ndrm-total-vram0:\t23992 KiB\ndrm-resident-vram0:\t23992 KiB\n"
          "drm-cycles-rcs:\t{cyc}\ndrm-total-cycles-rcs:\t{tot}\ndrm-cycles-ccs:\t{cyc}\n"
          "drm-total-cycles-ccs:\t{tot}\ndrm-engine-capacity-ccs:\t4\n")
TARGETS = ("socket:[{n}]", "pipe:[{n}]", "/var/log/app{n}.log", "anon_inode:[eventfd]", "/dev/null")


def build(root: Path, fds: int, procs: int, drm: int) -> list[Path]:
    """Create the tree; return the fdinfo paths of the DRM fds (to update between polls)."""
    drm_files = []
    per_proc = max(1, fds // procs)
    n = 0
    for p in range(procs):
        pid = 1000 + p
        base = root / str(pid)
        (base / "fd").mkdir(parents=True)
        (base / "fdinfo").mkdir()
        (base / "comm").write_text(f"proc{p}\n")
        for fd in range(per_proc):
            n += 1
            if len(drm_files) < drm and fd == per_proc - 1:
                os.symlink("/dev/dri/renderD128", base / "fd" / str(fd))
                path = base / "fdinfo" / str(fd)
                path.write_text(FDINFO.format(ino=n, cid=len(drm_files), cyc=0, tot=0))
                drm_files.append(path)
            else:
                os.symlink(TARGETS[n % len(TARGETS)].format(n=n), base / "fd" / str(fd))
                (base / "fdinfo" / str(fd)).write_text(f"pos:\t0\nflags:\t02\nmnt_id:\t9\nino:\t{n}\n")
    return drm_files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fds", type=int, default=5000)
    ap.add_argument("--procs", type=int, default=500)
    ap.add_argument("--drm", type=int, default=20)
    ap.add_argument("--polls", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "proc"
        drm_files = build(root, args.fds, args.procs, args.drm)
        card = Path(tmp) / "sys" / "class" / "drm" / "card0"  # the GPU the clients use (xe)
        card.mkdir(parents=True)
        (card / "device").symlink_to("../../../devices/pci0000:00/0000:00:01.0/0000:03:00.0")
        src = DrmFdinfoSource(SourceContext(sysfs=Path(tmp) / "sys", procfs=root, options={"top_n": 5}))
        src.open()
        times = []
        for i in range(args.polls):
            for j, path in enumerate(drm_files):  # counters advance between polls
                path.write_text(FDINFO.format(ino=j, cid=j, cyc=i * 1000, tot=i * 4000))
            t0 = time.perf_counter()
            sample = src.poll()
            times.append((time.perf_counter() - t0) * 1000)
        print(f"fdinfo scan: {args.fds} fds in {args.procs} processes, {len(drm_files)} DRM clients, "
              f"{len(sample.readings)} readings")
        print(f"  first poll {times[0]:.1f} ms; steady median {statistics.median(times[1:]):.1f} ms, "
              f"max {max(times[1:]):.1f} ms per poll")


if __name__ == "__main__":
    main()
