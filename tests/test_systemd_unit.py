"""The hardened systemd unit: systemd-analyze verify and security score (package: systemd)."""

from __future__ import annotations

import configparser
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.conftest import require_binary

REPO = Path(__file__).resolve().parent.parent
UNIT = REPO / "systemd" / "unified-gpu-exporter.service"
ENV = REPO / "systemd" / "unified-gpu-exporter.env"
# 2.0 with the two capabilities the default co-tenancy evidence of AMD / Intel GPUs needs
# (CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH for other users' /proc/<pid>/fd; issue 24), held by the
# counting process alone (issue 37: 2.4 before, with /proc of every process visible); 1.5 without
MAX_EXPOSURE = 2.0


# where the README's venv install puts the console script (tests/test_install_paths.py installs it)
INSTALLED = "/opt/unified-gpu-exporter/bin/unified-gpu-exporter"


def unit_copy(tmp_path: Path, executable: Path | None = None) -> Path:
    """The unit with ExecStart pointed at ``executable`` (default: a stand-in; verify checks it
    exists), nothing else changed."""
    if executable is None:
        executable = tmp_path / "unified-gpu-exporter"
        executable.write_text("#!/bin/sh\nexit 0\n")
        executable.chmod(0o755)
    text = UNIT.read_text()
    assert f"ExecStart={INSTALLED} $ARGS" in text
    out = tmp_path / UNIT.name
    out.write_text(text.replace(INSTALLED, str(executable)))
    return out


def directives() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


def test_systemd_analyze_verify(tmp_path):
    exe = require_binary("systemd-analyze", "systemd")
    r = subprocess.run([exe, "verify", str(unit_copy(tmp_path))], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    # verify reports unknown directives / bad values on stderr without failing
    assert "Unknown key" not in r.stderr and "Failed to parse" not in r.stderr, r.stderr


def test_security_exposure_at_most_2(tmp_path):
    exe = require_binary("systemd-analyze", "systemd")
    r = subprocess.run([exe, "security", "--offline=true", f"--threshold={int(MAX_EXPOSURE * 10)}",
                        str(unit_copy(tmp_path))], capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", r.stdout)
    if m is None and "--offline" in r.stderr:
        pytest.skip(f"this systemd-analyze has no --offline: {r.stderr.strip()[:200]}")
    assert m is not None, r.stdout + r.stderr
    assert float(m.group(1)) <= MAX_EXPOSURE, r.stdout
    assert r.returncode == 0, r.stdout  # --threshold is on a 0..100 scale
    # the unit's header says the score it has (issue 38: it claimed <= 2.0 while scoring 2.4)
    claim = re.search(r"^# Check: systemd-analyze security .*\((\d\.\d) as shipped", UNIT.read_text(), re.M)
    assert claim and claim.group(1) == m.group(1), (claim and claim.group(1), m.group(1))


def test_required_hardening_present():
    d = directives()
    expect = {
        "DynamicUser": ["yes"], "ProtectSystem": ["strict"], "DevicePolicy": ["closed"],
        "StateDirectory": ["unified-gpu-exporter"],
        # only what procfs' access checks for fdinfo need (issue 24); the ptrace calls stay filtered
        "CapabilityBoundingSet": ["CAP_SYS_PTRACE CAP_DAC_READ_SEARCH"],
        "AmbientCapabilities": ["CAP_SYS_PTRACE CAP_DAC_READ_SEARCH"],
        # issue 37: the serving process (no capability) sees its own processes only, the counting
        # process (CAP_SYS_PTRACE) every process
        "ProtectProc": ["ptraceable"], "PrivateMounts": ["yes"],
        "NoNewPrivileges": ["yes"], "PrivateDevices": ["no"],
        "LimitNOFILE": ["65536"],  # issue 20: slow clients must not exhaust descriptors
    }
    for key, value in expect.items():
        assert d.get(key) == value, key
    assert sorted(d["DeviceAllow"]) == ["/dev/kfd rw", "char-drm rw", "char-nvidia* rw"]
    assert d["EnvironmentFile"] == ["-/etc/default/unified-gpu-exporter"]
    filters = " ".join(d["SystemCallFilter"])
    assert "~@privileged" in filters and "@debug" in filters  # ptrace(2), process_vm_* denied
    assert "video" in d["SupplementaryGroups"][0] and "render" in d["SupplementaryGroups"][0]


def test_env_file_args_are_shell_words():
    cp = configparser.ConfigParser()
    cp.read_string("[env]\n" + ENV.read_text())
    args = shlex.split(shlex.split(cp["env"]["ARGS"])[0])
    assert "--web.listen-address=:9632" in args
    assert all(a.startswith("--") for a in args)
