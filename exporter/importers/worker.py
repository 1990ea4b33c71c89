"""The child process that parses one artifact for ``isolate`` (never imported by the daemon itself).

``isolate`` starts ``python -I -S -c BOOT``: ``BOOT`` lowers the child's own resource limits
(address space, CPU seconds, file size, no core file) before anything else runs, then calls
``main``.  ``main`` reads its request (JSON on stdin: the fds it inherited, the file's name, the
limits, the conversion settings), parses the file through the inherited fd
(``detect.import_fd``), converts it under the per-import caps (``convert.checked_sample``) and
writes one JSON answer on stdout: the profile's description, its devices and readings (label
sets once, readings by index), or the reason it was rejected and the limit it hit.  Nothing of
the artifact itself travels back: only what is exported, bounded by ``max_series_per_import``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from .convert import checked_sample, summary
from .detect import import_fd
from .model import CompanionFile, Profile, ProfileRejected, clean_profile

MAX_WARNINGS = 20
MAX_TEXT = 500

# run by ``python -I -S -c``: argv = [-c, memory bytes, CPU seconds, file size bytes, package root]
BOOT = """\
import json, resource, signal, sys
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
    sys.stdout.write(json.dumps({"ok": False, "kind": "crash",
                                 "reason": f"the import worker cannot set its resource limits ({exc})"}))
    sys.exit(0)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past RLIMIT_FSIZE fails (EFBIG), no signal
sys.path.insert(0, sys.argv[4])
from exporter.importers.worker import main
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
        prof = clean_profile(import_fd(
            req["fd"], req["dir_fd"], req["name"], trace_id=req["trace_id"], max_bytes=req["max_bytes"],
            path=req["path"], single_link=req["single_link"], max_events=req["max_events"],
            tmp_dir=req["tmp_dir"], sqlite={"time_limit": req["timeout"], "heap_limit": req["heap_limit"]}))
        allowed = {k: set(v) for k, v in req["allowed"].items()} if req["allowed"] is not None else None
        devices, sample = checked_sample(prof, req["top_n"], allowed, req["max_devices"], req["max_series"])
        summ = summary(prof, req["top_n"]) if req["summary"] else None
        prof.kernels, prof.ranges = [], []  # not sent: free them before the answer is built
        return encode(prof, devices, sample, summ)
    except CompanionFile as exc:
        return {"ok": False, "companion": True, "reason": _text(exc), "kind": ""}
    except ProfileRejected as exc:
        return {"ok": False, "reason": _text(exc), "kind": exc.kind}
    except MemoryError:
        return {"ok": False, "reason": "too large to parse in memory (the import memory limit)", "kind": "memory"}
    except RecursionError:
        return {"ok": False, "reason": "too deeply nested", "kind": ""}
    except Exception as exc:  # noqa: BLE001 - a converter bug on a hostile file is a rejection too
        return {"ok": False, "reason": _text(f"parser error: {type(exc).__name__}: {exc}"), "kind": ""}


def main() -> int:
    req = json.loads(sys.stdin.buffer.read())
    out = answer(req)
    try:
        data = json.dumps(out, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
    except MemoryError:
        data = b'{"ok":false,"kind":"memory","reason":"too large to describe in memory (the import memory limit)"}'
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
    return 0
