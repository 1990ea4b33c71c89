"""Pure identity functions of the upstream source: normalization, label roles per exporter."""

from __future__ import annotations

import pytest

from exporter.sources.nvml import normalize_bus_id
from exporter.sources.upstream_identity import (
    EXPORTERS,
    SeriesIdentity,
    dimension_labels,
    field_name,
    identify_amd_dme,
    identify_dcgm,
    identify_nvidia_gpu_exporter,
    identify_xpumanager,
    normalize_pci_bus_id,
    normalize_uuid,
)


@pytest.mark.parametrize(("raw", "want"), [
    ("00000000:31:00.0", "0000:31:00.0"),   # dcgm-exporter / nvidia-smi spelling
    ("0000:17:00.0", "0000:17:00.0"),       # XPU Manager pci_bdf
    ("0000:1A:00.0", "0000:1a:00.0"),
    ("3b:00.0", "0000:3b:00.0"),            # no domain
    ("0001:c1:00.1", "0001:c1:00.1"),
    ("nvidia0", ""),
    ("", ""),
    ("0000:31:00", ""),
])
def test_normalize_pci_bus_id(raw: str, want: str) -> None:
    assert normalize_pci_bus_id(raw) == want


def test_pci_key_equals_the_native_nvml_key() -> None:
    # the store dedups upstream against native devices by key: both spellings must agree
    for raw in ("00000000:31:00.0", "00000000:00:09.0", "00000001:AB:00.0"):
        assert normalize_pci_bus_id(raw) == normalize_bus_id(raw)


@pytest.mark.parametrize(("raw", "nvidia", "want"), [
    ("GPU-c2f76b33-7953-256e-8f33-1343419b1a1c", True, "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"),
    # nvidia_gpu_exporter lowercases and strips "GPU-"
    ("df6e7a7c-7314-46f8-abc4-b88b36dcf3aa", True, "GPU-df6e7a7c-7314-46f8-abc4-b88b36dcf3aa"),
    ("gpu-DF6E7A7C-7314-46f8-abc4-b88b36dcf3aa", True, "GPU-df6e7a7c-7314-46f8-abc4-b88b36dcf3aa"),
    ("MIG-4d2d7fd3-9a1b-5c9e-8f8a-3b3cba0f4b2e", True, "MIG-4d2d7fd3-9a1b-5c9e-8f8a-3b3cba0f4b2e"),
    ("00000000-0000-0000-0000-000000000000", True, ""),   # masked capture
    ("00000000-0000-0000-0000-000000000000", False, ""),  # DME on virtualized MI300X (#233)
    ("17FF74B5-0000-1000-805C-37B0FBE69430", False, "17ff74b5-0000-1000-805c-37b0fbe69430"),
    ("N/A", False, ""),
    ("", True, ""),
])
def test_normalize_uuid(raw: str, nvidia: bool, want: str) -> None:
    assert normalize_uuid(raw, nvidia=nvidia) == want


def test_dcgm_identity_accepts_both_hostname_spellings_and_mig_labels_stay_dimensions() -> None:
    base = {"gpu": "0", "UUID": "GPU-34319582-d595-d1c7-d1d2-179bcfa61660", "device": "nvidia0",
            "pci_bus_id": "00000000:31:00.0", "modelName": "NVIDIA A100", "DCGM_FI_DRIVER_VERSION": "580.1"}
    old = identify_dcgm({**base, "Hostname": "n1"})
    new = identify_dcgm({**base, "hostname": "n1"})
    assert old == new
    assert old == SeriesIdentity(ref="n1|GPU-34319582-d595-d1c7-d1d2-179bcfa61660", index="0",
                                 uuid="GPU-34319582-d595-d1c7-d1d2-179bcfa61660",
                                 pci_bus_id="0000:31:00.0", model="NVIDIA A100", driver="580.1", host="n1")
    mig = {**base, "Hostname": "n1", "GPU_I_PROFILE": "1g.5gb", "GPU_I_ID": "13", "pod": "p"}
    spec = EXPORTERS["dcgm-exporter"]
    assert identify_dcgm(mig).ref == old.ref  # a MIG series belongs to its parent GPU
    assert dimension_labels(mig, spec) == (("GPU_I_ID", "13"), ("GPU_I_PROFILE", "1g.5gb"), ("pod", "p"))


def test_dcgm_series_without_gpu_is_not_a_device() -> None:
    assert identify_dcgm({"nvswitch": "0", "hostname": "n1"}) is None


def test_amd_identity_prefers_product_name_and_ignores_zero_uuid() -> None:
    ident = identify_amd_dme({
        "gpu_id": "2", "gpu_uuid": "00000000-0000-0000-0000-000000000000", "card_model": "102-G30211-0C",
        "card_series": "AMD Instinct MI300X OAM", "serial_number": "692409005408",
        "driver_version": "6.12.12", "hostname": "tw038"})
    assert ident == SeriesIdentity(ref="tw038|gpu2", index="2", uuid="", model="AMD Instinct MI300X OAM",
                                   driver="6.12.12", serial="692409005408", host="tw038")
    # v1.0 labels: no gpu_id, upper-case names
    v1 = identify_amd_dme({"GPU_UUID": "6699c0a8-4200-4242-037f-f97e6cae0f09", "SERIAL_NUMBER": "692247001282"})
    assert (v1.index, v1.uuid, v1.serial) == ("", "6699c0a8-4200-4242-037f-f97e6cae0f09", "692247001282")
    assert identify_amd_dme({}) is None  # gpu_nodes_total
    assert identify_amd_dme({"process_id": "1234"}) is None  # gpu_process_cu_occupancy


def test_xpumanager_identity_1x_and_2x() -> None:
    one = identify_xpumanager({"dev_file": "card1", "pci_bdf": "0000:17:00.0", "dev_name": "Flex 140",
                               "uuid": "00000000-0000-0000-1ddb-7c1aed80a2fd", "type": "decoder"})
    assert (one.ref, one.index, one.pci_bus_id, one.model) == ("|0000:17:00.0", "1", "0000:17:00.0", "Flex 140")
    info = identify_xpumanager({"hw_name": "gpu-2", "pci_bdf": "0000:03:00.0", "hw_model": "Arc B580",
                                "hw_id": "8680e20b-0000-0000-0300-000000000000"})
    engine = identify_xpumanager({"hw_name": "engine-1-compute-all", "pci_bdf": "0000:03:00.0"})
    assert info.index == "1"  # gpu-2 is the second Level Zero device
    assert engine.index == ""  # only the device-level series name the device
    assert engine.merged(info).index == "1" and engine.merged(info).model == "Arc B580"
    assert identify_xpumanager({"card": "2147483649", "src": "sum"}) is None  # card aggregate


def test_nvidia_gpu_exporter_identity_comes_from_gpu_info() -> None:
    series = identify_nvidia_gpu_exporter({"uuid": "df6e7a7c-7314-46f8-abc4-b88b36dcf3aa"})
    info = identify_nvidia_gpu_exporter({
        "uuid": "df6e7a7c-7314-46f8-abc4-b88b36dcf3aa", "index": "1", "name": "NVIDIA H100",
        "pci_bus_id": "00000000:02:00.0", "driver_version": "590.48.01", "serial": "[N/A]"})
    assert series.ref == info.ref
    merged = series.merged(info)
    assert (merged.index, merged.pci_bus_id, merged.uuid, merged.model, merged.serial) == (
        "1", "0000:02:00.0", "GPU-df6e7a7c-7314-46f8-abc4-b88b36dcf3aa", "NVIDIA H100", "")


def test_field_name_folds_selector_labels_in_sorted_order() -> None:
    sel = EXPORTERS["xpumanager"].selector_labels
    assert field_name("xpum_frequency_mhz", {"type": "actual", "location": "gpu", "uuid": "x"}, sel) == \
        'xpum_frequency_mhz{location="gpu",type="actual"}'
    assert field_name("xpum_engine_ratio", {"uuid": "x"}, sel) == "xpum_engine_ratio"
    assert field_name("m", {"type": 'a"b'}, sel) == 'm{type="a\\"b"}'
    assert field_name("DCGM_FI_DEV_GPU_UTIL", {"gpu": "0"}, EXPORTERS["dcgm-exporter"].selector_labels) == \
        "DCGM_FI_DEV_GPU_UTIL"
