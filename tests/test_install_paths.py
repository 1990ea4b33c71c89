"""Every shipped install path, replayed (issue 15): the Dockerfile's install steps in a venv find
the (fake) NVIDIA GPUs with the binding it installs; the README's venv path installs the console
script the systemd unit runs, and `systemd-analyze verify` is clean on that unit; the build prints
no setuptools warning; every shipped install keeps baselines in a state directory; the image's
health check answers for the exporter's configured address."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, require_binary
from tests.e2e_util import ProcessSet, exporter, free_port, wait_until
from tests.test_dockerfile import STAGES
from tests.test_systemd_unit import INSTALLED, unit_copy

CONTEXT = ["pyproject.toml", "README.md", "LICENSE", "constraints.txt", "exporter", "mappings"]


def _build_context(tmp: Path) -> Path:
    """What the Dockerfile COPYs (a fresh copy: no build artifacts of the checkout)."""
    src = tmp / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in CONTEXT:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    return src


def _run(script: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def image_venv(tmp_path_factory):
    """The builder stage's RUN steps, with /opt/venv and /dist moved under a temporary directory."""
    tmp = tmp_path_factory.mktemp("image")
    src = _build_context(tmp)
    builder = STAGES[0]
    args = dict(a.split("=", 1) for i, a in builder if i == "ARG" and "=" in a)
    run, = [a for i, a in builder if i == "RUN"]
    script = run.replace("/opt/venv", str(tmp / "venv")).replace("/dist", str(tmp / "dist"))
    script = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], script)
    script = script.replace("python -m venv", f"{shlex.quote(sys.executable)} -m venv")
    result = _run(script, src)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return tmp / "venv", result


def test_image_build_prints_no_setuptools_warning(image_venv):
    _, result = image_venv
    out = result.stdout + result.stderr
    assert not re.search(r"(?i)deprecat|SetuptoolsWarning|BuildBackendWarning|is absent from", out), out[-3000:]


def test_image_install_finds_the_fake_nvidia_gpus(image_venv, tmp_path):
    venv, _ = image_venv
    site = subprocess.run([str(venv / "bin" / "python"), "-c",
                           "import pynvml, exporter; print(pynvml.__file__); print(exporter.__file__)"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert site.returncode == 0, site.stderr  # nvidia-ml-py is in the image
    assert all(line.startswith(str(venv)) for line in site.stdout.split()), site.stdout
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    shutil.copy2(REPO / "tests" / "fakes" / "pynvml_fake.py", fakes / "pynvml_fake.py")
    launcher = tmp_path / "launch.py"
    launcher.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(fakes)!r})\n"
        "import pynvml_fake as pf\n"
        "sys.modules['pynvml'] = pf.make_module([pf.h100(0), pf.h100(1)])\n"
        "from exporter.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n")
    empty = tmp_path / "sys"
    empty.mkdir()
    once = subprocess.run([str(venv / "bin" / "python"), "-I", str(launcher), "--once",
                           "--path.sysfs", str(empty), "--state.dir", str(tmp_path / "state")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert once.returncode == 0, once.stderr[-3000:]
    text = once.stdout
    assert text.count('gpu_info{') == 2 and 'source="nvml"' in text, text[:2000]
    assert 'unified_gpu_exporter_source_up{source="nvml"} 1.0' in text
    ups = [ln for ln in text.splitlines() if ln.startswith("unified_gpu_exporter_source_up{")]
    assert ups == ['unified_gpu_exporter_source_up{source="nvml"} 1.0'], ups  # absent ones: none
    assert re.search(r'gpu_memory_bandwidth_utilization_percent\{[^}]*gpu="1"', text)


def _readme_venv_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    m = re.search(r"### venv \+ systemd.*?```sh\n(.*?)```", text, re.S)
    assert m, "README lost its venv + systemd section"
    return [ln.strip() for ln in m.group(1).splitlines() if ln.strip() and not ln.strip().startswith("#")]


def test_readme_venv_path_installs_what_the_unit_runs_and_the_unit_verifies(tmp_path):
    analyze = require_binary("systemd-analyze", "systemd")
    commands = _readme_venv_commands()
    venv_dir = str(Path(INSTALLED).parent.parent)  # /opt/unified-gpu-exporter
    assert any(f"-m venv {venv_dir}" in c for c in commands), commands
    root = tmp_path / "root"
    script = []
    for command in commands:
        command = command.removeprefix("sudo ")
        if command.startswith(("apt-get", "cp ", "systemctl")) or "systemctl" in command:
            continue  # system changes; the unit is verified below instead
        command = command.replace(venv_dir, f"{root}{venv_dir}")
        command = command.replace("python3 -m venv", f"{shlex.quote(sys.executable)} -m venv")
        script.append(command)
    assert len(script) == 2, script  # the venv and the pip install
    result = _run("\n".join(script), REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    installed = Path(f"{root}{INSTALLED}")
    version = subprocess.run([str(installed), "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and "unified-gpu-exporter" in version.stdout, version.stderr
    unit = unit_copy(tmp_path, executable=installed)
    verify = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0, verify.stderr
    assert "Unknown key" not in verify.stderr and "Failed to parse" not in verify.stderr, verify.stderr
    assert "not executable" not in verify.stderr and "No such file" not in verify.stderr, verify.stderr


# --------------------------------------------------------------------------- state directory

def test_every_shipped_install_keeps_baselines_in_a_state_directory():
    unit = (REPO / "systemd" / "unified-gpu-exporter.service").read_text()
    assert "StateDirectory=unified-gpu-exporter" in unit  # -> $STATE_DIRECTORY, the flag's default
    env = (REPO / "systemd" / "unified-gpu-exporter.env").read_text()
    assert re.search(r'^ARGS=".*--state\.dir=/var/lib/unified-gpu-exporter', env, re.M)
    readme = (REPO / "README.md").read_text()
    assert "-v ugx-state:/var/lib/unified-gpu-exporter" in readme
    # Kubernetes: opt-in (a root init container hands the hostPath over; issue 38), rendered and
    # checked in tests/test_kubernetes_privileges.py; the default pod keeps them in memory
    comp = yaml.safe_load((REPO / "deploy" / "kubernetes" / "components" / "persistent-state"
                           / "kustomization.yaml").read_text())
    ops = yaml.safe_load(comp["patches"][0]["patch"])
    assert {"op": "add", "path": "/spec/template/spec/containers/0/args/-",
            "value": "--state.dir=/var/lib/unified-gpu-exporter"} in ops
    (vol,) = [o["value"] for o in ops if o["path"] == "/spec/template/spec/volumes/-"]
    assert vol["hostPath"]["path"] == "/var/lib/unified-gpu-exporter"


def test_state_directory_defaults_to_systemd_state_directory(monkeypatch):
    from exporter.run.argparsing import build_parser

    monkeypatch.setenv("STATE_DIRECTORY", "/var/lib/unified-gpu-exporter:/var/lib/other")
    assert str(build_parser().parse_args([]).state_dir) == "/var/lib/unified-gpu-exporter"
    assert str(build_parser().parse_args(["--state.dir", "/x"]).state_dir) == "/x"
    monkeypatch.delenv("STATE_DIRECTORY")
    assert build_parser().parse_args([]).state_dir is None


def test_baselines_are_written_to_state_directory_under_systemd_env(tmp_path):
    """The exporter started as systemd starts it (only $STATE_DIRECTORY) saves its baselines there."""
    state = tmp_path / "state"
    state.mkdir()
    with ProcessSet() as procs:
        server = exporter(tmp_path, ["--simulate", "--poll.interval", "250ms"])
        server.env = {**(server.env or {}), "STATE_DIRECTORY": str(state)}
        procs.add(server).start().wait_ready("/readyz", 20)
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(20) == 0
    assert any(state.iterdir()), "nothing saved in $STATE_DIRECTORY"


# ------------------------------------------------------------------------------- healthcheck

def _healthcheck(pid: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exporter.serve.healthcheck", "--pid", str(pid)],
                          capture_output=True, text=True, timeout=30, cwd=REPO)


def test_healthcheck_follows_the_exporters_configured_address(tmp_path):
    with ProcessSet() as procs:
        port = free_port()
        server = procs.add(exporter(tmp_path, ["--simulate"]))
        server.argv = [a if a != f"127.0.0.1:{server.port}" else f"127.0.0.1:{port}" for a in server.argv]
        server.port = port
        server.listen_log = rf"\baddress=127\.0\.0\.1:{port}\b"
        server.start().wait_ready("/healthz", 20)
        ok = _healthcheck(server.proc.pid)
        assert ok.returncode == 0, ok.stderr
        server.proc.send_signal(signal.SIGSTOP)  # alive but not answering
        try:
            hung = _healthcheck(server.proc.pid)
        finally:
            server.proc.send_signal(signal.SIGCONT)
        assert hung.returncode == 1 and f"127.0.0.1:{port}/healthz" in hung.stderr, hung.stderr


def test_healthcheck_uses_https_when_the_web_config_enables_tls(tmp_path):
    openssl = require_binary("openssl", "openssl")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    web = tmp_path / "web.yml"
    web.write_text(json.dumps({"tls_server_config": {"cert_file": str(cert), "key_file": str(key)}}))
    from exporter.serve.healthcheck import target

    assert target(["python", "-m", "exporter", "--web.listen-address", ":9700",
                   "--web.config.file", str(web)]) == ("127.0.0.1", 9700, True)
    assert target(["unified-gpu-exporter"]) == ("127.0.0.1", 9632, False)
    assert target(["x", "--web.listen-address=[::]:9633"]) == ("::1", 9633, False)
    with ProcessSet() as procs:
        server = procs.add(exporter(tmp_path, ["--simulate", "--web.config.file", str(web)]))
        server.start()
        wait_until(lambda: _healthcheck(server.proc.pid).returncode == 0, 30, 0.5, "healthy over TLS")


# ------------------------------------------------------------------------------ small items

def test_version_is_defined_in_one_place():
    from exporter import __version__

    assert 'dynamic = ["version"]' in (REPO / "pyproject.toml").read_text()
    for name in ("pyproject.toml", "Dockerfile", "README.md", "Makefile"):
        assert __version__ not in (REPO / name).read_text(), name


def test_make_run_announces_the_address_args_give():
    make = require_binary("make", "make")

    def address(args: str) -> str:
        return subprocess.run([make, "-s", "print-address", f"ARGS={args}"], cwd=REPO, capture_output=True,
                              text=True, timeout=60).stdout.strip()

    assert address("") == ":9632"
    assert address("--web.listen-address=127.0.0.1:9700 --log.level=debug") == "127.0.0.1:9700"
    assert address("--web.listen-address [::1]:9701") == "[::1]:9701"


def test_import_into_a_closed_pipe_has_no_traceback(shared_fixtures):
    files = sorted(str(p) for p in (shared_fixtures / "profilers").glob("*") if p.suffix in (".json", ".csv"))
    assert files
    cmd = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "exporter", "import", "--format", "json", *files])
    result = subprocess.run(["bash", "-c", f"{cmd} | head -c 10 >/dev/null; echo ${{PIPESTATUS[0]}}"],
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr, result.stderr


def test_help_names_the_import_subcommand():
    out = subprocess.run([sys.executable, "-m", "exporter", "--help"], capture_output=True, text=True,
                         timeout=60, cwd=REPO).stdout
    assert "unified-gpu-exporter import FILE" in out


def test_make_test_keeps_the_artefacts_under_build(tmp_path):
    """The landing page's screenshot and the demo's report land in build/artifacts (git-ignored,
    kept by CI) unless ARTIFACTS_DIR says elsewhere."""
    make = require_binary("make", "make")

    def dry_run(*extra: str) -> str:
        return subprocess.run([make, "-n", "-s", "test", *extra], cwd=REPO, capture_output=True, text=True,
                              timeout=60).stdout

    assert f'ARTIFACTS_DIR="{REPO}/build/artifacts" ' in dry_run()
    assert f'ARTIFACTS_DIR="{tmp_path}" ' in dry_run(f"ARTIFACTS_DIR={tmp_path}")
    assert "build/" in (REPO / ".gitignore").read_text().splitlines()
