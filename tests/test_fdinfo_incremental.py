"""The fdinfo source on a busy node (issue 35): no scan without a counted driver, incremental
discovery with its worst-case bound, re-verification of reused fd numbers, the per-poll budget.

The procfs is a fixture tree; cost is counted in ``readlink`` calls on fd tables (the call the
old scan made once per fd per poll), never timed."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from exporter.sources.base import SourceUnavailable
from exporter.sources.context import SourceContext
from exporter.sources.drm_fdinfo import DrmFdinfoSource
from tests.fdinfo_trees import add_card, add_fd

AMD = "0000:08:00.0"
CHECK, VERIFY = 15.0, 50.0  # the defaults of scan_check_period / scan_verify_period
BOUND_NEW_NUMBER = CHECK + 2  # polls at 1 s: found by the next check, counted one poll later
BOUND_REUSED = VERIFY + 2  # found by the next re-verification, counted one poll later


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _text(shared_fixtures: Path, busy_ns: int = 0, client: int = 217) -> str:
    text = (shared_fixtures / "intel" / "fdinfo-amdgpu-1.txt").read_text()
    text = re.sub(r"drm-client-id:\s*\d+", f"drm-client-id:\t{client}", text)
    return re.sub(r"drm-engine-gfx:\s*(\d+) ns", lambda m: f"drm-engine-gfx:\t{int(m[1]) + busy_ns} ns", text)


def _node(tmp_path: Path, shared_fixtures: Path, *, procs: int = 5, fds: int = 30, driver: str = "amdgpu",
          pci: str = AMD, **options):
    """``procs`` processes of ``fds`` non-DRM fds each, pid 100 also one amdgpu client (fd 3).  Polls run
    on a simulated clock: the per-poll wall-time budget is far off unless a test sets it (a machine
    that deschedules this process for a few ms must not turn a scan into a budget case)."""
    options.setdefault("scan_max_seconds", 10.0)
    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    add_fd(proc, 2, 0, "/dev/null", comm="kthreadd")
    for p in range(procs):
        for fd in range(fds):
            add_fd(proc, 100 + p, fd, f"socket:[{p * 1000 + fd}]")
    add_fd(proc, 100, 3, "/dev/dri/renderD128", _text(shared_fixtures))
    add_card(sysfs, 0, pci, driver=driver)
    clock = Clock()
    src = DrmFdinfoSource(SourceContext(sysfs=sysfs, procfs=proc, options=options), clock=clock)
    return proc, sysfs, src, clock


class Node:
    """Polls once per simulated second, advancing every client's busy counter."""

    def __init__(self, proc, src, clock, shared_fixtures) -> None:
        self.proc, self.src, self.clock, self.fixtures = proc, src, clock, shared_fixtures
        self.clients: dict[tuple[int, int], int] = {(100, 3): 217}
        self.tick = 0

    def add_client(self, pid: int, fd: int, client: int) -> None:
        self.clients[(pid, fd)] = client
        add_fd(self.proc, pid, fd, "/dev/dri/renderD128", _text(self.fixtures, 0, client))

    def poll(self):
        self.tick += 1
        for (pid, fd), client in self.clients.items():  # 50 % busy
            (self.proc / str(pid) / "fdinfo" / str(fd)).write_text(
                _text(self.fixtures, self.tick * 500_000_000, client))
        self.clock.t += 1.0
        return self.src.poll()

    def seconds_until_counted(self, pid: int, limit: int = 120) -> int:
        for second in range(1, limit + 1):
            sample = self.poll()
            if any(dict(r.labels)["client"] == str(pid) for r in sample.readings
                   if r.field == "client.engine_utilization"):
                return second
        raise AssertionError(f"pid {pid} not counted within {limit} s")


def _steady_node(path: Path, shared_fixtures: Path, **kw) -> Node:
    """``_node`` opened and polled 5 times: every table examined once."""
    proc, _, src, clock = _node(path, shared_fixtures, **kw)
    src.open()
    node = Node(proc, src, clock, shared_fixtures)
    for _ in range(5):
        node.poll()
    return node


def _evidence(sample) -> list[tuple[float, str]]:
    return [(r.value, dict(r.labels)["reason"]) for r in sample.readings if r.field == "client.evidence"]


# ------------------------------------------------------------------------- counted drivers only
@pytest.mark.parametrize("drivers", [("ast",), ("ast", "nvidia-drm")])
def test_no_scan_when_every_card_is_an_uncounted_driver(tmp_path, shared_fixtures, readlinks, drivers):
    proc, sysfs, src, _ = _node(tmp_path, shared_fixtures, driver=drivers[0])
    for i, drv in enumerate(drivers[1:], start=1):
        add_card(sysfs, i, f"0000:0{i}:00.0", driver=drv)
    with pytest.raises(SourceUnavailable, match=r"no DRM card bound to a counted driver .*amdgpu.*ast"):
        src.open()
    assert readlinks == []  # not one fd of /proc looked at


def test_scanning_starts_when_a_counted_card_appears(tmp_path, shared_fixtures, readlinks):
    proc, sysfs, src, clock = _node(tmp_path, shared_fixtures, driver="ast", pci="0000:02:00.0")
    with pytest.raises(SourceUnavailable):
        src.open()  # the runner opens again at every poll
    add_card(sysfs, 1, AMD, driver="amdgpu")  # hot-plug / driver loaded
    src.open()
    node = Node(proc, src, clock, shared_fixtures)
    assert node.seconds_until_counted(100) == 2  # first sample, then a percentage
    assert _evidence(node.poll()) == [(1.0, "")]


def test_scan_stops_when_the_counted_card_goes_away(tmp_path, shared_fixtures, readlinks):
    proc, sysfs, src, clock = _node(tmp_path, shared_fixtures)
    src.open()
    node = Node(proc, src, clock, shared_fixtures)
    node.poll()
    shutil.rmtree(sysfs / "class" / "drm" / "card0")  # amdgpu unbound: its DRM card goes
    add_card(sysfs, 1, "0000:02:00.0", driver="ast")  # the BMC's VGA stays
    before = len(readlinks)
    for _ in range(60):
        sample = node.poll()
        assert sample.readings == [] and sample.errors["no_counted_driver"] >= 1
    assert len(readlinks) == before


# ------------------------------------------------------------------------- incremental discovery
def test_steady_polls_readlink_only_what_is_due(tmp_path, shared_fixtures, readlinks):
    proc, _, src, clock = _node(tmp_path, shared_fixtures, procs=5, fds=30)
    src.open()
    node = Node(proc, src, clock, shared_fixtures)
    node.poll()
    first = len(readlinks)
    assert first >= 5 * 30  # the first poll examines every fd table once
    readlinks.clear()
    for _ in range(int(VERIFY)):
        node.poll()
    # over one re-verification period every fd is readlinked about once again, not once a poll
    assert len(readlinks) <= 1.5 * first
    assert len(readlinks) >= first - 5  # ... and the re-verification did run over all of them


def test_new_process_is_counted_at_once(tmp_path, shared_fixtures, readlinks):
    node = _steady_node(tmp_path, shared_fixtures)
    node.add_client(500, 9, 900)  # a new process with a DRM fd
    readlinks.clear()
    assert node.seconds_until_counted(500) <= 2
    assert len(readlinks) < 30  # its own table, not every process's again


def test_new_client_in_an_existing_process_is_counted_within_the_bound(tmp_path, shared_fixtures, readlinks):
    node = _steady_node(tmp_path, shared_fixtures)
    node.add_client(102, 77, 902)  # a process known for 5 s opens the GPU: a new fd number
    readlinks.clear()
    took = node.seconds_until_counted(102)
    assert took <= BOUND_NEW_NUMBER
    assert len(readlinks) < 5 * 30  # over all those polls, less than one full scan of the node


def test_reused_fd_number_is_caught_by_the_re_verification(tmp_path, shared_fixtures, readlinks):
    node = _steady_node(tmp_path, shared_fixtures)
    # fd 12 of pid 103 was a socket: closed, and the number reused for the GPU between two polls
    node.add_client(103, 12, 903)
    took = node.seconds_until_counted(103)
    assert took <= BOUND_REUSED
    assert took > 2  # the fd table's numbers did not change: only the re-verification sees it


def test_a_kfd_process_is_watched_every_poll(tmp_path, shared_fixtures, readlinks):
    proc, sysfs, src, clock = _node(tmp_path, shared_fixtures)
    src.open()
    node = Node(proc, src, clock, shared_fixtures)
    for _ in range(3):
        node.poll()
    (sysfs / "class" / "kfd" / "kfd" / "proc" / "104").mkdir(parents=True)  # opened /dev/kfd
    node.poll()
    node.add_client(104, 12, 904)  # ... then its render node, under a reused number
    readlinks.clear()
    assert node.seconds_until_counted(104) <= 2
    assert len(readlinks) <= 2 * 30  # its table every poll, nobody else's


def test_a_client_that_closes_is_dropped_and_its_number_looked_at_again(tmp_path, shared_fixtures, readlinks):
    proc, _, src, clock = _node(tmp_path, shared_fixtures)
    src.open()
    node = Node(proc, src, clock, shared_fixtures)
    node.seconds_until_counted(100)
    del node.clients[(100, 3)]
    add_fd(proc, 100, 3, "pipe:[5]")  # closed; the number reused by a pipe
    sample = node.poll()
    assert not [r for r in sample.readings if r.field == "client.engine_utilization"]


# ------------------------------------------------------------------------- budget under a flood
def test_fd_flood_stays_within_the_budget_and_marks_the_count_partial(tmp_path, shared_fixtures, readlinks):
    proc, _, src, clock = _node(tmp_path, shared_fixtures, scan_max_fds=100)
    src.open()
    node = Node(proc, src, clock, shared_fixtures)
    node.seconds_until_counted(100)
    for _ in range(3):
        node.poll()
    assert _evidence(node.poll()) == [(1.0, "")]
    for fd in range(1000):  # another user's process: 1,000 fds on /dev/null
        add_fd(proc, 666, fd, "/dev/null")
    node.add_client(105, 88, 905)  # a tenant arriving during the flood
    polls = 0
    partial = 0
    while True:
        readlinks.clear()
        sample = node.poll()  # never raises: the source stays up
        polls += 1
        assert len(readlinks) <= 100  # the budget, every poll
        if _evidence(sample) == [(0.0, "scan_budget_exceeded")]:
            partial += 1
            assert sample.errors["scan_budget_exceeded"] == 1  # the self-metric counts it
            assert any(dict(r.labels)["client"] == "100" for r in sample.readings
                       if r.field == "client.engine_utilization")  # known clients still read
        elif _evidence(sample) == [(1.0, "")]:
            break
        assert polls < 30
    assert partial >= 9  # 1,000 fds at 100 a poll
    assert node.seconds_until_counted(105) <= 2


# ---------------------------------------------------------------- the security review (issue 37)
FDINFO_DRM = "pos:\t0\nflags:\t02100002\ndrm-driver:\tamdgpu\ndrm-pdev:\t" + AMD + "\ndrm-client-id:\t{c}\n"


@pytest.fixture
def fdinfo_reads(monkeypatch):
    """Counts the fdinfo files read through a directory fd (the known clients' reads)."""
    from exporter import safefile

    calls = []
    real = safefile.read_at

    def counting(dir_fd, name, limit, **kw):
        calls.append(name)
        return real(dir_fd, name, limit, **kw)

    monkeypatch.setattr(safefile, "read_at", counting)
    return calls


def _many_clients(tmp_path: Path, n: int) -> tuple[Path, Path]:
    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    add_fd(proc, 2, 0, "/dev/null", comm="kthreadd")
    for p in range(n):
        add_fd(proc, 1000 + p, 3, "/dev/dri/renderD128", FDINFO_DRM.format(c=p))
    add_card(sysfs, 0, AMD, driver="amdgpu")
    return proc, sysfs


def test_known_clients_are_read_no_further_than_the_record_cap(tmp_path, fdinfo_reads):
    """One user with many DRM fds (dup()ed render fds) must not make every poll read them all:
    the poll stops at the record cap and says the count is partial."""
    from exporter.sources.fdinfo_records import LocalScanner

    proc, sysfs = _many_clients(tmp_path, 40)
    scanner = LocalScanner(proc, sysfs, max_records=10)
    scanner.scan({}, 1.0)  # finds them
    fdinfo_reads.clear()
    found = scanner.scan({}, 2.0)  # every one is a known client now
    assert len(found) == 10 and len(fdinfo_reads) == 10
    assert scanner.budget_hit and scanner.partial  # -> evidence reason scan_budget_exceeded


def test_known_clients_are_read_within_a_deadline_shorter_than_the_answer_deadline(tmp_path, fdinfo_reads,
                                                                                    monkeypatch):
    from exporter.privsep.counter import answer_seconds
    from exporter.sources import fdinfo_scan
    from exporter.sources.fdinfo_records import LocalScanner
    from exporter.sources.fdinfo_scan import ScanLimits, known_seconds

    for lim in (ScanLimits(), ScanLimits(max_seconds=0.001), ScanLimits(max_seconds=1.0)):
        assert 4 * known_seconds(lim) <= answer_seconds(lim)
    proc, sysfs = _many_clients(tmp_path, 40)
    scanner = LocalScanner(proc, sysfs)
    assert len(scanner.scan({}, 1.0)) == 40 and not scanner.partial

    class Stepped:  # every look at the clock: 0.1 s later (slow reads, without waiting for them)
        t = 0.0

        @classmethod
        def perf_counter(cls) -> float:
            cls.t += 0.1
            return cls.t

        monotonic = perf_counter

    monkeypatch.setattr(fdinfo_scan, "time", Stepped)
    fdinfo_reads.clear()
    found = scanner.scan({}, 2.0)
    assert 0 < len(fdinfo_reads) < 40 and len(found) == len(fdinfo_reads)
    assert scanner.budget_hit and scanner.partial


def test_a_dev_target_is_never_stated(tmp_path, monkeypatch):
    """A stat follows the fd link into the target's filesystem (FUSE on /dev/shm can hang it):
    /dev targets outside /dev/dri are decided from procfs's fdinfo alone."""
    from exporter.sources.fdinfo_records import LocalScanner

    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    add_fd(proc, 2, 0, "/dev/null", comm="kthreadd")
    for fd, target in enumerate(("/dev/shm/fuse/x", "/dev/mqueue/q", "/dev/pts/3", "/dev/sda", "/dev/zero")):
        add_fd(proc, 500, fd, target)
    add_fd(proc, 500, 9, "/dev/shm/drm-looking", FDINFO_DRM.format(c=1))  # never followed, even so
    add_fd(proc, 501, 4, "/dev/gpu-in-a-container", FDINFO_DRM.format(c=2))
    add_card(sysfs, 0, AMD, driver="amdgpu")
    stats = []
    real = os.stat

    def counting(path, *a, **kw):
        if kw.get("dir_fd") is not None or str(path).startswith(str(proc)):
            stats.append(path)
        return real(path, *a, **kw)

    monkeypatch.setattr(os, "stat", counting)
    found = LocalScanner(proc, sysfs).scan({}, 1.0)
    assert stats == []
    assert [(p, fd) for p, fd, _ in found] == [("501", "4")]


def test_a_kfd_process_with_a_known_client_keeps_its_checks(tmp_path, shared_fixtures, readlinks):
    """A ROCm process amdkfd lists that already has a DRM fd stays on the check and re-verification
    schedule while amdkfd's listing is fresh: a second client it opens later is found within the
    bound, and its re-verification never falls overdue (which would mark the count partial)."""
    proc, sysfs, src, clock = _node(tmp_path, shared_fixtures)
    (sysfs / "class" / "kfd" / "kfd" / "proc" / "100").mkdir(parents=True)  # pid 100: fd 3 a client
    src.open()
    node = Node(proc, src, clock, shared_fixtures)
    node.seconds_until_counted(100)
    for _ in range(int(CHECK)):  # past amdkfd's fresh window: pid 100 is due for its check in it
        node.poll()
    readlinks.clear()
    node.add_client(100, 40, 940)  # a second render fd, under a new number
    for _ in range(int(BOUND_NEW_NUMBER)):
        node.poll()
    assert "40" in readlinks  # the check looked at the new number
    for _ in range(int(2 * VERIFY)):
        sample = node.poll()
        assert _evidence(sample) == [(1.0, "")]  # never a re-verification overdue


@pytest.fixture
def tmpfs_path():
    """A folder on tmpfs (``/dev/shm``): a directory's size there counts its entries, as a procfs
    fd directory's does since Linux 6.2 (on ext4 it is a block size, and every check lists)."""
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="fdinfo-", dir="/dev/shm"))
    try:
        yield root
    finally:
        shutil.rmtree(root)


@pytest.fixture
def fd_listings(monkeypatch):
    """Counts the listings of fd tables (``os.listdir`` of a directory fd)."""
    calls = []
    real = os.listdir

    def counting(path="."):
        if isinstance(path, int):
            calls.append(path)
        return real(path)

    monkeypatch.setattr(os, "listdir", counting)
    return calls


def test_a_re_verification_of_an_unchanged_table_reads_its_links_without_listing_it(tmpfs_path, shared_fixtures,
                                                                                     readlinks, fd_listings):
    """Where the fd directory's size counts its entries, a table as large as at its last listing
    holds the same numbers unless one of them closed: the re-verification readlinks the numbers
    known and lists the table only when one is gone."""
    proc, _, src, clock = _node(tmpfs_path, shared_fixtures)
    src.open()
    node = Node(proc, src, clock, shared_fixtures)
    node.poll()
    fd_listings.clear()
    readlinks.clear()
    for _ in range(int(VERIFY)):
        node.poll()
    assert len(readlinks) >= 5 * 30 - 5  # every table re-verified ...
    assert fd_listings == []  # ... none listed again


def test_a_new_number_in_a_table_of_unchanged_size_is_caught_by_the_re_verification(tmpfs_path, shared_fixtures,
                                                                                      readlinks, fd_listings):
    """A process that closed one fd and opened the GPU under another number between two checks
    (its fd count unchanged): the re-verification finds a known number gone, lists the table and
    finds the client within the reuse bound."""
    node = _steady_node(tmpfs_path, shared_fixtures)
    proc = node.proc
    (proc / "103" / "fd" / "5").unlink()  # fd 5 (a socket) closed ...
    node.add_client(103, 77, 903)  # ... and the GPU opened as fd 77: still 30 fds
    took = node.seconds_until_counted(103)
    assert 2 < took <= BOUND_REUSED
    assert fd_listings  # the table listed once a known number was found gone


def test_a_client_that_reopens_its_gpu_under_a_new_number_is_found_by_the_next_check(tmpfs_path, shared_fixtures):
    """pid 100 opens the render node again as fd 77, then closes its client fd 3: as many fds as
    before.  Forgetting fd 3 leaves the known numbers short of the table, so the table's size
    no longer vouches for them: the next check lists it (it was never listed again)."""
    node = _steady_node(tmpfs_path, shared_fixtures)
    proc = node.proc
    node.add_client(100, 77, 217)
    del node.clients[(100, 3)]
    for sub in ("fd", "fdinfo"):
        (proc / "100" / sub / "3").unlink()
    assert node.seconds_until_counted(100) <= BOUND_NEW_NUMBER


def test_a_known_number_gone_in_the_part_of_a_verification_the_budget_left_is_still_caught(tmpfs_path,
                                                                                           shared_fixtures):
    """Tables larger than the poll's fd budget are verified over two polls: a known number found
    closed in the second part makes the next check list the table, as in the first."""
    node = _steady_node(tmpfs_path, shared_fixtures, procs=2, fds=150, scan_max_fds=100)
    proc = node.proc
    (proc / "101" / "fd" / "149").unlink()  # a known number past the first 100 closed ...
    node.add_client(101, 500, 901)  # ... and the GPU opened under a new one: still 150 fds
    assert node.seconds_until_counted(101) <= BOUND_REUSED + BOUND_NEW_NUMBER


@pytest.fixture
def fd_dir_opens(monkeypatch):
    """Counts the opens (``os.open``) and ``lstat``s of fd directories (``<pid>/fd``)."""
    calls: dict[str, list[str]] = {"open": [], "lstat": []}
    real_open, real_lstat = os.open, os.lstat

    def opening(path, *args, **kw):
        if os.fspath(path).endswith("/fd"):
            calls["open"].append(os.fspath(path))
        return real_open(path, *args, **kw)

    def lstating(path, *args, **kw):
        if os.fspath(path).endswith("/fd"):
            calls["lstat"].append(os.fspath(path))
        return real_lstat(path, *args, **kw)

    monkeypatch.setattr(os, "open", opening)
    monkeypatch.setattr(os, "lstat", lstating)
    return calls


def test_a_check_of_a_table_of_unchanged_size_is_one_lstat(tmpfs_path, shared_fixtures, fd_dir_opens):
    """Where the fd directory's size counts its entries, a due check of a table as large as at
    its last listing does not open it: one ``lstat`` (no re-verification falls in the window; a
    poll time budget no pause of a loaded machine reaches)."""
    node = _steady_node(tmpfs_path, shared_fixtures, scan_verify_period=1000.0)
    fd_dir_opens["open"].clear()
    for _ in range(int(CHECK) + 1):
        node.poll()
    checked = {p.rsplit("/", 2)[-2] for p in fd_dir_opens["lstat"]}
    assert checked >= {"100", "101", "102", "103", "104"}  # every table checked ...
    assert fd_dir_opens["open"] == []  # ... none opened


def test_a_new_number_in_a_table_of_grown_size_is_found_by_the_next_check(tmpfs_path, shared_fixtures):
    """The ``lstat`` of a check sees the table grow: it is opened and listed, the client counted
    within the new-number bound."""
    node = _steady_node(tmpfs_path, shared_fixtures, scan_verify_period=1000.0)
    node.add_client(102, 40, 902)
    assert node.seconds_until_counted(102) <= BOUND_NEW_NUMBER


def test_a_symlinked_fd_directory_is_never_vouched_for_by_its_size(tmpfs_path):
    """``same_size`` trusts only a directory: a link (a fixture tree another user shapes) whose own
    size happens to match is not one, and neither is a path that is gone."""
    from exporter.sources.fdinfo_tables import same_size

    table = tmpfs_path / "1" / "fd"
    table.mkdir(parents=True)
    for n in range(3):
        (table / str(n)).symlink_to("/dev/null")
    size = os.lstat(table).st_size
    assert same_size(str(table), size)
    link = tmpfs_path / "2" / "fd"
    link.parent.mkdir()
    link.symlink_to("x" * size)  # a link's size is its target's length
    assert os.lstat(link).st_size == size and not same_size(str(link), size)
    assert not same_size(str(tmpfs_path / "3" / "fd"), size)
