"""sysfs_util: values, absent files, and error classification (never raises)."""

from __future__ import annotations

import errno
from collections import Counter

import pytest

from exporter.sources import sysfs_util as su


def test_values(tmp_path):
    (tmp_path / "a").write_text("  1234\n")
    (tmp_path / "h").write_text("0x8086\n")
    (tmp_path / "n").write_text("-1\n")
    (tmp_path / "f").write_text("0.00390625\n")
    (tmp_path / "u").write_text("DRIVER=xe\nPCI_SLOT_NAME=0000:03:00.0\nnoise\n")
    errors: Counter[str] = Counter()
    assert su.read_int(tmp_path / "a", errors) == 1234
    assert su.read_int(tmp_path / "h", errors) == 0x8086
    assert su.read_int(tmp_path / "n", errors) == -1
    assert su.read_float(tmp_path / "f", errors) == 0.00390625
    assert su.read_text(tmp_path / "a", errors) == "1234"
    assert su.read_kv(tmp_path / "u", errors) == {"DRIVER": "xe", "PCI_SLOT_NAME": "0000:03:00.0"}
    assert not errors


def test_absent_is_silent_and_bad_values_counted(tmp_path):
    errors: Counter[str] = Counter()
    assert su.read_int(tmp_path / "missing", errors) is None
    assert su.read_int(tmp_path / "missing" / "below", errors) is None
    assert su.read_kv(tmp_path / "missing", errors) == {}
    assert not errors
    (tmp_path / "bad").write_text("12 MHz\n")
    (tmp_path / "bin").write_bytes(b"\xff\xfe\x00")
    assert su.read_int(tmp_path / "bad", errors) is None
    assert su.read_float(tmp_path / "bad", errors) is None
    assert su.read_text(tmp_path / "bin", errors) is None
    assert errors == {"malformed_value": 3}
    assert su.read_int(tmp_path / "bad") is None  # no counter: still no exception


def test_directory_read_is_a_read_error(tmp_path):
    errors: Counter[str] = Counter()
    assert su.read_text(tmp_path, errors) is None
    assert errors == {"read_error": 1}


@pytest.mark.parametrize(("exc", "kind"), [
    (OSError(errno.ENODEV, "x"), "device_lost"), (OSError(errno.EOPNOTSUPP, "x"), "not_supported"),
    (OSError(errno.ENODATA, "x"), "not_supported"), (OSError(errno.ETIMEDOUT, "x"), "timeout"),
    (OSError(errno.EIO, "x"), "read_error"), (PermissionError(errno.EACCES, "x"), "read_error"),
    (TimeoutError(), "timeout"), (ValueError(), "malformed_value"),
])
def test_error_kind(exc, kind):
    assert su.error_kind(exc) == kind


def test_link_name(tmp_path):
    (tmp_path / "l").symlink_to("../../bus/pci/drivers/i915")
    assert su.link_name(tmp_path / "l") == "i915"
    assert su.link_name(tmp_path / "none") is None
