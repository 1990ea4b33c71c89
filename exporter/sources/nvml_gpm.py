"""NVML GPM (GPU Performance Monitoring, Hopper and newer): the two-sample pattern.

GPM metrics are computed by the library over the interval between two samples.  For every GPU
(and every MIG GPU instance) one stream keeps the previous sample; each poll takes a new sample
into the second buffer, asks ``nvmlGpmMetricsGet`` for the metrics over [previous, now], checks
every metric's own return code, and swaps the buffers.  The first poll only seeds.  A gap longer
than ``reseed_factor`` x the expected interval (or ``max_window_s``), and any sampling error,
reseeds: the next poll seeds again instead of reporting a stale average.  Samples are allocated
once per stream and freed with ``nvmlGpmSampleFree`` when the stream is dropped.

Raw fields are ``gpm.<metric name>`` in NVML's own units (percent, MiB/s), the metric name
taken from the binding's ``NVML_GPM_METRIC_<NAME>`` constants.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .base import PollResult
from .nvml_calls import INVALID_ARGUMENT, LOST_CODES, SUCCESS, UNSUPPORTED_CODES, CallGuard, DeviceLost

# What we ask for by default: the memory-contention set (names of NVML_GPM_METRIC_* constants).
DEFAULT_GPM_METRICS = (
    "GRAPHICS_UTIL", "SM_UTIL", "SM_OCCUPANCY", "ANY_TENSOR_UTIL", "DRAM_BW_UTIL",
    "FP64_UTIL", "FP32_UTIL", "FP16_UTIL",
    "PCIE_TX_PER_SEC", "PCIE_RX_PER_SEC", "NVLINK_TOTAL_RX_PER_SEC", "NVLINK_TOTAL_TX_PER_SEC",
    "HOSTMEM_CACHE_HIT", "HOSTMEM_CACHE_MISS", "PEERMEM_CACHE_HIT", "PEERMEM_CACHE_MISS",
    "DRAM_CACHE_HIT", "DRAM_CACHE_MISS",
)


def resolve_metric_ids(nvml: Any, names: list[str] | tuple[str, ...]) -> dict[int, str]:
    """Metric id -> raw field name (``gpm.sm_occupancy``) for the names the binding knows."""
    out: dict[int, str] = {}
    for name in names:
        mid = getattr(nvml, f"NVML_GPM_METRIC_{name.upper()}", None)
        if isinstance(mid, int):
            out[mid] = f"gpm.{name.lower()}"
    return out


@dataclass
class GpmStream:
    """Two sample buffers of one GPU or one GPU instance."""

    buffers: list[Any]
    prev: int = -1            # index of the buffer holding the previous sample, -1 = unseeded
    prev_t: float = 0.0
    min_gap: float = 0.0      # shortest gap seen: the best guess of the poll interval
    metric_ids: list[int] = field(default_factory=list)


class GpmReader:
    def __init__(self, nvml: Any, guard: CallGuard, metric_names: list[str] | tuple[str, ...],
                 *, min_window_s: float = 0.1, reseed_factor: float = 5.0,
                 max_window_s: float = 600.0, interval_s: float | None = None) -> None:
        self.nvml = nvml
        self.guard = guard
        self.metrics = resolve_metric_ids(nvml, metric_names)
        self.min_window_s = min_window_s
        self.reseed_factor = reseed_factor
        self.max_window_s = max_window_s
        self.interval_s = interval_s
        self.streams: dict[tuple[str, int | None], GpmStream] = {}

    # -- support ---------------------------------------------------------------------------
    def device_supported(self, errors: Counter[str], key: str, handle: Any) -> bool:
        """nvmlGpmQueryDeviceSupport; a device without GPM is remembered, not an error spam."""
        if not self.metrics:
            return False
        res = self.guard.call(errors, key, "gpm", "nvmlGpmQueryDeviceSupport", handle)
        if res is None:
            return False
        if not int(getattr(res, "isSupportedDevice", 0)):
            self.guard.skipped.add((key, "gpm"))
            return False
        return True

    # -- lifecycle -------------------------------------------------------------------------
    def drop_device(self, key: str) -> None:
        for skey in [s for s in self.streams if s[0] == key]:
            self._free(self.streams.pop(skey))

    def drop_stream(self, key: str, gi: int | None) -> None:
        st = self.streams.pop((key, gi), None)
        if st is not None:
            self._free(st)

    def close(self) -> None:
        for st in self.streams.values():
            self._free(st)
        self.streams.clear()

    def _free(self, st: GpmStream) -> None:
        for buf in st.buffers:
            try:
                self.nvml.nvmlGpmSampleFree(buf)
            except Exception:  # noqa: BLE001 - freeing during teardown must not raise
                pass
        st.buffers = []

    def _stream(self, key: str, gi: int | None) -> GpmStream:
        st = self.streams.get((key, gi))
        if st is None:
            bufs = [self.nvml.nvmlGpmSampleAlloc(), self.nvml.nvmlGpmSampleAlloc()]
            st = GpmStream(buffers=bufs, metric_ids=sorted(self.metrics))
            self.streams[(key, gi)] = st
        return st

    # -- one poll --------------------------------------------------------------------------
    def read(self, sample: PollResult, key: str, handle: Any, now: float, gi: int | None = None,
             labels: tuple[tuple[str, str], ...] = (), only: frozenset[str] | None = None) -> None:
        """Take a sample for (key, gi) and emit metrics over [previous, now] when valid.

        Raises DeviceLost for a lost GPU.  ``gi`` selects nvmlGpmMigSampleGet for a MIG instance.
        ``only``: emit only these raw names (a fast poll's); every metric is still computed, so
        the stream's window and its unsupported-metric bookkeeping stay the same.
        """
        errors = sample.errors
        gate = "gpm" if gi is None else "gpm.mig"
        if self.guard.is_skipped(key, gate):
            return
        try:
            st = self._stream(key, gi)
        except self.nvml.NVMLError as exc:
            self.guard.handle_code(errors, key, gate, exc.value)
            return
        if not st.metric_ids:
            return
        cur = 1 - st.prev if st.prev >= 0 else 0
        if st.prev >= 0:
            gap = now - st.prev_t
            if gap < self.min_window_s:
                return  # too soon: keep the old sample, the next poll gets a longer window
            expected = self.interval_s or st.min_gap
            if gap > self.max_window_s or (expected and gap > self.reseed_factor * expected):
                st.prev = -1  # stale: reseed
                cur = 0
        try:
            if gi is None:
                self.nvml.nvmlGpmSampleGet(handle, st.buffers[cur])
            else:
                self.nvml.nvmlGpmMigSampleGet(handle, gi, st.buffers[cur])
        except self.nvml.NVMLError as exc:
            st.prev = -1
            if exc.value in LOST_CODES:
                raise DeviceLost(exc.value) from None
            self.guard.handle_code(errors, key, gate, exc.value)
            if exc.value in UNSUPPORTED_CODES:
                self.drop_stream(key, gi)
            return
        if st.prev < 0:
            st.prev, st.prev_t = cur, now
            return
        gap = now - st.prev_t
        self._metrics(sample, key, st, st.buffers[st.prev], st.buffers[cur], labels, only)
        st.min_gap = gap if st.min_gap <= 0 else min(st.min_gap, gap)
        st.prev, st.prev_t = cur, now

    def _metrics(self, sample: PollResult, key: str, st: GpmStream, s1: Any, s2: Any,
                 labels: tuple[tuple[str, str], ...], only: frozenset[str] | None = None) -> None:
        nv = self.nvml
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version = nv.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(st.metric_ids)
        mg.sample1 = s1
        mg.sample2 = s2
        for i, mid in enumerate(st.metric_ids):
            mg.metrics[i].metricId = mid
        try:
            nv.nvmlGpmMetricsGet(mg)
        except nv.NVMLError as exc:
            st.prev = -1
            if exc.value in LOST_CODES:
                raise DeviceLost(exc.value) from None
            self.guard.handle_code(sample.errors, key, "gpm.metrics_get", exc.value)
            return
        keep: list[int] = []
        for i, mid in enumerate(st.metric_ids):
            m = mg.metrics[i]
            rc = int(m.nvmlReturn)
            name = self.metrics[mid]
            if rc == SUCCESS:
                keep.append(mid)
                if only is None or name in only:
                    sample.add(key, name, m.value, labels)
            elif rc in UNSUPPORTED_CODES or rc == INVALID_ARGUMENT:
                # real H200/driver 580 answers INVALID_ARGUMENT (2) for ids it does not support
                self.guard.remember(sample.errors, key, name)  # once per (device, metric)
            elif rc in LOST_CODES:
                raise DeviceLost(rc)
            else:
                keep.append(mid)
                sample.errors["read_error"] += 1
        st.metric_ids = keep
