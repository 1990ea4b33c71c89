"""The floor: the cost of only reading the sysfs files the amdgpu source reads, in a tight loop.

The file list is traced, not guessed: one ``AmdgpuSysfsSource.poll()`` on the tree runs with a
recording ``reader=``, and every card's ``pcie_bw`` (read by the source's background threads once
a second) is added.  The floor loop reads each file whole, the way the source's default reader
does (unbuffered ``open`` + ``readall``), and nothing else.

Also measured in-process on the same tree, so daemon overhead can be told apart from source
cost: ``poll()`` alone and ``poll()`` + mapping (``Mapper.map``), CPU per cycle.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from exporter.map.mapper import Mapper  # noqa: E402
from exporter.map.store import SourceState, Store  # noqa: E402
from exporter.run.pipeline import poll_and_map  # noqa: E402
from exporter.sources.amdgpu_sysfs import AmdgpuSysfsSource, default_reader  # noqa: E402
from exporter.sources.context import SourceContext
from exporter.testing import load_mappings  # noqa: E402


def traced_files(tree: Path) -> list[Path]:
    """Paths one poll reads, plus each card's pcie_bw (background thread, once a second)."""
    seen: list[Path] = []
    recording = False

    def reader(path: Path) -> bytes:
        if recording:
            seen.append(Path(path))
        return default_reader(path)

    src = AmdgpuSysfsSource(SourceContext(sysfs=tree, options={"pcie_bw": False}), reader=reader)
    src.open()
    try:
        recording = True
        src.poll()
        recording = False
        bw = [c.device_dir / "pcie_bw" for c in src._cards if c.has_pcie_bw]  # noqa: SLF001
    finally:
        src.close()
    return seen + bw


def read_loop_cpu(files: list[Path], seconds: float = 1.0) -> tuple[float, int]:
    """CPU seconds per pass over ``files`` (each read whole, unbuffered) and the pass count."""
    passes = 0
    t_end = time.perf_counter() + seconds
    c0 = time.process_time()
    while time.perf_counter() < t_end:
        for p in files:
            with open(p, "rb", buffering=0) as fh:
                fh.readall()
        passes += 1
    return (time.process_time() - c0) / passes, passes


def source_cpu(tree: Path, cycles: int = 50, keep_open: str = "always") -> dict[str, float]:
    """In-process CPU per cycle of poll() and of poll() + map (pcie_bw threads off; attribute files
    kept open as on a sysfs mount, unless ``keep_open="never"``)."""
    mappings = load_mappings()
    src = AmdgpuSysfsSource(SourceContext(sysfs=tree, options={"pcie_bw": False, "keep_open": keep_open}))
    src.open()
    store, state, mapper = Store(), SourceState("amdgpu"), Mapper(mappings)
    store.add(state)
    poll_cpu = map_cpu = 0.0
    try:
        for i in range(cycles + 2):
            cycle = poll_and_map(src.poll, store, state, mapper, now=1000.0 + i, timer=time.process_time)
            state.devices = cycle.devices
            if i >= 2:
                poll_cpu += cycle.poll_seconds
                map_cpu += cycle.map_seconds
    finally:
        src.close()
    return {"poll_s": poll_cpu / cycles, "map_s": map_cpu / cycles, "poll_map_s": (poll_cpu + map_cpu) / cycles}


def run(tree: Path, seconds: float = 1.0) -> dict:
    files = traced_files(tree)
    floor, passes = read_loop_cpu(files, seconds)
    src = source_cpu(tree)
    plain = source_cpu(tree, 20, keep_open="never")
    return {"source_poll_map_open_per_read_s": plain["poll_map_s"],"files_per_cycle": len(files), "floor_cpu_s_per_cycle": floor, "floor_passes": passes,
            "floor_us_per_file": floor / max(len(files), 1) * 1e6, **{f"source_{k}": v for k, v in src.items()},
            "source_poll_x_floor": src["poll_s"] / floor if floor else float("nan"),
            "source_poll_map_x_floor": src["poll_map_s"] / floor if floor else float("nan")}


if __name__ == "__main__":
    import json
    import tempfile

    from bench.sysfs_tree import build_tree

    with tempfile.TemporaryDirectory() as d:
        for n in (8, 32):
            print(n, json.dumps(run(build_tree(Path(d) / f"s{n}", n)), indent=1))
