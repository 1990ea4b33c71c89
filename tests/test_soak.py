"""Long versions of the reliability suite (``make soak``: ``SOAK=1 pytest -m soak``).

Marked ``soak`` and skipped unless ``SOAK`` is set, so a plain ``pytest`` never runs them.
Durations: ``SOAK_LOAD_SECONDS`` (default 30), ``SOAK_FUZZ_SECONDS`` per parser (default 60).
"""

from __future__ import annotations

import math
import os
import random
import shutil
import struct
import time
from pathlib import Path

import pytest

from exporter.sources import amd_gpu_metrics as gm
from exporter.sources.amd_gpu_metrics import GpuMetricsError, parse_gpu_metrics, table_readings
from exporter.sources.fdinfo_parser import parse_fdinfo
from tests.amd_fixture_tree import arrange_mi300x_node, mi300x_pci, mi300x_table, pack_gpu_metrics_v1_5
from tests.reliability_util import SOAK, ExporterProcess, mapper_state_size
from tests.test_reliability_faults import _amd_daemon
from tests.test_reliability_load import SIM_UP, concurrent_scrapers, reload_under_load


def soak_only(fn):
    """Marked ``soak`` (selected by ``make soak``) and skipped without SOAK=1 in any case."""
    skip = pytest.mark.skipif(not SOAK, reason="soak test: run with `make soak` (SOAK=1 pytest -m soak)")
    return pytest.mark.optional_in_ci(pytest.mark.soak(skip(fn)))


LOAD_SECONDS = float(os.environ.get("SOAK_LOAD_SECONDS", "30"))
FUZZ_SECONDS = float(os.environ.get("SOAK_FUZZ_SECONDS", "60"))


# ------------------------------------------------------------------------------------------------
# load


@soak_only
async def test_soak_200_concurrent_scrapers(tmp_path):
    with ExporterProcess(["--simulate", "--poll.interval", "0.5"], tmp_path, ready=SIM_UP) as exp:
        await concurrent_scrapers(exp, 200, LOAD_SECONDS)
        rc, elapsed = exp.stop()
    assert rc == 0 and elapsed < 2.0


@soak_only
async def test_soak_sighup_rounds_under_load(tmp_path):
    await reload_under_load(tmp_path, clients=20, seconds=max(10.0, LOAD_SECONDS / 2), rounds=5)


# ------------------------------------------------------------------------------------------------
# faults, many cycles


@soak_only
async def test_soak_flapping_cards_state_stays_flat(tmp_path):
    sysfs = tmp_path / "sys"
    devs = arrange_mi300x_node(sysfs, cards=(0, 1, 2, 3, 4, 5, 6, 7))
    parked = tmp_path / "parked"
    parked.mkdir()
    daemon = _amd_daemon(sysfs, tmp_path)
    daemon.load()
    daemon.build_runtimes()
    daemon.build_feed()
    rt = daemon.runtimes[0]
    rnd = random.Random(1)
    seen = []
    try:
        for i in range(4000):
            card = rnd.randrange(8)
            src, dst = (devs[card], parked / mi300x_pci(card))
            if not src.exists():
                src, dst = dst, src
            shutil.move(src, dst)
            assert await daemon.poll_once(rt)
            daemon.feed.update(time.monotonic(), daemon.store)
            if i % 500 == 499:
                # put every card back for one poll so every table is at its full size
                for c in range(8):
                    if not devs[c].exists():
                        shutil.move(parked / mi300x_pci(c), devs[c])
                assert await daemon.poll_once(rt)
                daemon.feed.update(time.monotonic(), daemon.store)
                seen.append((mapper_state_size(rt.mapper), len(rt.state.devices), sum(len(c[2]) for c in daemon.feed._by_source.values()),
                             len(daemon.feed.engine._devices)))
    finally:
        await daemon._close_sources(daemon.runtimes)
    assert len(set(seen)) == 1, seen


# ------------------------------------------------------------------------------------------------
# bounded-time fuzzing of the two binary/text parsers


def _gpu_metrics_seeds(shared: Path | None) -> list[bytes]:
    seeds = [mi300x_table(i) for i in range(3)] + [pack_gpu_metrics_v1_5()]
    for version, layouts in gm.LAYOUTS.items():
        for layout in layouts:
            seeds.append(struct.pack("<HBB", layout.size, *version) + bytes(layout.size - 4))
    if shared is not None:
        seeds += [p.read_bytes() for p in sorted((shared / "amd").glob("*.bin"))]
    return seeds


def _mutate(rnd: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rnd.randrange(1, 6)):
        op = rnd.randrange(7)
        if op == 0 and b:                              # random byte
            b[rnd.randrange(len(b))] = rnd.randrange(256)
        elif op == 1 and b:                            # bit flip
            i = rnd.randrange(len(b))
            b[i] ^= 1 << rnd.randrange(8)
        elif op == 2:                                  # truncate
            del b[rnd.randrange(len(b) + 1):]
        elif op == 3:                                  # extend
            b += bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 64)))
        elif op == 4 and len(b) >= 4:                  # header: size / format / content revision
            struct.pack_into("<H", b, 0, rnd.choice([0, 1, 4, len(b), len(b) + 1, 0xFFFF, rnd.randrange(65536)]))
            b[2], b[3] = rnd.randrange(5), rnd.randrange(12)
        elif op == 5 and b:                            # all-ones / zero run ("not supported" markers)
            i = rnd.randrange(len(b))
            n = rnd.randrange(1, 16)
            b[i:i + n] = (b"\xff" if rnd.random() < 0.5 else b"\x00") * n
        else:                                          # splice with itself
            i, j = sorted(rnd.randrange(len(b) + 1) for _ in range(2))
            b[i:i] = b[j:]
    return bytes(b)


def _fuzz_gpu_metrics(seconds: float, shared: Path | None) -> int:
    rnd = random.Random(int(os.environ.get("SOAK_SEED", "0")) or None)
    seeds = _gpu_metrics_seeds(shared)
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        data = _mutate(rnd, rnd.choice(seeds))
        try:
            table = parse_gpu_metrics(data)
        except GpuMetricsError:
            n += 1
            continue
        for name, value, labels in table_readings(table):
            assert name.startswith("gpu_metrics.") and isinstance(labels, tuple), (name, data.hex())
            assert math.isfinite(value) and value >= 0, (name, value, data.hex())
        n += 1
    return n


@soak_only
def test_soak_fuzz_gpu_metrics_parser(shared_fixtures):
    n = _fuzz_gpu_metrics(FUZZ_SECONDS, shared_fixtures)
    print(f"\ngpu_metrics fuzz: {n} inputs in {FUZZ_SECONDS:.0f}s")
    assert n > 1000


_FDINFO_LINES = [
    "drm-driver:\t{w}", "drm-pdev:\t0000:{h}:00.0", "drm-client-id:\t{n}", "drm-engine-{w}:\t{n} ns",
    "drm-cycles-{w}:\t{n}", "drm-total-cycles-{w}:\t{n}", "drm-engine-capacity-{w}:\t{n}",
    "drm-maxfreq-{w}:\t{n} Hz", "drm-memory-{w}:\t{n} {u}", "drm-total-{w}:\t{n} {u}",
    "drm-resident-{w}:\t{n} {u}", "drm-shared-{w}:\t{n}", "pos:\t{n}", "{w}:{w}", "drm-", "{junk}",
]


def _fdinfo_input(rnd: random.Random, seeds: list[str]) -> str:
    if seeds and rnd.random() < 0.5:
        lines = rnd.choice(seeds).splitlines()
        for _ in range(rnd.randrange(1, 5)):
            if not lines:
                break
            i = rnd.randrange(len(lines))
            op = rnd.randrange(4)
            if op == 0:
                del lines[i]
            elif op == 1:
                lines[i] = lines[i][: rnd.randrange(len(lines[i]) + 1)]
            elif op == 2:
                lines.insert(i, lines[rnd.randrange(len(lines))])
            else:
                chars = list(lines[i])
                if chars:
                    chars[rnd.randrange(len(chars))] = chr(rnd.randrange(0x30000))
                lines[i] = "".join(chars)
        return "\n".join(lines)
    out = []
    for _ in range(rnd.randrange(0, 25)):
        out.append(rnd.choice(_FDINFO_LINES).format(
            w=rnd.choice(["amdgpu", "i915", "xe", "gfx", "rcs", "vram", "vram0", "gtt", "", "x" * 300]),
            h=rnd.choice(["03", "zz", "", "0" * 100]),
            n=rnd.choice([0, 1, -1, 2**64, 10**30, "1.5", "nan", "", "0x10"]),
            u=rnd.choice(["KiB", "MiB", "GiB", "B", "", "bogus"]),
            junk="".join(chr(rnd.randrange(1, 0x3000)) for _ in range(rnd.randrange(40)))))
    return rnd.choice(["\n", "\r\n", "\n\n"]).join(out)


@soak_only
def test_soak_fuzz_fdinfo_parser(shared_fixtures):
    rnd = random.Random(int(os.environ.get("SOAK_SEED", "0")) or None)
    seeds = [p.read_text() for p in sorted((shared_fixtures / "intel").glob("fdinfo-*.txt"))]
    deadline = time.monotonic() + FUZZ_SECONDS
    n = 0
    while time.monotonic() < deadline:
        text = _fdinfo_input(rnd, seeds)
        rec = parse_fdinfo(text)
        if rec is not None:
            assert rec.driver, text
            assert all(v >= 0 for v in rec.engine_ns.values()), text
            assert all(c >= 1 for c in rec.capacity.values()), text
            rec.resident()
        n += 1
    print(f"\nfdinfo fuzz: {n} inputs in {FUZZ_SECONDS:.0f}s")
    assert n > 1000


def test_fuzzers_run_briefly_in_the_normal_suite(shared_fixtures):
    """The soak fuzzers themselves are exercised (0.5 s each) so a broken harness shows up early."""
    assert _fuzz_gpu_metrics(0.5, shared_fixtures) > 100
    rnd = random.Random(7)
    for _ in range(300):
        parse_fdinfo(_fdinfo_input(rnd, []))
