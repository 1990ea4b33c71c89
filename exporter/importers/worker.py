"""The child process that parses one artifact for ``isolate`` (never imported by the daemon itself).

``isolate`` starts ``python -I -S -c BOOT``: before anything else runs, ``BOOT`` ignores the
stop signals (the parent kills it when the daemon stops), sets its ``oom_score_adj`` to 1000,
makes itself non-dumpable (``PR_SET_DUMPABLE`` 0: no process of its uid may ptrace it, read its
memory or take its descriptors),
drops every capability it still has (uid 0 that could not switch users) and lowers its own
resource limits (address space, CPU seconds, file size, no core file), then calls ``main``.
``main`` reads its request (JSON on stdin: the fds it inherited, the file's name, the limits,
the conversion settings; ``{"probe": true}`` only checks that a worker starts), parses the file
through the inherited fds (``detect.import_fd``: the file, its siblings, the folder for an
SQLite copy), converts it under the per-import caps (``convert.converted``) and
writes one JSON answer on stdout: the profile's description, its devices and readings (label
sets once, readings by index), or the reason it was rejected and the limit it hit.  Nothing of
the artifact itself travels back: only what is exported, bounded by ``max_series_per_import``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from ..privsep.caps import SOURCE
from .convert import converted
from .detect import import_fd, parse_failure
from .model import CompanionFile, Profile, ProfileRejected

MAX_WARNINGS = 20
MAX_TEXT = 500

# run by ``python -I -S -c``: argv = [-c, memory bytes, CPU seconds, file size bytes, package root
# (/proc/self/fd/N: the folder holding exporter/, handed over as an fd)]; it starts with
# ``privsep.caps.SOURCE`` (prctl, capabilities, restrict: the package is not importable yet)
BOOT = SOURCE + """\
import json, os, resource, signal, sys
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)  # systemd signals the whole cgroup: the parent stops this one
def refuse(why):
    sys.stdout.write(json.dumps({"ok": False, "kind": "environment", "reason": why}))
    sys.exit(0)
try:
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")  # under memory pressure the kernel kills this child first, never the daemon
except OSError:
    pass
try:
    prctl(PR_SET_DUMPABLE, 0)  # no process of this uid may trace it
except OSError as exc:
    refuse(f"the import worker cannot make itself non-dumpable (errno {exc.errno})")
try:
    held = capabilities("self")  # what it holds or hands on (an inheritable set alone grants nothing);
    # OSError when /proc/self/status cannot be read: it refuses (never "unreadable, so nothing held")
    if held["CapPrm"] or held["CapEff"] or held.get("CapAmb"):
        restrict(0)  # uid 0 that could not switch users: no_new_privs, every capability dropped
except (OSError, ImportError, AttributeError) as exc:
    refuse(f"the import worker cannot drop its capabilities ({exc})")
def lower(res, soft, hard):
    have = resource.getrlimit(res)[1]
    if have != resource.RLIM_INFINITY:
        soft, hard = min(soft, have), min(hard, have)
    resource.setrlimit(res, (soft, hard))
try:
    mem, cpu, fsize = (int(a) for a in sys.argv[1:4])
    lower(resource.RLIMIT_AS, mem, mem)
    lower(resource.RLIMIT_FSIZE, fsize, fsize)
    lower(resource.RLIMIT_CORE, 0, 0)
    lower(resource.RLIMIT_CPU, cpu, cpu + 1)  # SIGXCPU, then SIGKILL a second later
except (OSError, ValueError) as exc:
    refuse(f"the import worker cannot set its resource limits ({exc})")
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past RLIMIT_FSIZE fails (EFBIG), no signal
sys.path.insert(0, sys.argv[4])
from exporter.importers.worker import main  # every module the parse needs: none is imported later
if sys.argv[4].startswith("/proc/self/fd/"):  # the package folder's fd: not held while the file is parsed
    sys.path.remove(sys.argv[4])
    os.close(int(sys.argv[4][len("/proc/self/fd/"):]))
sys.exit(main())
"""

def _text(value: object) -> str:
    return str(value)[:MAX_TEXT]


def encode(prof: Profile, devices: list, sample: Any, summ: dict | None) -> dict:
    """The answer for an imported profile (JSON-ready; each label set listed once)."""
    index = {d.key: i for i, d in enumerate(devices)}
    labels: dict[tuple, int] = {}
    readings = []
    for r in sample.readings:
        li = labels.setdefault(r.labels, len(labels))
        readings.append([index[r.device], r.field, r.value, li])
    return {
        "ok": True,
        "profile": {"tool": prof.tool, "variant": prof.variant, "path": prof.path, "trace_id": prof.trace_id,
                    "trace_id_from": prof.trace_id_from, "wall_zero_ns": prof.wall_zero_ns,
                    "warnings": [_text(w) for w in prof.warnings[:MAX_WARNINGS]]},
        "devices": [{"key": d.key, "vendor": d.vendor, "index": d.index, "mapping": d.mapping, "uuid": d.uuid,
                     "model": d.model, "pci_bus_id": d.pci_bus_id} for d in devices],
        "labels": [[list(pair) for pair in ls] for ls in labels],
        "readings": readings,
        "errors": dict(sample.errors),
        "summary": summ,
    }


def answer(req: dict) -> dict:
    """Parse and convert the file the request names; the answer (never raises)."""
    try:
        tmp = f"/proc/self/fd/{req['tmp_fd']}" if req["tmp_fd"] is not None else ""  # "": no SQLite copy
        parsed = import_fd(
            req["fd"], None, req["name"], trace_id=req["trace_id"], max_bytes=req["max_bytes"],
            path=req["path"], single_link=req["single_link"], max_events=req["max_events"],
            tmp_dir=tmp, sqlite={"time_limit": req["timeout"], "heap_limit": req["heap_limit"]},
            opened=req["siblings"])
        allowed = {k: set(v) for k, v in req["allowed"].items()} if req["allowed"] is not None else None
        prof, devices, sample, summ = converted(parsed, req["top_n"], allowed, req["max_devices"],
                                                req["max_series"], req["summary"])
        prof.kernels, prof.ranges = [], []  # not sent: free them before the answer is built
        return encode(prof, devices, sample, summ)
    except CompanionFile as exc:
        return {"ok": False, "companion": True, "reason": _text(exc), "kind": ""}
    except ProfileRejected as exc:
        return {"ok": False, "reason": _text(exc), "kind": exc.kind}
    except Exception as exc:  # noqa: BLE001 - a converter bug on a hostile file is a rejection too
        rejected = parse_failure(exc)  # MemoryError, RecursionError, anything else
        return {"ok": False, "reason": _text(rejected), "kind": rejected.kind}


def main() -> int:
    req = json.loads(sys.stdin.buffer.read())
    out = {"ok": True, "probe": True} if req.get("probe") is True else answer(req)
    try:
        data = json.dumps(out, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
    except MemoryError:
        data = b'{"ok":false,"kind":"memory","reason":"too large to describe in memory (the import memory limit)"}'
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
    return 0
