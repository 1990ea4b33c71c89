"""The kernel's ``gpu_metrics`` structs as data: the layout engine (C alignment, one precompiled
``struct.Struct`` per layout) and every known layout, keyed by (format_revision, content_revision).

Transcribed from ``drivers/gpu/drm/amd/include/kgd_pp_interface.h``; ``amd_gpu_metrics`` decodes
tables with them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

# ------------------------------------------------------------------------------------------------
# Layout engine: a struct is an ordered list of (name, type, count); offsets follow C alignment.

_PRIMS = {"u8": ("B", 1), "u16": ("H", 2), "u32": ("I", 4), "u64": ("Q", 8)}


@dataclass(frozen=True)
class Layout:
    name: str
    fields: tuple[tuple[str, str | Layout, int], ...]
    offsets: dict[str, int] = field(init=False, compare=False, repr=False)
    size: int = field(init=False, compare=False)
    align: int = field(init=False, compare=False)
    flat_format: str = field(init=False, compare=False, repr=False)  # struct format without byte order
    nvalues: int = field(init=False, compare=False, repr=False)  # values in one flat unpack
    packer: struct.Struct = field(init=False, compare=False, repr=False)  # one precompiled unpack

    def __post_init__(self) -> None:
        offsets: dict[str, int] = {}
        pos = 0
        max_align = 1
        fmt: list[str] = []  # flat little-endian format, C padding spelled out as pad bytes
        nvalues = 0
        for fname, ftype, count in self.fields:
            if isinstance(ftype, Layout):
                size, align = ftype.size, ftype.align
            else:
                size = align = _PRIMS[ftype][1]
            aligned = (pos + align - 1) // align * align
            if aligned > pos:
                fmt.append(f"{aligned - pos}x")
            pos = aligned
            offsets[fname] = pos
            if isinstance(ftype, Layout):
                fmt.append(ftype.flat_format * count)
                nvalues += ftype.nvalues * count
            else:
                fmt.append(f"{count}{_PRIMS[ftype][0]}")
                nvalues += count
            pos += size * count
            max_align = max(max_align, align)
        size = (pos + max_align - 1) // max_align * max_align
        if size > pos:
            fmt.append(f"{size - pos}x")
        object.__setattr__(self, "offsets", offsets)
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "align", max_align)
        object.__setattr__(self, "flat_format", "".join(fmt))
        object.__setattr__(self, "nvalues", nvalues)
        object.__setattr__(self, "packer", struct.Struct("<" + self.flat_format))

    def _split(self, values: tuple, start: int) -> tuple[dict[str, object], int]:
        out: dict[str, object] = {}
        i = start
        for fname, ftype, count in self.fields:
            if isinstance(ftype, Layout):
                parts = []
                for _ in range(count):
                    part, i = ftype._split(values, i)
                    parts.append(part)
                out[fname] = parts
            elif count == 1:
                out[fname] = values[i]
                i += 1
            else:
                out[fname] = list(values[i:i + count])
                i += count
        return out, i

    def decode(self, data: bytes, base: int = 0) -> dict[str, object]:
        """Every field by name (nested layouts as lists of dicts), from one precompiled unpack."""
        return self._split(self.packer.unpack_from(data, base), 0)[0]

    def bits(self, fname: str) -> int:
        """Width in bits of a primitive field (for the all-ones test)."""
        for name, ftype, _ in self.fields:
            if name == fname and isinstance(ftype, str):
                return _PRIMS[ftype][1] * 8
        raise KeyError(fname)


def _f(spec: str) -> tuple[tuple[str, str | Layout, int], ...]:
    """``"u16 a, u16[4] b"`` -> field tuples (a compact way to transcribe the kernel structs)."""
    out = []
    for item in spec.replace("\n", " ").split(","):
        item = item.strip()
        if not item:
            continue
        ftype, name = item.split()
        count = 1
        if "[" in ftype:
            ftype, n = ftype.rstrip("]").split("[")
            count = int(n)
        out.append((name, ftype, count))
    return tuple(out)


def _layout(name: str, *parts: object) -> Layout:
    fields: list[tuple[str, str | Layout, int]] = []
    for part in parts:
        if isinstance(part, str):
            fields.extend(_f(part))
        else:
            fields.append(part)  # type: ignore[arg-type]
    return Layout(name, tuple(fields))


HEADER = _layout("metrics_table_header", "u16 structure_size, u8 format_revision, u8 content_revision")
_HDR = ("common_header", HEADER, 1)

_TEMPS_V1 = ("u16 temperature_edge, u16 temperature_hotspot, u16 temperature_mem, u16 temperature_vrgfx,"
             " u16 temperature_vrsoc, u16 temperature_vrmem,"
             " u16 average_gfx_activity, u16 average_umc_activity, u16 average_mm_activity, u16 average_socket_power")
_CLOCKS_V1 = ("u16 average_gfxclk_frequency, u16 average_socclk_frequency, u16 average_uclk_frequency,"
              " u16 average_vclk0_frequency, u16 average_dclk0_frequency, u16 average_vclk1_frequency,"
              " u16 average_dclk1_frequency, u16 current_gfxclk, u16 current_socclk, u16 current_uclk,"
              " u16 current_vclk0, u16 current_dclk0, u16 current_vclk1, u16 current_dclk1")
_V1_1_BODY = (_TEMPS_V1 + ", u64 energy_accumulator, u64 system_clock_counter, " + _CLOCKS_V1
              + ", u32 throttle_status, u16 current_fan_speed, u16 pcie_link_width, u16 pcie_link_speed,"
              " u16 padding, u32 gfx_activity_acc, u32 mem_activity_acc, u16[4] temperature_hbm")

V1_0 = _layout("gpu_metrics_v1_0", _HDR, "u64 system_clock_counter, " + _TEMPS_V1 + ", u32 energy_accumulator, "
               + _CLOCKS_V1 + ", u32 throttle_status, u16 current_fan_speed, u8 pcie_link_width, u8 pcie_link_speed")
V1_1 = _layout("gpu_metrics_v1_1", _HDR, _V1_1_BODY)
V1_2 = _layout("gpu_metrics_v1_2", _HDR, _V1_1_BODY + ", u64 firmware_timestamp")
V1_3 = _layout("gpu_metrics_v1_3", _HDR, _V1_1_BODY + ", u64 firmware_timestamp, u16 voltage_soc, u16 voltage_gfx,"
               " u16 voltage_mem, u16 padding1, u64 indep_throttle_status")

_MI_HEAD = ("u16 temperature_hotspot, u16 temperature_mem, u16 temperature_vrsoc, u16 curr_socket_power,"
            " u16 average_gfx_activity, u16 average_umc_activity")
_RESIDENCY = ("u32 accumulation_counter, u32 prochot_residency_acc, u32 ppt_residency_acc,"
              " u32 socket_thm_residency_acc, u32 vr_thm_residency_acc, u32 hbm_thm_residency_acc")
_LINKS = ("u16 pcie_link_width, u16 pcie_link_speed, u16 xgmi_link_width, u16 xgmi_link_speed,"
          " u32 gfx_activity_acc, u32 mem_activity_acc, u64 pcie_bandwidth_acc, u64 pcie_bandwidth_inst,"
          " u64 pcie_l0_to_recov_count_acc, u64 pcie_replay_count_acc, u64 pcie_replay_rover_count_acc")
_NAK = "u32 pcie_nak_sent_count_acc, u32 pcie_nak_rcvd_count_acc"
_XGMI = "u64[8] xgmi_read_data_acc, u64[8] xgmi_write_data_acc"
_MI_CLOCKS = ("u16[8] current_gfxclk, u16[4] current_socclk, u16[4] current_vclk0, u16[4] current_dclk0,"
              " u16 current_uclk")

V1_4 = _layout("gpu_metrics_v1_4", _HDR, _MI_HEAD + ", u16[4] vcn_activity, u64 energy_accumulator,"
               " u64 system_clock_counter, u32 throttle_status, u32 gfxclk_lock_status, " + _LINKS + ", " + _XGMI
               + ", u64 firmware_timestamp, " + _MI_CLOCKS + ", u16 padding")
V1_5 = _layout("gpu_metrics_v1_5", _HDR, _MI_HEAD + ", u16[4] vcn_activity, u16[32] jpeg_activity,"
               " u64 energy_accumulator, u64 system_clock_counter, u32 throttle_status, u32 gfxclk_lock_status, "
               + _LINKS + ", " + _NAK + ", " + _XGMI + ", u64 firmware_timestamp, " + _MI_CLOCKS + ", u16 padding")
V1_6_OLD = _layout("gpu_metrics_v1_6_old", _HDR, _MI_HEAD + ", u16[4] vcn_activity, u16[32] jpeg_activity,"
                   " u64 energy_accumulator, u64 system_clock_counter, " + _RESIDENCY
                   + ", u32 throttle_status, u32 gfxclk_lock_status, " + _LINKS + ", " + _NAK + ", " + _XGMI
                   + ", u64 firmware_timestamp, " + _MI_CLOCKS + ", u16 padding")

XCP_V1_0 = _layout("amdgpu_xcp_metrics", "u32[8] gfx_busy_inst, u16[32] jpeg_busy, u16[4] vcn_busy, u64[8] gfx_busy_acc")
XCP_V1_1 = _layout("amdgpu_xcp_metrics_v1_1", "u32[8] gfx_busy_inst, u16[32] jpeg_busy, u16[4] vcn_busy,"
                   " u64[8] gfx_busy_acc, u64[8] gfx_below_host_limit_acc")
XCP_V1_2 = _layout("amdgpu_xcp_metrics_v1_2", "u32[8] gfx_busy_inst, u16[40] jpeg_busy, u16[4] vcn_busy,"
                   " u64[8] gfx_busy_acc, u64[8] gfx_below_host_limit_ppt_acc, u64[8] gfx_below_host_limit_thm_acc,"
                   " u64[8] gfx_low_utilization_acc, u64[8] gfx_below_host_limit_total_acc")

V1_6_NEW = _layout("gpu_metrics_v1_6", _HDR, _MI_HEAD + ", u64 energy_accumulator, u64 system_clock_counter, "
                   + _RESIDENCY + ", u32 gfxclk_lock_status, " + _LINKS + ", " + _NAK + ", " + _XGMI
                   + ", u64 firmware_timestamp, " + _MI_CLOCKS + ", u16 num_partition",
                   ("xcp_stats", XCP_V1_0, 8), "u32 pcie_lc_perf_other_end_recovery")


def _v1_7_like(name: str, xcp: Layout) -> Layout:
    return _layout(name, _HDR, _MI_HEAD + ", u64 mem_max_bandwidth, u64 energy_accumulator, u64 system_clock_counter, "
                   + _RESIDENCY + ", u32 gfxclk_lock_status, " + _LINKS + ", " + _NAK + ", " + _XGMI
                   + ", u16[8] xgmi_link_status, u16 padding, u64 firmware_timestamp, " + _MI_CLOCKS
                   + ", u16 num_partition", ("xcp_stats", xcp, 8), "u32 pcie_lc_perf_other_end_recovery")


V1_7 = _v1_7_like("gpu_metrics_v1_7", XCP_V1_1)
V1_8 = _v1_7_like("gpu_metrics_v1_8", XCP_V1_2)

_APU_TEMPS = ("u16 temperature_gfx, u16 temperature_soc, u16[8] temperature_core, u16[2] temperature_l3")
_APU_POWER = ("u16 average_socket_power, u16 average_cpu_power, u16 average_soc_power, u16 average_gfx_power,"
              " u16[8] average_core_power")
_APU_CLOCKS = ("u16 average_gfxclk_frequency, u16 average_socclk_frequency, u16 average_uclk_frequency,"
               " u16 average_fclk_frequency, u16 average_vclk_frequency, u16 average_dclk_frequency,"
               " u16 current_gfxclk, u16 current_socclk, u16 current_uclk, u16 current_fclk, u16 current_vclk,"
               " u16 current_dclk, u16[8] current_coreclk, u16[2] current_l3clk")
_V2_1_BODY = (_APU_TEMPS + ", u16 average_gfx_activity, u16 average_mm_activity, u64 system_clock_counter, "
              + _APU_POWER + ", " + _APU_CLOCKS + ", u32 throttle_status, u16 fan_pwm, u16[3] padding")
_V2_3_EXTRA = (", u64 indep_throttle_status, u16 average_temperature_gfx, u16 average_temperature_soc,"
               " u16[8] average_temperature_core, u16[2] average_temperature_l3")

V2_0 = _layout("gpu_metrics_v2_0", _HDR, "u64 system_clock_counter, " + _APU_TEMPS
               + ", u16 average_gfx_activity, u16 average_mm_activity, " + _APU_POWER + ", " + _APU_CLOCKS
               + ", u32 throttle_status, u16 fan_pwm, u16 padding")
V2_1 = _layout("gpu_metrics_v2_1", _HDR, _V2_1_BODY)
V2_2 = _layout("gpu_metrics_v2_2", _HDR, _V2_1_BODY + ", u64 indep_throttle_status")
V2_3 = _layout("gpu_metrics_v2_3", _HDR, _V2_1_BODY + _V2_3_EXTRA)
V2_4 = _layout("gpu_metrics_v2_4", _HDR, _V2_1_BODY + _V2_3_EXTRA
               + ", u16 average_cpu_voltage, u16 average_soc_voltage, u16 average_gfx_voltage,"
               " u16 average_cpu_current, u16 average_soc_current, u16 average_gfx_current")
V3_0 = _layout("gpu_metrics_v3_0", _HDR,
               "u16 temperature_gfx, u16 temperature_soc, u16[16] temperature_core, u16 temperature_skin,"
               " u16 average_gfx_activity, u16 average_vcn_activity, u16[8] average_ipu_activity,"
               " u16[16] average_core_c0_activity, u16 average_dram_reads, u16 average_dram_writes,"
               " u16 average_ipu_reads, u16 average_ipu_writes, u64 system_clock_counter,"
               " u32 average_socket_power, u16 average_ipu_power, u32 average_apu_power, u32 average_gfx_power,"
               " u32 average_dgpu_power, u32 average_all_core_power, u16[16] average_core_power,"
               " u16 average_sys_power, u16 stapm_power_limit, u16 current_stapm_power_limit,"
               " u16 average_gfxclk_frequency, u16 average_socclk_frequency, u16 average_vpeclk_frequency,"
               " u16 average_ipuclk_frequency, u16 average_fclk_frequency, u16 average_vclk_frequency,"
               " u16 average_uclk_frequency, u16 average_mpipu_frequency, u16[16] current_coreclk,"
               " u16 current_core_maxfreq, u16 current_gfx_maxfreq, u32 throttle_residency_prochot,"
               " u32 throttle_residency_spl, u32 throttle_residency_fppt, u32 throttle_residency_sppt,"
               " u32 throttle_residency_thm_core, u32 throttle_residency_thm_gfx, u32 throttle_residency_thm_soc,"
               " u32 time_filter_alphavalue")

# (format_revision, content_revision) -> layouts; the one whose size equals structure_size is used.
LAYOUTS: dict[tuple[int, int], tuple[Layout, ...]] = {
    (1, 0): (V1_0,), (1, 1): (V1_1,), (1, 2): (V1_2,), (1, 3): (V1_3,), (1, 4): (V1_4,), (1, 5): (V1_5,),
    (1, 6): (V1_6_OLD, V1_6_NEW), (1, 7): (V1_7,), (1, 8): (V1_8,),
    (2, 0): (V2_0,), (2, 1): (V2_1,), (2, 2): (V2_2,), (2, 3): (V2_3,), (2, 4): (V2_4,),
    (3, 0): (V3_0,),
}
