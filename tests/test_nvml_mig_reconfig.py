"""MIG reconfiguration between polls: no count lands on an instance that is gone.

The NVML source reads MIG devices with handles taken at its last MIG scan (every
``mig_rescan_polls`` polls, 30 by default).  When an instance is destroyed and another created
between two polls, a handle of the old scan is stale; the faithful fake
(tests/fakes/pynvml_fake.py) answers NOT_FOUND for it, or, with ``mig_handles: "slot"``, answers
for whichever instance now sits at its enumeration index (NVML documents neither).  Either way
the next poll rescans, and a process is counted in the GPU instance its own entry names.
"""

from __future__ import annotations

from exporter.sources.context import SourceContext
from exporter.sources.nvml import NvmlSource
from tests.fakes import pynvml_fake as pf

GIB = 1 << 30
EVIDENCE = "client.evidence"


def _poll(src: NvmlSource, fake) -> tuple[dict[str, float], str]:
    """(clients per GPU instance, the evidence reason: "" when complete)."""
    sample = src.poll()
    fake.fake_advance(1.0)
    counts = {dict(r.labels)["gpu_instance"]: r.value for r in sample.readings if r.field == "client.contexts"}
    [reason] = [dict(r.labels)["reason"] for r in sample.readings if r.field == EVIDENCE]
    return counts, reason


def _source(gpu: dict):
    fake = pf.make_module([gpu])
    src = NvmlSource(SourceContext(options={"xid": False}), module=fake, clock=fake.fake_time)
    src.open()
    return src, fake


def test_a_destroyed_instance_is_rescanned_on_the_next_poll_not_in_30():
    """GI 1 (two tenants) is destroyed and GI 3 created in its place between polls: the poll
    that meets the stale handle has no count for GI 1 and partial evidence; the next one has
    rescanned and counts GI 3's tenant under GI 3."""
    src, fake = _source(pf.h100_mig_shared(0))
    try:
        assert _poll(src, fake) == ({"1": 2, "2": 1}, "")
        fake.fake_destroy_gpu_instance(0, 1)
        fake.fake_create_gpu_instance(0, {"gi": 3, "ci": 0, "profile": "3g.40gb", "gpm": {3: 30.0, 10: 20.0},
                                          "memory": {"total": 40 * GIB, "reserved": 0, "used": GIB,
                                                     "free": 39 * GIB}})
        fake.fake_state["gpus"][0]["processes"].append({"pid": 5301, "name": "new", "mem": GIB, "gi": 3, "ci": 0})
        counts, reason = _poll(src, fake)
        assert counts == {"2": 1} and reason == "read_error"   # the stale handle answers NOT_FOUND
        assert _poll(src, fake) == ({"2": 1, "3": 1}, "")     # rescanned at once
        assert fake.fake_calls["nvmlDeviceGetMigDeviceHandleByIndex"] > 0
    finally:
        src.close()


def test_a_handle_that_answers_for_another_instance_is_not_trusted():
    """A driver whose MIG handle is an enumeration slot: after GI 13 is destroyed, the handle
    scanned as GI 13 answers for GI 11.  Its process is counted in GI 11 (the entry's
    gpuInstanceId), never in GI 13, the evidence is partial, and the next poll rescans."""
    gpu = pf.a100_mig_busy(0)
    gpu["mig_handles"] = "slot"
    src, fake = _source(gpu)
    try:
        assert _poll(src, fake) == ({"13": 2, "11": 1}, "")
        fake.fake_destroy_gpu_instance(0, 13)
        counts, reason = _poll(src, fake)
        assert "13" not in counts and counts == {"11": 1} and reason == "read_error"
        assert _poll(src, fake) == ({"11": 1}, "")
    finally:
        src.close()
