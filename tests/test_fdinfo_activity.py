"""The second voucher of the fdinfo scan's re-verification (issue 35): a process whose
``<pid>/stat`` fingerprint (starttime, threads, faults, CPU time, vsize, rss) is as at its last
real verification did nothing since, so its due re-verification becomes a check; one real one in
``LIST_VERIFY_EVERY`` whichever voucher stood in.  Cost is counted in ``readlink`` calls on fd
tables, per process, never timed."""

from __future__ import annotations

import errno
import os
from collections import Counter
from pathlib import Path

import pytest

from exporter.sources import fdinfo_activity
from exporter.sources.fdinfo_debugfs import LIST_VERIFY_EVERY
from exporter.sources.fdinfo_scan import FdScanner
from tests.fdinfo_trees import add_fd, stat_text, write_clients, write_stat
from tests.test_fdinfo_incremental import BOUND_REUSED, VERIFY, Node, _node

PIDS = range(100, 105)  # _node's processes: 30 fds each, pid 100 also the amdgpu client (fd 3)


@pytest.fixture
def links_by_pid(monkeypatch):
    """``readlink`` calls on fd tables, counted per pid (the table's directory fd names it)."""
    calls: Counter = Counter()
    real = os.readlink

    def counting(path, *, dir_fd=None):
        if dir_fd is not None:
            calls[int(Path(real(f"/proc/self/fd/{dir_fd}")).parent.name)] += 1
        return real(path, dir_fd=dir_fd)

    monkeypatch.setattr(os, "readlink", counting)
    return calls


class Busy(Node):
    """``Node`` whose processes in ``running`` show activity in their stat every poll."""

    running: set[int]

    def poll(self):
        for pid in self.running:
            write_stat(self.proc, pid, utime=40 + self.tick, minflt=2000 + 7 * self.tick)
        return super().poll()


def _steady(tmp_path: Path, shared_fixtures: Path, running=(), listed: bool = False) -> Busy:
    """``_node`` with a stat file for every process, opened and polled 5 times."""
    proc, sysfs, src, clock = _node(tmp_path, shared_fixtures)
    write_stat(proc, 2, comm="kthreadd")
    for pid in PIDS:
        write_stat(proc, pid)
    if listed:
        write_clients(sysfs, 0, [("app", 100)])
    src.open()
    node = Busy(proc, src, clock, shared_fixtures)
    node.running = set(running)
    for _ in range(5):
        node.poll()
    return node


def _records(node: Node) -> dict:
    return node.src._scanner.fds._pids


# ------------------------------------------------------------------------- vouched for
def test_an_idle_process_s_due_verification_reads_no_fd_links(tmp_path, shared_fixtures, links_by_pid):
    node = _steady(tmp_path, shared_fixtures)
    links_by_pid.clear()
    for _ in range(int(VERIFY)):  # a whole verify_period: every table due once
        sample = node.poll()
    assert not any(links_by_pid[p] for p in PIDS)  # without the voucher: 30 each
    assert all(_records(node)[str(p)].vouched >= 1 for p in PIDS)  # each was due, and vouched for
    assert [r.value for r in sample.readings if r.field == "client.evidence"] == [1.0]  # never overdue


def test_a_process_whose_stat_changed_is_verified_for_real(tmp_path, shared_fixtures, links_by_pid):
    node = _steady(tmp_path, shared_fixtures, running={103})
    links_by_pid.clear()
    for _ in range(int(VERIFY)):  # every table due once
        node.poll()
    assert links_by_pid[103] == 30  # its whole table, once
    assert not any(links_by_pid[p] for p in PIDS if p != 103)


def test_a_reused_fd_number_in_a_running_process_is_found_within_the_verify_period(tmp_path, shared_fixtures,
                                                                                   links_by_pid):
    node = _steady(tmp_path, shared_fixtures, running={103})
    links_by_pid.clear()
    node.add_client(103, 12, 903)  # fd 12 (a socket) closed and reused for the GPU: 30 fds still
    took = node.seconds_until_counted(103)
    assert 2 < took <= BOUND_REUSED
    assert not any(links_by_pid[p] for p in PIDS if p != 103)  # the idle ones were not re-read


def test_a_reused_fd_number_in_an_idle_process_waits_for_the_one_in_ten(tmp_path, shared_fixtures, links_by_pid):
    """An fd received (or opened) by a process that then does not run: nothing in its stat
    changes, and the real re-verification every LIST_VERIFY_EVERY periods finds it."""
    node = _steady(tmp_path, shared_fixtures)
    node.add_client(103, 12, 903)
    took = node.seconds_until_counted(103, limit=int(LIST_VERIFY_EVERY * VERIFY) + 10)
    assert VERIFY < took <= LIST_VERIFY_EVERY * VERIFY + 2  # docs/detection.md's bound


def test_a_pid_reused_by_another_process_is_verified_for_real(tmp_path, shared_fixtures, links_by_pid):
    """pid 103 exits and a new process gets its number between two polls, with as many fds (one
    of them the GPU) and, by chance, the same counters: its start time differs."""
    node = _steady(tmp_path, shared_fixtures)
    write_stat(node.proc, 103, starttime=987654)
    node.add_client(103, 12, 903)
    links_by_pid.clear()
    assert 2 < node.seconds_until_counted(103) <= BOUND_REUSED
    assert not any(links_by_pid[p] for p in PIDS if p != 103)


# ------------------------------------------------------------------------- hostile or missing stat
def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _symlink(path: Path) -> None:
    os.symlink("/proc/self/stat", path)


def _huge(path: Path) -> None:
    path.write_text(stat_text(104) + " 0" * 4096)


@pytest.mark.parametrize("make", [_fifo, _symlink, _huge])
def test_an_unreadable_stat_means_a_real_verification_and_is_counted(tmp_path, shared_fixtures, links_by_pid, make):
    node = _steady(tmp_path, shared_fixtures)
    (node.proc / "104" / "stat").unlink()
    make(node.proc / "104" / "stat")  # not the kernel's file: never followed, never waited on
    (node.proc / "103" / "stat").unlink()  # missing (exited meanwhile; a fixture without one): not counted
    links_by_pid.clear()
    errors = Counter()
    for _ in range(int(VERIFY)):  # every table due once
        errors.update(node.poll().errors)
    assert links_by_pid[104] == 30 and links_by_pid[103] == 30
    assert not any(links_by_pid[p] for p in PIDS if p not in (103, 104))
    assert errors["stat_unreadable"] == 1 and not errors["stat_malformed"]


@pytest.mark.parametrize("text", ["", "garbage\n", "104 (app) S 1 2 3\n", stat_text(105),  # another pid's
                                  stat_text(104).replace(" 40 9 ", " 4_0 9 "), stat_text(104).replace(" 40 9 ", " -40 9 "),
                                  stat_text(104).replace("(app)", "app")])
def test_a_malformed_stat_means_a_real_verification_and_is_counted(tmp_path, shared_fixtures, links_by_pid, text):
    node = _steady(tmp_path, shared_fixtures)
    (node.proc / "104" / "stat").write_text(text)
    links_by_pid.clear()
    errors = Counter()
    for _ in range(int(VERIFY)):  # every table due once
        errors.update(node.poll().errors)
    assert links_by_pid[104] == 30 and not any(links_by_pid[p] for p in PIDS if p != 104)
    assert errors["stat_malformed"] == 1


def test_the_fields_are_read_after_the_last_parenthesis():
    """comm is the process's own (PR_SET_NAME): ')', spaces and newlines cannot shift the fields."""
    plain = fdinfo_activity.parse(stat_text(7).encode(), "7")
    forged = stat_text(7, comm="x) S 1 7 7 0 -1 0 9 9 9 9 9 9 9\n(y").encode()
    assert plain is not None and fdinfo_activity.parse(forged, "7") == plain
    assert fdinfo_activity.parse(stat_text(7, utime=41).encode(), "7") != plain
    assert fdinfo_activity.parse(Path(f"/proc/{os.getpid()}/stat").read_bytes(), str(os.getpid())) is not None


def test_small_tables_are_verified_without_reading_stat(tmp_path, shared_fixtures, monkeypatch, links_by_pid):
    """Below MIN_FDS fds the readlinks cost less than the stat read that would spare them."""
    node = _steady(tmp_path, shared_fixtures)
    for fd in range(fdinfo_activity.MIN_FDS - 1):
        add_fd(node.proc, 600, fd, f"pipe:[{fd}]")
    write_stat(node.proc, 600)
    node.poll()  # its first examination (fingerprint taken)
    reads = []
    real = fdinfo_activity.fingerprint
    monkeypatch.setattr(fdinfo_activity, "fingerprint", lambda procfs, pid, errors: reads.append(pid) or real(
        procfs, pid, errors))
    links_by_pid.clear()
    for _ in range(int(VERIFY)):  # every table due once
        node.poll()
    assert "600" not in reads and links_by_pid[600] == fdinfo_activity.MIN_FDS - 1


# ------------------------------------------------------------------------- with the debugfs list
def test_the_two_vouchers_share_the_one_real_verification_in_ten(tmp_path, shared_fixtures, links_by_pid):
    """The client list holds on every other poll only (its file unreadable on the others): on a
    poll without it the idle process's stat vouches instead, and whichever stood in, never more
    than LIST_VERIFY_EVERY - 1 re-verifications in a row are vouched for."""
    node = _steady(tmp_path, shared_fixtures, listed=True)
    clients = next((tmp_path / "sys" / "kernel" / "debug" / "dri").glob("*/clients"))
    good = clients.read_text()
    links_by_pid.clear()
    most = 0
    for i in range(int(LIST_VERIFY_EVERY * VERIFY) + 10):
        clients.write_text(good if i % 2 else "not the kernel's header\n")
        node.poll()
        most = max(most, *(_records(node)[str(p)].vouched for p in PIDS))
    assert most == LIST_VERIFY_EVERY - 1
    assert all(links_by_pid[p] == 30 for p in PIDS)  # one real re-verification each in ten periods


def test_a_real_verification_that_failed_does_not_vouch_for_what_the_process_did(tmp_path, shared_fixtures,
                                                                                 monkeypatch):
    """The fingerprint holds once a real examination is done whole: one whose fd table could not
    be opened (EMFILE, the exporter at its fd limit) is tried again, still against the fingerprint
    from before the last real one, so a process that ran is verified for real at the next poll."""
    node = _steady(tmp_path, shared_fixtures)
    write_stat(node.proc, 103, utime=77, minflt=2100)  # it ran once (opened the GPU), then sleeps
    node.add_client(103, 12, 903)  # under a reused number
    monkeypatch.setattr(FdScanner, "_examine", _failing_once(examine_103 := [], "103"))
    took = node.seconds_until_counted(103, limit=int(LIST_VERIFY_EVERY * VERIFY) + 10)
    assert examine_103 and took <= BOUND_REUSED + 1  # the fingerprint taken at the failed try: 481 s


def test_a_real_verification_that_failed_keeps_the_one_in_ten(tmp_path, shared_fixtures, monkeypatch):
    """Only a real verification done whole restarts the count of vouched ones: an idle process's
    tenth (real) one failing to open the table is tried again at the next poll, not ten periods on."""
    node = _steady(tmp_path, shared_fixtures)
    node.add_client(103, 12, 903)  # received under a reused number, never run since
    monkeypatch.setattr(FdScanner, "_examine", _failing_once(failed := [], "103"))
    took = node.seconds_until_counted(103, limit=int(2 * LIST_VERIFY_EVERY * VERIFY) + 10)
    assert failed and took <= LIST_VERIFY_EVERY * VERIFY + 3  # the counter reset by the failure: 1,000 s


def _failing_once(failed: list, pid: str):
    """``FdScanner._examine`` whose first real verification of ``pid`` cannot open its fd table
    (EMFILE: the exporter at its fd limit)."""
    real_open, real_examine = os.open, FdScanner._examine

    def examine(self, p, st, verify, budget, now):
        if p != pid or not verify or failed:
            return real_examine(self, p, st, verify, budget, now)
        failed.append(1)

        def emfile(path, *a, **kw):
            if os.fsdecode(path).endswith(f"/{pid}/fd"):
                raise OSError(errno.EMFILE, "Too many open files")
            return real_open(path, *a, **kw)

        os.open = emfile
        try:
            return real_examine(self, p, st, verify, budget, now)
        finally:
            os.open = real_open

    return examine
