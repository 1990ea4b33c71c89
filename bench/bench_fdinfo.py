"""Cost of the DRM fdinfo source on a busy node (not a test; run by `make bench`).

Builds a fixture procfs in a temp dir: PROCS processes holding FDS fds in all (files, sockets,
pipes, /dev/null), DRM of which are DRM clients of an xe card, then polls DrmFdinfoSource once per
simulated second (its clock steps 1 s a poll, so the schedule of checks and re-verifications runs
as in the daemon) and reports the CPU the polls took as a percentage of one core at 1 poll/s.

Cases (one JSON object per line with --json):
  busy     the tree above, an xe card bound to its driver;
  flood    the same plus one process holding FLOOD fds on /dev/null (another user's flood) that
           appears after the warm-up: the poll stays within its budget and the count is partial;
  bmc      the same procfs, the only DRM card the BMC's VGA (``ast``): the source does not scan;
  separated  ``busy`` with the scan in the counting process (privilege separation, issue 37): its
           CPU is the serving process's plus the counting process's (``/proc/<pid>/stat``, clock
           ticks), side by side with ``busy``;
  busy_list  ``busy`` with DRM core's debugfs client list readable (``<sysfs>/kernel/debug/dri/0/
           clients`` naming the DRM clients' pids, ``clients_lists``): the blind re-verification
           stops, but for one real one every ``LIST_VERIFY_EVERY`` periods, which a run of
           ``--polls`` below that many periods does not reach (docs/detection.md gives its average).

Every fixture process has a ``stat`` file as Linux writes it (``tests.fdinfo_trees.stat_text``),
and a fixed quarter of them is *active* (``Activity``): before every poll (once a simulated
second) their utime and minflt grow, so the re-verification of their tables cannot be vouched for
(sources/fdinfo_activity.py); the others stay idle, as daemons, shims and sidecars do.  A quarter
is meant to be pessimistic: on the machine this was written on 6 of 66 processes changed their
stat over 50 s; on a GPU node the data loaders and trainers change, most other processes do not.
The rewrites run between polls, outside the measured time (a thread would add its CPU to the
process's, which the polls are measured with).

A ``<pid>/stat`` read (open, fstat, read, close) costs about 7-10 us of CPU on this machine's real
/proc, a ``readlink`` of an fd about 3 us: vouching pays off from 4 fds a table (``MIN_FDS``).

    python bench/bench_fdinfo.py [--fds 100000] [--procs 1000] [--drm 20] [--polls 60] [--flood 200000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, installed or not
from exporter.sources.base import SourceUnavailable  # noqa: E402
from exporter.sources.context import SourceContext  # noqa: E402
from exporter.sources.drm_fdinfo import DrmFdinfoSource  # noqa: E402
from tests.fdinfo_trees import stat_text  # noqa: E402

FDINFO = ("pos:\t0\nflags:\t02100002\nmnt_id:\t26\nino:\t{ino}\ndrm-driver:\txe\ndrm-client-id:\t{cid}\n"
          "drm-pdev:\t0000:03:00.0\ndrm-total-vram0:\t23992 KiB\ndrm-resident-vram0:\t23992 KiB\n"
          "drm-cycles-rcs:\t{cyc}\ndrm-total-cycles-rcs:\t{tot}\ndrm-cycles-ccs:\t{cyc}\n"
          "drm-total-cycles-ccs:\t{tot}\ndrm-engine-capacity-ccs:\t4\n")
TARGETS = ("socket:[{n}]", "pipe:[{n}]", "/var/log/app{n}.log", "anon_inode:[eventfd]", "/dev/null")
PCI = "0000:03:00.0"


def build(root: Path, fds: int, procs: int, drm: int) -> list[Path]:
    """Create the tree; return the fdinfo paths of the DRM fds (to update between polls)."""
    drm_files = []
    per_proc = max(1, fds // procs)
    n = 0
    (root / "2").mkdir(parents=True)
    (root / "2" / "comm").write_text("kthreadd\n")  # the host's PID namespace
    (root / "2" / "stat").write_text(stat_text(2, "kthreadd", minflt=0, majflt=0, utime=0, stime=3, num_threads=1,
                                               starttime=0, vsize=0, rss=0))
    for p in range(procs):
        pid = 1000 + p
        base = root / str(pid)
        (base / "fd").mkdir(parents=True)
        (base / "fdinfo").mkdir()
        (base / "comm").write_text(f"proc{p}\n")
        (base / "stat").write_text(_stat(pid, p, 0))
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


def _stat(pid: int, p: int, tick: int) -> str:
    """The ``stat`` of fixture process ``p`` after ``tick`` seconds of activity (0: as built)."""
    return stat_text(pid, f"proc{p}", minflt=20000 + 37 * p + 450 * tick, majflt=p % 7, utime=3000 + p + 25 * tick,
                     stime=700 + p % 97 + 4 * tick, num_threads=1 + p % 24, starttime=10000 + 13 * p,
                     vsize=(200 + p % 300) << 20, rss=5000 + 11 * p)


class Activity:
    """A fixed quarter of the fixture's processes (every 4th) shows activity: ``step`` grows their
    stat's utime, stime and minflt (a trainer, a data loader); the rest stays idle."""

    def __init__(self, root: Path, procs: int) -> None:
        self.root, self.active, self.tick = root, range(0, procs, 4), 0

    def step(self) -> None:
        self.tick += 1
        for p in self.active:
            (self.root / str(1000 + p) / "stat").write_text(_stat(1000 + p, p, self.tick))


def clients_lists(tree: Path, pids: list[str]) -> Path:
    """``<tree>/kernel/debug/dri/<N>/clients`` for every ``class/drm/card<N>`` of a sysfs tree, in
    the kernel's layout (drivers/gpu/drm/drm_debugfs.c ``drm_clients_info``, with the client name
    and id columns), naming ``pids`` (one drm_file each) on the first card."""
    head = f"{'command':>20} {'tgid':>5} {'dev':>3} master a {'uid':>5} {'magic':>10} {'name':>64} {'id':>20}\n"
    for i, card in enumerate(sorted((tree / "class" / "drm").glob("card*"))):
        minor = int(card.name[4:])
        d = tree / "kernel" / "debug" / "dri" / str(minor)
        d.mkdir(parents=True, exist_ok=True)
        rows = [f"{'app':>20} {int(p):5d} {128 + minor:3d}   n    y {1000:5d} {0:10d} {'<unset>':>64} {n + 1:20d}\n"
                for n, p in enumerate(pids if i == 0 else [])]
        (d / "clients").write_text(head + "".join(rows))
    return tree


def flood(root: Path, pid: int, fds: int) -> None:
    """One process holding ``fds`` fds on /dev/null (fdinfo files are not needed: never read)."""
    base = root / str(pid)
    (base / "fd").mkdir(parents=True)
    (base / "fdinfo").mkdir()
    (base / "comm").write_text("flood\n")
    for fd in range(fds):
        os.symlink("/dev/null", base / "fd" / str(fd))


def sysfs(root: Path, driver: str) -> Path:
    """One DRM card bound to ``driver`` (xe: the clients' GPU; ast: a BMC's VGA)."""
    card = root / "class" / "drm" / "card0"
    card.mkdir(parents=True)
    (card / "device").symlink_to(f"../../../devices/pci0000:00/0000:00:01.0/{PCI}")
    dev = root / "devices" / "pci0000:00" / "0000:00:01.0" / PCI
    dev.mkdir(parents=True)
    (dev / "driver").symlink_to(f"../../../../bus/pci/drivers/{driver}")
    return root


def fixture_dir() -> str | None:
    """A tmpfs for the fixture procfs where there is one (/dev/shm): in memory like /proc, and a
    disk's write latency (ext4 with discard) does not end up in the numbers."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def vm_rss() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its children: the counting process and its scanner."""
    total = 0
    pids = [pid]
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
            pids += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except (OSError, ValueError, IndexError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


def separated(proc: Path, sys_root: Path, drm_files: list[Path], polls: int) -> dict:
    """``busy`` with the scan in the counting process (exporter/privsep/)."""
    from exporter.privsep.counter import Counter
    from exporter.sources import fdinfo_records

    counter = Counter(proc, sys_root)
    fdinfo_records.use_factory(counter.scanner)
    try:
        return run_case("separated", proc, sys_root, drm_files, polls, other_cpu=lambda: tree_cpu(counter.pid))
    finally:
        fdinfo_records.use_factory(None)
        counter.close()


def run_case(name: str, proc: Path, sys_root: Path, drm_files: list[Path], polls: int,
             on_poll=None, other_cpu=None) -> dict:
    activity = Activity(proc, sum(1 for n in os.listdir(proc) if n.isdigit() and 1000 <= int(n) < 999999))
    clock = Clock()
    src = DrmFdinfoSource(SourceContext(sysfs=sys_root, procfs=proc, options={"top_n": 5}), clock=clock)
    rss0 = vm_rss()
    try:
        src.open()
    except SourceUnavailable as exc:
        t0 = time.process_time()
        for _ in range(polls):  # the daemon opens again every poll: that is its whole cost
            try:
                src.open()
            except SourceUnavailable:
                pass
        cpu = time.process_time() - t0
        return {"case": name, "scanning": False, "reason": str(exc), "polls": polls,
                "cpu_percent": cpu / polls * 100, "median_ms": cpu / polls * 1000, "max_ms": None,
                "first_ms": None, "rss_growth_bytes": vm_rss() - rss0}
    wall, cpu, partial, budget_polls = [], [], [], 0
    sample = None
    for i in range(polls):
        if on_poll is not None:
            on_poll(i)
        activity.step()  # a quarter of the processes ran this second (outside the measured time)
        for j, path in enumerate(drm_files):  # counters advance between polls
            path.write_text(FDINFO.format(ino=j, cid=j, cyc=i * 1000, tot=i * 4000))
        clock.t += 1.0
        o0 = other_cpu() if other_cpu is not None else 0.0
        c0, t0 = time.process_time(), time.perf_counter()
        sample = src.poll()
        wall.append((time.perf_counter() - t0) * 1000)
        cpu.append(time.process_time() - c0 + (other_cpu() - o0 if other_cpu is not None else 0.0))
        budget_polls += sample.errors.get("scan_budget_exceeded", 0)
        ev = [dict(r.labels).get("reason") for r in sample.readings if r.field == "client.evidence"]
        partial.append(bool(ev) and any(ev))
    clients = {dict(r.labels)["client"] for r in sample.readings if r.field == "client.engine_utilization"}
    steady = cpu[len(cpu) // 2:]  # the second half: warm-up (first examination of every table) over
    return {"case": name, "scanning": True, "polls": polls, "first_ms": wall[0],
            "median_ms": statistics.median(wall[1:]), "max_ms": max(wall[1:]),
            "cpu_percent": sum(steady) / len(steady) * 100, "cpu_percent_all": sum(cpu) / len(cpu) * 100,
            "max_cpu_ms": max(cpu) * 1000, "clients_counted": len(clients),
            "partial_polls": sum(partial), "partial_last": partial[-1], "budget_exceeded_polls": budget_polls,
            "rss_growth_bytes": vm_rss() - rss0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fds", type=int, default=100000)
    ap.add_argument("--procs", type=int, default=1000)
    ap.add_argument("--drm", type=int, default=20)
    ap.add_argument("--polls", type=int, default=60)
    ap.add_argument("--flood", type=int, default=200000, help="fds of the flooding process (0: no flood case)")
    ap.add_argument("--json", action="store_true", help="one JSON object per case")
    args = ap.parse_args()
    out = []
    with tempfile.TemporaryDirectory(dir=fixture_dir()) as tmp:
        root = Path(tmp) / "proc"
        t0 = time.monotonic()
        drm_files = build(root, args.fds, args.procs, args.drm)
        built = time.monotonic() - t0
        sys_xe = sysfs(Path(tmp) / "sys", "xe")
        out.append(run_case("busy", root, sys_xe, drm_files, args.polls))
        out.append(separated(root, sys_xe, drm_files, args.polls))
        sys_list = clients_lists(sysfs(Path(tmp) / "sys_list", "xe"), [f.parent.parent.name for f in drm_files])
        out.append(run_case("busy_list", root, sys_list, drm_files, args.polls))
        out.append(run_case("bmc", root, sysfs(Path(tmp) / "sys_ast", "ast"), drm_files, args.polls))
        if args.flood:
            def at(i: int) -> None:
                if i == args.polls // 4:  # after the warm-up: a known node, then the flood arrives
                    flood(root, 999999, args.flood)
            out.append(run_case("flood", root, Path(tmp) / "sys", drm_files, args.polls, at))
    for row in out:
        row.update(fds=args.fds, processes=args.procs, drm_clients=len(drm_files), build_s=round(built, 1),
                   flood_fds=args.flood if row["case"] == "flood" else 0,
                   max_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        if args.json:
            print(json.dumps(row))
        else:
            print(f"{row['case']}: {args.fds} fds in {args.procs} processes, {len(drm_files)} DRM clients: "
                  f"CPU {row['cpu_percent']:.2f} % of one core at 1 poll/s; median {row['median_ms']:.1f} ms, "
                  f"max {row['max_ms'] or 0:.1f} ms per poll; first {row['first_ms'] or 0:.1f} ms")


if __name__ == "__main__":
    main()
