"""XID events: background event-set wait, counts per code, last timestamp, clean stop."""

from __future__ import annotations

import time

from exporter.sources.context import SourceContext
from exporter.sources.nvml import NvmlSource
from tests.fakes import pynvml_fake as pf

H100_KEY = "0000:19:00.0"


def _wait_for(pred, timeout=3.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return False


def test_xid_counts_per_code_and_last_timestamp():
    fake = pf.make_module([pf.h100(0), pf.t4(1)])
    src = NvmlSource(SourceContext(options={"xid_timeout_ms": 20}), module=fake)
    src.open()
    try:
        s0 = src.poll()
        assert not [r for r in s0.readings if r.field.startswith("xid.")]  # no event: no series
        before = time.time()
        for code in (79, 79, 48):
            fake.fake_inject_xid(0, code)
        fake.fake_inject_xid(1, 13)
        assert _wait_for(lambda: sum(sum(c.values()) for c in src.xid.snapshot()[0].values()) == 4)
        s = src.poll()
    finally:
        watcher = src.xid
        src.close()
    got = {(r.device, r.field, r.labels): r.value for r in s.readings if r.field.startswith("xid.")}
    assert got[(H100_KEY, "xid.count", (("xid", "79"),))] == 2
    assert got[(H100_KEY, "xid.count", (("xid", "48"),))] == 1
    assert got[("0000:3c:00.0", "xid.count", (("xid", "13"),))] == 1
    assert before <= got[(H100_KEY, "xid.last_timestamp", ())] <= time.time()
    assert not watcher.running                        # the thread stopped on close()
    assert all(es.freed for es in fake.fake_state["event_sets"])
    assert fake.fake_calls["nvmlEventSetWait_v2"] >= 4


def test_xid_not_supported_is_counted_once():
    spec = pf.t4(0)
    spec["xid_supported"] = False
    fake = pf.make_module([spec])
    src = NvmlSource(SourceContext(options={"xid_timeout_ms": 20}), module=fake)
    src.open()
    try:
        first, second = src.poll(), src.poll()
    finally:
        src.close()
    assert first.errors["not_supported"] >= 1 and not second.errors
    assert fake.fake_calls["nvmlEventSetWait_v2"] == 0  # nothing registered: no thread


def test_xid_disabled_by_option():
    fake = pf.make_module([pf.h100(0)])
    src = NvmlSource(SourceContext(options={"xid": False}), module=fake)
    src.open()
    src.close()
    assert fake.fake_calls["nvmlEventSetCreate"] == 0
