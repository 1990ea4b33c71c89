"""Static checks of the Dockerfile (no container engine here): parsed instruction by instruction."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "Dockerfile"


def parse(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue  # comment inside a continued instruction
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        instr, _, args = buf.strip().partition(" ")
        out.append((instr.upper(), args.strip()))
        buf = ""
    assert not buf, "dangling line continuation"
    return out


def stages(instrs: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for instr, args in instrs:
        if instr == "FROM":
            result.append([])
        if result:
            result[-1].append((instr, args))
    return result


INSTRS = parse(DOCKERFILE.read_text())
STAGES = stages(INSTRS)
FINAL = STAGES[-1]


def final(instr: str) -> list[str]:
    return [a for i, a in FINAL if i == instr]


def test_parser_handles_continuations():
    got = parse("FROM a AS b\n# c\nRUN x \\\n  # inner comment\n  && y\nUSER 1\n")
    assert got == [("FROM", "a AS b"), ("RUN", "x  && y"), ("USER", "1")]


def test_multi_stage_builds_wheel_in_builder():
    froms = [a for i, a in INSTRS if i == "FROM"]
    assert len(froms) >= 2
    assert re.search(r"\bAS builder$", froms[0], re.I)
    builder_runs = " ".join(a for i, a in STAGES[0] if i == "RUN")
    assert "pip wheel" in builder_runs
    assert any(a.startswith("--from=builder") for a in final("COPY"))
    # the final stage does not compile or fetch build tooling
    assert not any("pip wheel" in a for a in final("RUN"))


def test_base_images_pinned():
    args = dict(a.split("=", 1) for i, a in INSTRS if i == "ARG" and "=" in a)
    for i, a in INSTRS:
        if i == "FROM":
            image = a.split()[0]
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
            assert ":" in image and not image.endswith(":latest"), image


def test_non_root_user():
    users = final("USER")
    assert users, "final stage has no USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0", "")
    assert int(user) >= 1000  # numeric, so runAsNonRoot can verify it


def test_healthcheck_gets_healthz_at_the_configured_address_without_curl():
    (hc,) = final("HEALTHCHECK")
    cmd = json.loads(hc[hc.index("CMD") + 3:].strip())
    # exporter/serve/healthcheck.py reads the exporter's own flags (tests/test_install_paths.py runs it)
    assert cmd == ["python", "-m", "exporter.serve.healthcheck"]
    for opt in ("--interval=", "--timeout=", "--retries="):
        assert opt in hc


def test_image_includes_the_nvidia_binding_with_pinned_dependencies():
    args = dict(a.split("=", 1) for i, a in INSTRS if i == "ARG" and "=" in a)
    assert "nvidia" in args["EXTRAS"].split(",")
    runs = " ".join(a for i, a in STAGES[0] if i == "RUN")
    assert runs.count("--constraint constraints.txt") >= 2, runs
    assert "[${EXTRAS}]" in runs
    assert any("constraints.txt" in a for i, a in STAGES[0] if i == "COPY")
    # the base image is pinned to a patch release, not a moving minor tag
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", args["PYTHON_IMAGE"])


def test_baselines_persist_in_the_image():
    env = " ".join(final("ENV"))
    assert "STATE_DIRECTORY=/var/lib/unified-gpu-exporter" in env
    assert "--state.dir=/var/lib/unified-gpu-exporter" in json.loads(final("CMD")[-1])


def test_labels():
    labels = " ".join(final("LABEL"))
    keys = set(re.findall(r"(org\.opencontainers\.image\.[a-z]+)=", labels))
    assert {"org.opencontainers.image.title", "org.opencontainers.image.description",
            "org.opencontainers.image.version"} <= keys


def test_no_add_of_urls_and_no_remote_fetch():
    for instr, args in INSTRS:
        if instr == "ADD":
            assert not re.search(r"https?://", args), args
        if instr == "RUN":
            assert not re.search(r"\b(curl|wget)\b", args), args


def test_entrypoint_port_and_state_volume():
    assert json.loads(final("ENTRYPOINT")[-1]) == ["unified-gpu-exporter"]
    assert final("EXPOSE") == ["9632"]
    assert "/var/lib/unified-gpu-exporter" in json.loads(final("VOLUME")[-1])
    env = " ".join(final("ENV"))
    assert "PYTHONDONTWRITEBYTECODE=1" in env  # read-only root fs: no .pyc writes at run time


def test_dockerignore_keeps_context_small():
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", "tests"} <= ignored
    copied = {shlex.split(a)[0] for i, a in INSTRS if i == "COPY" and not a.startswith("--")}
    assert not copied & ignored, copied & ignored  # nothing COPY needs is ignored


def _header() -> str:
    return "\n".join(ln[1:].strip() for ln in DOCKERFILE.read_text().splitlines()
                     if ln.startswith("#") and not ln.startswith("# syntax"))


def test_header_mounts_and_flags_agree_and_name_existing_readme_sections():
    header = _header()
    # a host tree mounted over /sys elsewhere is only read when --path.sysfs names it
    for target in re.findall(r"-v /sys:(\S+?)(?::ro)?\s", header):
        assert f"--path.sysfs={target}" in header, target
    readme = (REPO / "README.md").read_text()
    sections = {m.strip() for m in re.findall(r"^#+ (.+)$", readme, re.M)}
    for name in re.findall(r'README "([^"]+)"', header):
        assert name in sections, f"Dockerfile names README section {name!r}, which does not exist"
    # the run command of the header is the README's
    run = re.search(r"docker run (.*?)unified-gpu-exporter\n", header, re.S).group(1)
    assert " ".join(run.replace("\\", " ").split()) in " ".join(readme.replace("\\", " ").split())
