"""Run the exporter with the faithful NVML fake standing in for ``pynvml`` (a GPU-less machine).

    python -m tests.fakes.nvml_exporter [exporter flags...]

``FAKE_NVML_GPUS`` names the fake's scenarios, comma separated (default ``h100``; also ``t4``,
``a100_mig``, ``h100_mig``); ``FAKE_NVML_MPS_PIDS`` (comma separated) gives the MPS clients of
those scenarios the pids of real processes, whose CPU time tells their activity.  Everything
else is the real exporter, with its default flags unless given: the other backends (DCGM,
amdgpu, amdsmi, Intel, Level Zero) are looked for as usual and, on a machine without them,
reported absent.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from tests.fakes import pynvml_fake


def install(names: str | None = None) -> None:
    names = names or os.environ.get("FAKE_NVML_GPUS", "h100")
    gpus = [mps_pids(getattr(pynvml_fake, n.strip())(i), os.environ.get("FAKE_NVML_MPS_PIDS", ""))
            for i, n in enumerate(names.split(",")) if n.strip()]
    module = pynvml_fake.make_module(gpus)
    sys.modules["pynvml"] = module
    # the fake's clock moves only when told; in a live process it follows the wall clock, as the
    # driver's does (per-process utilization samples, energy and counters advance with it).  The
    # thread starts at the first nvmlInit: the exporter drops its capabilities before any thread
    # starts (exporter/privsep/counter.py), and a thread started earlier would keep them
    init = module.nvmlInit
    started: list[bool] = []

    def nvml_init(*args, **kwargs):
        if not started:
            started.append(True)
            threading.Thread(target=_follow_wall_clock, args=(module,), name="fake-nvml-clock",
                             daemon=True).start()
        return init(*args, **kwargs)

    module.nvmlInit = nvml_init


def mps_pids(gpu: dict, pids: str) -> dict:
    """``gpu`` with its MPS clients' pids replaced, in order, by those of ``pids``."""
    given = [int(p) for p in pids.split(",") if p.strip()]
    clients = [p for p in gpu.get("processes", []) if p.get("mps")]
    for proc, pid in zip(clients, given, strict=False):
        proc["pid"] = pid
    return gpu


def _follow_wall_clock(module, step: float = 0.1) -> None:
    last = time.monotonic()
    while True:
        time.sleep(step)
        now = time.monotonic()
        module.fake_advance(now - last)
        last = now


def main() -> int:
    install()
    from exporter.cli import main as exporter_main

    return exporter_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
