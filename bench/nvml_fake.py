"""NVML per-GPU overhead: NvmlSource over the pynvml fake (8 x H100), poll + canonical mapping.

The fake (``tests/fakes/pynvml_fake.py``) is pure Python, so a poll's CPU includes the fake's own
work.  Every ``nvml*`` function of the fake module is wrapped with a timer, so the report gives
the total, the part spent inside the fake (its nvml* calls and the structs the caller builds: the
"NVML" stand-in), and the rest (our reader code +
mapping), each per GPU per poll, plus the NVML calls per GPU per poll.

    python bench/nvml_fake.py [--gpus 8] [--polls 200]
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from exporter.map.mapper import Mapper  # noqa: E402
from exporter.map.store import SourceState, Store  # noqa: E402
from exporter.run.pipeline import poll_and_map  # noqa: E402
from exporter.sources.context import SourceContext
from exporter.sources.nvml import NvmlSource  # noqa: E402
from exporter.testing import load_mappings  # noqa: E402
from tests.fakes import pynvml_fake as pf  # noqa: E402


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _instrument(module) -> dict[str, float]:
    """Time every ``nvml*`` call and every struct the caller builds (the fake's structs are
    Python objects; the real binding's are ctypes, built in C)."""
    acc = {"seconds": 0.0, "calls": 0}

    def wrap(f, count: bool):
        @functools.wraps(f)
        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                acc["seconds"] += time.perf_counter() - t0
                acc["calls"] += count
        return timed

    for name in dir(module):
        obj = getattr(module, name)
        if (isinstance(obj, type) and issubclass(obj, (ctypes.Structure, ctypes.Union))
                and obj.__module__ == pf.__name__):  # the fake's ctypes structs
            setattr(module, name, type(name, (obj,), {"__init__": wrap(obj.__init__, False)}))
        elif name.startswith("nvml") and callable(obj) and not isinstance(obj, type):
            setattr(module, name, wrap(obj, True))
    return acc


def run(gpus: int = 8, polls: int = 200, warmup: int = 5) -> dict:
    fake = pf.make_module([pf.h100(i) for i in range(gpus)])
    acc = _instrument(fake)
    clock = _Clock()
    src = NvmlSource(SourceContext(options={"xid": False}), module=fake, clock=clock)
    src.open()
    mappings = load_mappings()
    store, state, mapper = Store(), SourceState("nvml"), Mapper(mappings)
    store.add(state)
    poll_cpu = map_cpu = 0.0
    fake_s = 0.0
    calls = 0
    series = 0
    try:
        for i in range(warmup + polls):
            acc["seconds"], acc["calls"] = 0.0, 0
            cycle = poll_and_map(src.poll, store, state, mapper, now=1000.0 + i, timer=time.process_time)
            state.devices = cycle.devices
            result = cycle.result
            clock.t += 1.0
            fake.fake_advance(1.0)
            if i >= warmup:
                poll_cpu += cycle.poll_seconds
                map_cpu += cycle.map_seconds
                fake_s += acc["seconds"]
                calls += acc["calls"]
                series = sum(map(len, result.frames.values()))
    finally:
        src.close()
    per = polls * gpus
    return {"gpus": gpus, "polls": polls, "series_per_poll": series,
            "nvml_calls_per_gpu_poll": calls / per,
            "poll_ms_per_gpu": poll_cpu / per * 1000, "map_ms_per_gpu": map_cpu / per * 1000,
            "total_ms_per_gpu": (poll_cpu + map_cpu) / per * 1000,
            "inside_fake_ms_per_gpu": fake_s / per * 1000,
            "ours_ms_per_gpu": (poll_cpu + map_cpu - fake_s) / per * 1000}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--polls", type=int, default=200)
    args = ap.parse_args()
    print(json.dumps(run(args.gpus, args.polls), indent=1))


if __name__ == "__main__":
    main()
