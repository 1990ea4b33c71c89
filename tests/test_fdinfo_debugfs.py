"""DRM core's debugfs client list as the scanner's authority on new DRM clients (issue 35).

With every counted card's ``<sysfs>/kernel/debug/dri/<minor>/clients`` readable, a process with a
new drm_file is examined at the next poll and the blind re-verification of every other fd table
stops (one real one in ``LIST_VERIFY_EVERY``); where the list does not hold, the scanner falls
back to the re-verification for that poll and counts it.  Cost is counted in ``readlink`` calls
on fd tables, never timed."""

from __future__ import annotations

import os

from exporter.sources import fdinfo_debugfs
from exporter.sources.fdinfo_debugfs import LIST_VERIFY_EVERY, parse
from tests.fdinfo_trees import add_fd, write_clients
from tests.test_fdinfo_incremental import BOUND_NEW_NUMBER, BOUND_REUSED, VERIFY, Node, _node

LISTED = [("Xorg", 2), ("app", 100)]  # pid 100 holds the node's one amdgpu client (fd 3)


def _steady(tmp_path, shared_fixtures, rows=LISTED, **kw):
    proc, sysfs, src, clock = _node(tmp_path, shared_fixtures)  # the wall-time budget far off (_node)
    path = write_clients(sysfs, 0, rows, **kw) if rows is not None else None
    src.open()
    node = Node(proc, src, clock, shared_fixtures)
    for _ in range(5):
        node.poll()
    return node, sysfs, path


# ------------------------------------------------------------------------- the file's format
def test_every_kernel_layout_is_read_from_the_end_of_its_lines(tmp_path):
    for layout in ("tgid", "name", "id"):
        text = write_clients(tmp_path / layout, 0, [("Xorg", 1234), ("a b c", 77), ("a b c", 77)],
                             layout=layout).read_text()
        assert parse(text) == ({"1234": 1, "77": 2}, 0)


def test_an_older_kernel_listing_threads_is_not_used(tmp_path):
    assert parse(write_clients(tmp_path, 0, [("app", 5)], layout="pid").read_text()) is None


def test_a_command_holding_a_newline_cannot_hide_its_line(tmp_path):
    """comm is the process's own (prctl PR_SET_NAME, newlines allowed): what comes before the
    newline is a malformed line, the kernel's fields still end the real one."""
    text = write_clients(tmp_path, 0, [("x\n1 0 y", 4242)]).read_text()
    assert parse(text) == ({"4242": 1}, 1)


def test_malformed_lines_are_skipped_and_counted_and_the_bounds_hold(tmp_path):
    text = write_clients(tmp_path, 0, [("app", 5)]).read_text()
    assert parse(text + "garbage\n   12 zz   n    y 0 0 <unset> 3\n") == ({"5": 1}, 2)
    assert parse("nonsense header\n") is None
    head = text.split("\n")[0]
    assert parse(head + "\n" + "x\n" * (fdinfo_debugfs.MAX_LINES + 1)) is None  # too many lines


# ------------------------------------------------------------------------- the scanner with it
def test_a_reused_fd_number_in_a_listed_process_is_found_at_the_next_poll(tmp_path, shared_fixtures, readlinks):
    node, sysfs, _ = _steady(tmp_path, shared_fixtures)
    # fd 12 of pid 103 was a socket: closed, and the number reused for the GPU between two polls;
    # the kernel lists the new drm_file under 103
    node.add_client(103, 12, 903)
    write_clients(sysfs, 0, LISTED + [("app", 103)])
    assert node.seconds_until_counted(103) <= 2  # without the list: the next re-verification (<= 52 s)
    assert node.src._scanner.fds.clients.used


def test_with_the_list_unlisted_processes_are_not_re_verified(tmp_path, shared_fixtures, readlinks):
    node, _, _ = _steady(tmp_path, shared_fixtures)
    readlinks.clear()
    for _ in range(int(VERIFY) + 10):  # a whole verify_period: every table was due once
        sample = node.poll()
    assert len(readlinks) < 30  # without the list: every fd of every process again (>= 150)
    assert not sample.errors.get("clients_list_unavailable")
    assert [r.value for r in sample.readings if r.field == "client.evidence"] == [1.0]  # not partial


def test_the_list_keeps_a_slow_real_re_verification(tmp_path, shared_fixtures, readlinks):
    """An fd handed over (SCM_RIGHTS, fork) is no new drm_file: every LIST_VERIFY_EVERY-th
    re-verification still readlinks every fd."""
    node, _, _ = _steady(tmp_path, shared_fixtures)
    node.add_client(103, 12, 903)  # not listed: as if received from another process, not yet used
    took = node.seconds_until_counted(103, limit=int(LIST_VERIFY_EVERY * VERIFY) + 10)
    assert VERIFY < took <= LIST_VERIFY_EVERY * VERIFY + 2


def test_a_count_that_stays_above_the_known_fds_backs_off(tmp_path, shared_fixtures, readlinks):
    """pid 104 listed with a drm_file it does not hold (its child does, or a kernel client
    names a pid since reused): examined at once, then ever more rarely, never every poll."""
    node, sysfs, _ = _steady(tmp_path, shared_fixtures)
    write_clients(sysfs, 0, LISTED + [("app", 104)])
    readlinks.clear()
    node.poll()
    assert len(readlinks) >= 30  # at once: its 30 fds
    for _ in range(59):
        node.poll()
    assert 2 <= len(readlinks) / 30 <= 12  # then 1, 2, 4, 8, 15, 15, ... s apart (not 60 times)


def test_an_unreadable_list_falls_back_to_the_re_verification_and_is_counted(tmp_path, shared_fixtures, readlinks):
    node, sysfs, path = _steady(tmp_path, shared_fixtures)
    path.write_text("not the kernel's header\n")
    node.add_client(103, 12, 903)
    write_errors = []
    took = None
    for second in range(1, int(BOUND_REUSED) + 1):
        sample = node.poll()
        write_errors.append(sample.errors.get("clients_list_unavailable", 0))
        if any(dict(r.labels)["client"] == "103" for r in sample.readings if r.field == "client.engine_utilization"):
            took = second
            break
    assert took is not None and 2 < took <= BOUND_REUSED  # today's bound, not the list's
    assert set(write_errors) == {1}  # every poll that fell back is counted
    assert not node.src._scanner.fds.clients.used


def test_a_counted_card_without_its_file_falls_back(tmp_path, shared_fixtures, readlinks):
    node, sysfs, _ = _steady(tmp_path, shared_fixtures)
    from tests.fdinfo_trees import add_card
    add_card(sysfs, 1, "0000:09:00.0", driver="amdgpu")  # a second amdgpu card, no dri/1/clients
    sample = node.poll()
    assert sample.errors["clients_list_unavailable"] == 1 and not node.src._scanner.fds.clients.used


def test_malformed_lines_are_counted_the_rest_used(tmp_path, shared_fixtures, readlinks):
    node, sysfs, path = _steady(tmp_path, shared_fixtures)
    path.write_text(path.read_text() + "junk line\n")
    sample = node.poll()
    assert sample.errors["clients_list_malformed"] == 1 and node.src._scanner.fds.clients.used


def test_a_procfs_of_another_pid_namespace_does_not_use_the_list(tmp_path, shared_fixtures, readlinks):
    """The kernel prints tgids in the reader's PID namespace (pid_vnr): a host /proc read from a
    container with its own PID namespace names other numbers."""
    node, sysfs, _ = _steady(tmp_path, shared_fixtures)
    os.symlink(str(os.getpid() + 1), node.proc / "self")
    sample = node.poll()
    assert sample.errors["clients_list_unavailable"] == 1 and not node.src._scanner.fds.clients.used


def test_no_debugfs_at_all_is_the_old_behaviour_uncounted(tmp_path, shared_fixtures, readlinks):
    node, _, _ = _steady(tmp_path, shared_fixtures, rows=None)
    sample = node.poll()
    assert "clients_list_unavailable" not in sample.errors and not node.src._scanner.fds.clients.used


def test_the_counted_cards_are_found_by_driver_link_or_uevent(tmp_path):
    from tests.fdinfo_trees import add_card
    sysfs = tmp_path / "sys"
    add_card(sysfs, 0, "0000:08:00.0", driver="amdgpu")
    add_card(sysfs, 1, "0000:09:00.0", driver="ast")  # the BMC's VGA: no list needed
    add_card(sysfs, 2, "0000:0a:00.0", symlink=False)  # a capture: uevent DRIVER=i915
    assert fdinfo_debugfs.ClientList(str(tmp_path / "proc"), str(sysfs)).minors() == ["0", "2"]


def test_before_linux_6_7_the_list_is_a_hint_and_the_re_verification_stays(tmp_path, shared_fixtures, readlinks,
                                                                           monkeypatch):
    """Before drm_file_update_pid (Linux 6.7) an fd handed to another process stays listed under
    its opener: new drm_files still send their pid to be examined at once, but every table is
    re-verified every period as without the list."""
    assert fdinfo_debugfs.kernel_release("6.6.30-generic") < fdinfo_debugfs.HANDOVER_KERNEL
    assert fdinfo_debugfs.kernel_release("6.8.0-45-generic") >= fdinfo_debugfs.HANDOVER_KERNEL
    monkeypatch.setattr(fdinfo_debugfs, "kernel_release", lambda release=None: (6, 6))
    node, sysfs, _ = _steady(tmp_path, shared_fixtures)
    readlinks.clear()
    for _ in range(int(VERIFY) + 10):
        node.poll()
    assert len(readlinks) >= 150 - 5  # every fd of every process again
    node.add_client(103, 12, 903)
    write_clients(sysfs, 0, LISTED + [("app", 103)])
    assert node.seconds_until_counted(103) <= 2  # the hint still holds


def test_a_pid_new_to_the_list_is_examined_though_it_holds_another_drm_fd(tmp_path, shared_fixtures, readlinks):
    """pid 103 holds a DRM fd of an uncounted card (its count of DRM fds is 1), then opens the
    amdgpu render node under a reused number: its first line in the list is a rise from 0."""
    node, sysfs, _ = _steady(tmp_path, shared_fixtures)
    add_fd(node.proc, 103, 40, "/dev/dri/card1", "pos:\t0\nflags:\t02\ndrm-driver:\tast\n")
    for _ in range(int(BOUND_NEW_NUMBER)):  # found by a check: a known DRM fd of pid 103
        node.poll()
    node.add_client(103, 12, 903)  # fd 12 (a socket) reused for the GPU
    write_clients(sysfs, 0, LISTED + [("app", 103)])
    assert node.seconds_until_counted(103) <= 2


def test_a_line_that_comes_and_goes_backs_off(tmp_path, shared_fixtures, readlinks):
    """A line every other poll (a user opening and closing a drm_file, or one a forged comm
    adds) naming a pid with no client: examined at once, then ever more rarely."""
    node, sysfs, _ = _steady(tmp_path, shared_fixtures)
    readlinks.clear()
    for i in range(60):
        write_clients(sysfs, 0, LISTED + ([("app", 104)] if i % 2 == 0 else []))
        node.poll()
    assert 2 <= len(readlinks) / 30 <= 12  # 1, 2, 4, 8, 15, 15, ... s apart (not 30 times)


def test_a_list_too_large_is_not_read_every_poll(tmp_path, shared_fixtures, monkeypatch):
    """The kernel builds the whole file under the device's file-list lock before the first byte:
    a list over the bound is read again after 1, 2, 4, ... polls, not at every one."""
    node, sysfs, _ = _steady(tmp_path, shared_fixtures)
    from exporter import safefile

    reads = []
    real = safefile.read_at

    def counting(dir_fd, name, limit, **kw):
        if name == "clients":
            reads.append(node.tick)
        return real(dir_fd, name, limit, **kw)

    monkeypatch.setattr(safefile, "read_at", counting)
    monkeypatch.setattr(fdinfo_debugfs, "MAX_BYTES", 64)  # the list of _steady is larger
    for _ in range(16):
        sample = node.poll()
        assert sample.errors.get("clients_list_unavailable") == 1  # every poll says so
    assert [r - reads[0] for r in reads] == [0, 2, 5, 10]  # then 1, 2, 4 polls skipped



def test_with_the_list_the_checks_stay_for_a_drm_file_its_counts_hide(tmp_path, shared_fixtures):
    """The list's counts are drm_files, the scanner's DRM fds (a dup'd fd is one drm_file): a
    process that opens a new drm_file and closes another between two polls shows the same count,
    so only the check for new fd numbers finds it (within scan_check_period + 2 polls)."""
    proc, sysfs, src, clock = _node(tmp_path, shared_fixtures)
    src.open()
    node = Node(proc, src, clock, shared_fixtures)
    node.add_client(102, 40, 302)
    node.add_client(102, 41, 302)  # a dup of fd 40: the same drm_file (Mesa's winsys dups it)
    node.add_client(102, 42, 303)
    write_clients(sysfs, 0, LISTED + [("app", 102), ("app", 102)])
    for _ in range(5):
        node.poll()
    assert src._scanner.fds.clients.used
    node.add_client(102, 44, 904)  # a new drm_file under a new number ...
    del node.clients[(102, 42)]  # ... and drm_file 303 closed: still two lines for 102
    (proc / "102" / "fd" / "42").unlink()
    (proc / "102" / "fdinfo" / "42").unlink()
    st = src._scanner.fds._pids["102"]
    took = 0
    while "44" not in st.drm and took < 600:
        node.poll()
        took += 1
    assert took <= BOUND_NEW_NUMBER  # skipping the checks where the list holds: 414 s
