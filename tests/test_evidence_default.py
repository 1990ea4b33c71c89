"""Co-tenancy evidence on a default install (issue 24): the busy-client count is collected
without any configuration and without exporting per-process series.

The NVIDIA GPU is the faithful NVML fake (tests/fakes/pynvml_fake.py), run inside the real
exporter process (``tests.fakes.nvml_exporter``); nothing but the fake stands in for hardware.
"""

from __future__ import annotations

import sys

from prometheus_client.parser import text_string_to_metric_families

from exporter.sources.context import SourceContext
from exporter.sources.nvml import NvmlSource
from exporter.testing import flat
from tests.e2e_util import ProcessSet, Server, free_port, http_get, wait_until
from tests.engine_frames import TextEngine, engine_inputs
from tests.fakes import pynvml_fake as pf


def _readings(sample):
    return {(r.field, r.labels): r.value for r in sample.readings}


def test_nvml_counts_clients_by_default_without_names_or_memory(tmp_path):
    fake = pf.make_module([pf.h100(0)])
    src = NvmlSource(SourceContext(procfs=tmp_path, options={"xid": False}), module=fake)
    src.open()
    try:
        r = _readings(src.poll())
    finally:
        src.close()
    assert r[("client.sm_util", (("client", "4242"),))] == 93
    assert r[("client.sm_util", (("client", "4343"),))] == 5
    assert r[("client.evidence", (("evidence", "nvml"), ("reason", "")))] == 1.0
    assert not any(f.startswith("process.") for f, _ in r)  # no per-process series
    assert fake.fake_calls["nvmlDeviceGetComputeRunningProcesses"] == 0  # no memory, no names
    assert fake.fake_calls.get("nvmlSystemGetProcessName", 0) == 0


def test_nvml_processes_off_reads_nothing():
    fake = pf.make_module([pf.h100(0)])
    src = NvmlSource(SourceContext(options={"xid": False, "processes": "off"}), module=fake)
    src.open()
    try:
        r = _readings(src.poll())
    finally:
        src.close()
    assert not any(f.startswith(("client.", "process.")) for f, _ in r)
    assert fake.fake_calls.get("nvmlDeviceGetProcessUtilization", 0) == 0


def _mig_readings(gpu: dict) -> tuple[dict, object]:
    fake = pf.make_module([gpu])
    src = NvmlSource(SourceContext(options={"xid": False}), module=fake)
    src.open()
    try:
        return _readings(src.poll()), fake
    finally:
        src.close()


def test_nvml_mig_counts_compute_contexts_per_instance_with_the_mig_device_handles():
    """A non-root exporter: in MIG mode the parent handle's process list answers NO_PERMISSION
    (NVML gives that aggregate only to a privileged caller); each MIG device's own handle
    answers for its instance.  Before: the parent was asked, and the GPU had no evidence."""
    r, fake = _mig_readings(pf.h100_mig_shared(0))
    assert r[("client.contexts", (("gpu_instance", "1"), ("mig_profile", "3g.40gb")))] == 2
    assert r[("client.contexts", (("gpu_instance", "2"), ("mig_profile", "3g.40gb")))] == 1
    assert r[("client.evidence", (("evidence", "nvml"), ("reason", "")))] == 1.0
    assert fake.fake_calls["nvmlDeviceGetComputeRunningProcesses"] == 2  # one per MIG device


def test_nvml_mig_device_that_does_not_answer_leaves_its_instance_without_a_count():
    """Instance 1's MIG device refuses: no count for instance 1 (never "0 clients"), instance 2
    still counted, the GPU's evidence partial with the reason; all refusing: no count at all."""
    gpu = pf.h100_mig_shared(0)
    gpu["mig"][0]["processes_error"] = pf.ERRORS["NVML_ERROR_NO_PERMISSION"]
    r, _ = _mig_readings(gpu)
    assert not [k for k in r if k[0] == "client.contexts" and ("gpu_instance", "1") in k[1]]
    assert r[("client.contexts", (("gpu_instance", "2"), ("mig_profile", "3g.40gb")))] == 1
    assert r[("client.evidence", (("evidence", "nvml"), ("reason", "no_permission")))] == 0.0
    for m in gpu["mig"]:  # vGPU host mode: per-instance queries are not supported
        m["processes_error"] = pf.ERRORS["NVML_ERROR_NOT_SUPPORTED"]
    r, _ = _mig_readings(gpu)
    assert not [k for k in r if k[0] == "client.contexts"]
    assert r[("client.evidence", (("evidence", "nvml"), ("reason", "not_supported")))] == 0.0


def test_a_mig_instance_without_its_count_is_not_evaluable_rather_than_memory_bound(tmp_path):
    """Through the mapping into the engine: instance 1 (memory-bound signature) whose MIG device
    refused reads unknown, not memory_bound / no_active_client; the evidence self-metric says
    none with the reason."""
    from exporter.indicators import IndicatorConfig
    from exporter.map.mapper import Mapper
    from exporter.map.store import SourceState, Store
    from exporter.run.pipeline import poll_and_map
    from exporter.testing import load_mappings

    gpu = pf.h100_mig_shared(0)
    gpu["mig"][0]["processes_error"] = pf.ERRORS["NVML_ERROR_NO_PERMISSION"]
    fake = pf.make_module([gpu])
    src = NvmlSource(SourceContext(options={"xid": False}), module=fake, clock=fake.fake_time)
    src.open()
    store, state, mapper = Store(), SourceState("nvml"), Mapper(load_mappings())
    store.add(state)
    poll_and_map(src.poll, store, state, mapper, now=1000.0)
    fake.fake_advance(1.0)
    cycle = poll_and_map(src.poll, store, state, mapper, now=1001.0)  # GPM: two samples
    src.close()
    engine = TextEngine(IndicatorConfig(), None, 0.5)
    out = engine.update(1.0, {("nvidia", "0", ""): engine_inputs(flat(cycle.result.frames))})
    assert _out(out, "gpu_memory_state", state="unknown", gpu_instance="1") == [1.0]
    assert _out(out, "gpu_memory_state_info", gpu_instance="1", reason="no_process_data") == [1.0]
    assert _out(out, "gpu_active_clients", gpu_instance="1") == []
    assert _out(out, "gpu_contention_evidence_info", evidence="none", reason="no_permission") == [1.0]


def _serve(tmp_path, gpus: str, until, config: str | None = None,
           flags: tuple[str, ...] = ()) -> dict[tuple[str, tuple], float]:
    """Run the real exporter on the NVML fake with no config (or ``config``; more ``flags``) and
    return the samples of the first /metrics for which ``until(samples)`` holds."""
    empty_sys = tmp_path / "sys"
    empty_sys.mkdir()
    port = free_port()
    args = [sys.executable, "-m", "tests.fakes.nvml_exporter", "--web.listen-address", f"127.0.0.1:{port}",
            "--path.sysfs", str(empty_sys), "--poll.interval", "500ms", *flags]
    if config is not None:
        (tmp_path / "config.yml").write_text(config)
        args += ["--config.file", str(tmp_path / "config.yml")]
    got: dict = {}
    with ProcessSet() as procs:
        exporter = procs.add(Server("exporter", args, port, tmp_path / "exporter.log",
                                    env={"PYTHONUNBUFFERED": "1", "FAKE_NVML_GPUS": gpus, "PATH": "/usr/bin:/bin"},
                                    listen_log=rf"\baddress=127\.0\.0\.1:{port}\b"))
        exporter.start().wait_ready("/readyz", 20)

        def ready() -> bool:
            text = http_get(exporter.url + "/metrics").text
            got.clear()
            got[("__text__", ())] = text
            for fam in text_string_to_metric_families(text):
                for s in fam.samples:
                    got[(s.name, tuple(sorted(s.labels.items())))] = s.value
            return until(got)

        wait_until(ready, timeout=20)
    return got


def _value(samples, name, **labels):
    hits = [v for (n, lab), v in samples.items() if n == name and dict(lab).items() >= labels.items()
            and n != "__text__"]
    return hits


def test_default_install_counts_two_busy_processes_and_evaluates_co_tenancy(tmp_path):
    """No config: the fake H100 has two processes at >= 5 % (93 %, 5 %) and a memory-bound
    signature (88.5 % DRAM bandwidth, 38.25 % occupancy): gpu_active_clients 2, contended, and
    no series names a pid or process."""
    def until(s):
        return _value(s, "gpu_active_clients") == [2.0] and \
            _value(s, "gpu_memory_state", state="contended") == [1.0]

    s = _serve(tmp_path, "h100", until)
    assert _value(s, "gpu_memory_state_info", state="contended", reason="clients") == [1.0]
    assert _value(s, "gpu_contention_evidence_info", evidence="clients", source="nvml") == [1.0]
    text = "\n".join(ln for ln in s[("__text__", ())].splitlines() if not ln.startswith("#"))
    assert "gpu_process_" not in text and 'pid="' not in text and "gpu_client_" not in text
    # the start-up log says which evidence the GPUs have (clients.say_evidence), once per kind
    log = (tmp_path / "exporter.log").read_text()
    assert log.count("co-tenancy evidence of nvidia gpu 0 (GPU-h1000000-0000-0000-0000-000000000000) and GPUs "
                     "like it: busy clients counted by nvml") == 1, log


def test_mig_instances_get_a_state_each_and_processes_of_two_instances_are_no_co_tenants(tmp_path):
    """Instance 1: two compute contexts on a memory-bound signature; instance 2: one process at
    10 % bandwidth (healthy).  NVML gives no per-process utilization in MIG mode, and contexts
    alone prove no co-tenancy (issue 36: an idle inference server holding a context beside one
    job read contended and paged): instance 1 reads unknown / contexts_without_activity, without
    a client count; the GPU reads that (never no_load_signal), and no device-level client count
    adds the instances up."""
    def until(s):
        return _value(s, "gpu_memory_state_info", state="unknown", reason="contexts_without_activity",
                      gpu_instance="1") == [1.0]

    s = _serve(tmp_path, "h100_mig_shared", until)
    assert _value(s, "gpu_memory_state", state="healthy", gpu_instance="2") == [1.0]
    assert not _value(s, "gpu_active_clients", gpu_instance="1")
    assert _value(s, "gpu_active_clients", gpu_instance="2") == [1.0]
    device = {lab: v for (n, lab), v in s.items() if n == "gpu_memory_state" and v == 1.0
              and "gpu_instance" not in dict(lab)}
    assert [dict(lab)["state"] for lab in device] == ["unknown"]
    assert not [1 for (n, lab) in s if n == "gpu_active_clients" and "gpu_instance" not in dict(lab)]
    assert not _value(s, "gpu_memory_state_info", reason="no_load_signal")
    assert not _value(s, "gpu_memory_state", state="contended", gpu_instance="1")[0]


def test_pre_hopper_mig_instances_in_use_are_not_evaluable(tmp_path):
    """An A100 in MIG mode (no GPM, no DCGM): no load signal anywhere, but processes hold compute
    contexts on instances 13 (two) and 11 (one).  Those instances and the GPU read unknown /
    no_instance_load_signal (in use, busy or not), which the info alert GPUMIGInstanceNotEvaluable
    covers; instance 5 (no context) has no state.  Before: the GPU read no_load_signal, which
    every alert excludes."""
    def until(s):
        return _value(s, "gpu_memory_state_info", reason="no_instance_load_signal", gpu_instance="13") == [1.0]

    s = _serve(tmp_path, "a100_mig_busy", until)
    for gi in ("13", "11"):
        assert _value(s, "gpu_memory_state_info", state="unknown", reason="no_instance_load_signal",
                      gpu_instance=gi, mig_profile="1g.5gb") == [1.0]
    assert not _value(s, "gpu_memory_state", gpu_instance="5")
    device = [dict(lab) for (n, lab), v in s.items() if n == "gpu_memory_state_info" and "gpu_instance" not in dict(lab)]
    assert [(d["state"], d["reason"]) for d in device] == [("unknown", "no_instance_load_signal")]
    assert _value(s, "gpu_contention_evidence_info", evidence="clients", source="nvml") == [1.0]


# ------------------------------------------------------------------ DRM fdinfo, count-only
AMD_PDEV = "0000:08:00.0"
_AMD = ("pos:\t0\nflags:\t02100002\ndrm-driver:\tamdgpu\ndrm-pdev:\t" + AMD_PDEV + "\n"
        "drm-client-id:\t{cid}\ndrm-memory-vram:\t1024 KiB\ndrm-engine-gfx:\t{ns} ns\n")


class _Clock:
    t = 100.0

    def __call__(self) -> float:
        return self.t


def _fdinfo_node(tmp_path, host_pid_namespace: bool = True):
    from tests.fdinfo_trees import add_card, add_fd, set_fdinfo

    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    add_card(sysfs, 1, AMD_PDEV, driver="amdgpu")
    for pid in (300, 301):
        add_fd(proc, pid, 5, "/dev/dri/renderD128", _AMD.format(cid=pid, ns=0), comm=f"job{pid}")
    if host_pid_namespace:
        (proc / "2").mkdir()
        (proc / "2" / "comm").write_text("kthreadd\n")

    def advance(busy_ns: dict[int, int]) -> None:
        for pid, ns in busy_ns.items():
            set_fdinfo(proc, pid, 5, _AMD.format(cid=pid, ns=ns))

    return proc, sysfs, advance


def _fdinfo_clients(tmp_path, host_pid_namespace=True, busy=(300, 301)):
    from exporter.indicators import IndicatorConfig
    from exporter.map.mapper import Mapper
    from exporter.map.store import SourceState, Store
    from exporter.run.pipeline import poll_and_map
    from exporter.sources.drm_fdinfo import DrmFdinfoSource
    from exporter.testing import load_mappings

    proc, sysfs, advance = _fdinfo_node(tmp_path, host_pid_namespace)
    clock = _Clock()
    src = DrmFdinfoSource(SourceContext(sysfs=sysfs, procfs=proc), clock=clock)  # default options: count
    src.open()
    store, state = Store(), SourceState("fdinfo")
    state.provides_identity = False
    store.add(state)
    mapper = Mapper(load_mappings())
    poll_and_map(src.poll, store, state, mapper, now=1000.0)
    clock.t += 1.0
    advance({pid: 600_000_000 for pid in busy})  # 60 % of one second each
    cycle = poll_and_map(src.poll, store, state, mapper, now=1001.0)
    src.close()
    series = flat(cycle.result.frames)
    engine = TextEngine(IndicatorConfig(), None, 0.5)
    inputs = {**engine_inputs(series), "gpu_compute_utilization_percent": 99.0,
              "gpu_memory_bandwidth_utilization_percent": 95.0}
    out = engine.update(1.0, {("amd", "1", ""): inputs})
    return series, out


def _out(out, name, **labels):
    return [v for n, lab, v in out if n == name and lab.items() >= labels.items()]


def test_fdinfo_counts_busy_clients_by_default_without_exporting_them(tmp_path):
    series, out = _fdinfo_clients(tmp_path)
    names = {name for name, _ in series}
    assert "gpu_process_utilization_percent" not in names and "gpu_process_memory_bytes" not in names
    assert "gpu_client_utilization_percent" in names
    assert _out(out, "gpu_active_clients") == [2.0]
    assert _out(out, "gpu_memory_state", state="contended") == [1.0]
    assert _out(out, "gpu_contention_evidence_info", evidence="clients", source="fdinfo", reason="") == [1.0]


def test_fdinfo_in_a_private_pid_namespace_says_so_and_proves_only_co_tenancy(tmp_path):
    _, out = _fdinfo_clients(tmp_path / "a", host_pid_namespace=False)
    assert _out(out, "gpu_memory_state", state="contended") == [1.0]  # two clients seen: proof
    assert _out(out, "gpu_contention_evidence_info", evidence="clients", reason="pid_namespace_private") == [1.0]
    _, out = _fdinfo_clients(tmp_path / "b", host_pid_namespace=False, busy=(300,))
    assert _out(out, "gpu_active_clients") == []  # one client seen: the other may be unseen
    assert _out(out, "gpu_memory_state", state="unknown") == [1.0]
    assert _out(out, "gpu_contention_evidence_info", evidence="none", reason="pid_namespace_private") == [1.0]


def test_evidence_is_logged_once_per_kind_with_a_warning_where_there_is_none(caplog):
    """clients.say_evidence through the engine: two GPUs counted by NVML share one info line, a
    GPU without any count gets one warning naming the reason and what to enable, a partial
    count one warning; later updates log nothing new."""
    import logging

    from exporter.indicators import IndicatorConfig

    counted = {'gpu_client_evidence{evidence="nvml",reason=""}': 1.0,
               "gpu_memory_bandwidth_utilization_percent": 90.0}
    partial = {'gpu_client_evidence{evidence="fdinfo",reason="pid_namespace_private"}': 0.0,
               "gpu_memory_bandwidth_utilization_percent": 90.0}
    frames = {("nvidia", "0", "U0"): counted, ("nvidia", "1", "U1"): counted,
              ("amd", "2", "U2"): {"gpu_memory_bandwidth_utilization_percent": 90.0}, ("intel", "3", "U3"): partial}
    engine = TextEngine(IndicatorConfig(), None, 0.5)
    with caplog.at_level(logging.INFO, logger="exporter.indicators.engine"):
        engine.update(1.0, frames)
        engine.update(1.5, frames)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if "co-tenancy evidence" in r.getMessage()]
    assert len(lines) == 3, lines
    assert ("INFO", "co-tenancy evidence of nvidia gpu 0 (U0) and GPUs like it: busy clients counted by nvml") in lines
    none = [m for lvl, m in lines if lvl == "WARNING" and "amd gpu 2" in m]
    assert none and "none (no_client_source)" in none[0] and "collectors.<nvml|fdinfo|amdsmi>.options.processes" in none[0]
    assert any(lvl == "WARNING" and "intel gpu 3" in m and "partial count by fdinfo (pid_namespace_private)" in m
               for lvl, m in lines)
