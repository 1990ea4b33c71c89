"""``unified-gpu-exporter import FILE...``: profiler artifacts -> canonical exposition or JSON.

For engineers comparing runs offline: prints the canonical series the daemon would export for
these files (``--format text``, the Prometheus text format) or, with ``--format json``, a
per-file summary (kernels, launch delay, timeline aligned to the artifact's zero), the files
grouped by trace id, and the canonical series.  The text output has no ``gpu_info`` (the GPU is
one the node's exporter lists already); the series carry ``vendor``, ``gpu`` (the profiler's
device number) and ``uuid`` where the artifact records it, and stderr names each file's GPUs.  Each file is parsed in a child process under the
daemon's default limits (``isolate``), which flags raise or lower (``--import-memory-bytes``,
``--import-cpu-seconds``, ``--import-timeout``, ``--max-events``, ``--max-series``, ...).  Exit status 0 when every file was imported (or is a
companion file), 1 when any was rejected, 2 on usage errors.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from ..map.mapper import Mapper
from ..map.mapping import MappingSet
from ..map.schema import default_mappings_dir, load_schema
from ..map.store import SourceState, Store
from ..model import PollResult, SourceStats, identity_labels
from ..render.exposition import Renderer
from ..run.argparsing import OneLineErrorParser
from ..yamlfile import ConfigError
from .answer import MIN_MEMORY_BYTES
from .detect import MAX_BYTES, valid_trace_id
from .isolate import Imported, Importer, ImportLimits
from .model import CompanionFile, ProfileRejected


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(prog="unified-gpu-exporter import",
                           description="Import profiler artifacts (ncu CSV, nsys SQLite, rocprof CSV, "
                                       "Kineto JSON, unitrace CSV) into the canonical schema.")
    d = ImportLimits()
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="profiler artifacts to import (gzip allowed); the format is detected from the content")
    p.add_argument("--format", choices=["text", "json"], default="text",
                   help="text: the canonical series in the Prometheus text format (for node_exporter's "
                        "textfile collector); json: a summary per file, the files grouped by trace "
                        "id, and the series (default text)")
    p.add_argument("--trace-id", dest="trace_id", help="trace id for every file (default: sidecar "
                   "<file>.meta.json, an NVTX/annotation range 'trace_id=ID', or 'traceid-ID' in the name)")
    p.add_argument("--top-kernels", dest="top_kernels", type=_positive, default=10,
                   help="kernels per GPU that keep their name, by total time; the rest are pooled as "
                        "kernel=\"other\" (default 10)")
    p.add_argument("--path.mappings", dest="mappings", type=Path,
                   help="the mappings folder (default: the installed mappings/)")
    p.add_argument("--max-file-bytes", dest="max_bytes", type=_positive, default=MAX_BYTES,
                   help=f"bytes read from one file, after decompression (default {MAX_BYTES})")
    # each file is parsed in a child process under these limits (the daemon's options of the same name)
    p.add_argument("--import-memory-bytes", dest="memory_bytes", type=_at_least(MIN_MEMORY_BYTES),
                   default=d.memory_bytes,
                   help=f"address space of the child that parses one file, at least {MIN_MEMORY_BYTES >> 20} "
                        f"MiB (default {d.memory_bytes}: import_memory_bytes)")
    p.add_argument("--import-cpu-seconds", dest="cpu_seconds", type=_positive, default=d.cpu_seconds,
                   help=f"CPU seconds that child may use (default {d.cpu_seconds}: import_cpu_seconds)")
    p.add_argument("--import-timeout", dest="timeout", type=_seconds, default=d.timeout,
                   help=f"wall-clock seconds before the child is killed (default {d.timeout:g}: import_timeout)")
    p.add_argument("--max-events", dest="max_events", type=_positive, default=d.max_events,
                   help=f"trace events or table rows read from one file (default {d.max_events}: "
                        "max_events_per_import)")
    p.add_argument("--max-series", dest="max_series", type=_positive, default=d.max_series,
                   help=f"series one file may give (default {d.max_series}: max_series_per_import)")
    p.add_argument("--max-devices", dest="max_devices", type=_positive, default=d.max_devices,
                   help=f"GPUs one file may name (default {d.max_devices}: max_devices_per_import)")
    return p


def _at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value
    return parse


_positive = _at_least(1)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 86400 seconds, got {text}")
    return value


_HISTOGRAM_PART = re.compile(r"_(bucket|count|sum)$")


def _map(imports: list[Imported], mappings: MappingSet) -> tuple[dict, object]:
    """(devices by key, mapping result) of these imports."""
    sample = PollResult(monotonic=1.0)
    devices: dict = {}
    for imp in imports:
        sample.readings.extend(imp.sample.readings)
        for d in imp.devices:
            devices.setdefault(d.key, d)
    sample.devices = list(devices.values())
    return devices, Mapper(mappings).map(sample, devices)


def _gpus(imp: Imported) -> str:
    """The artifact's GPUs as the series name them: uuid where the artifact records it, else
    only the profiler's device number (which is the node's index only when the profiled
    process saw every GPU)."""
    out = []
    for d in imp.devices:
        model = f" ({d.model})" if d.model else ""
        out.append(f'gpu="{d.index}" uuid="{d.uuid}"{model}' if d.uuid else
                   f'gpu="{d.index}"{model}, no UUID in the file (join on gpu only where the profiled '
                   f'process saw every GPU)')
    return "GPUs: " + "; ".join(out) if out else "no GPU"


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0) if exc.code in (0, None) else 2
    if args.trace_id is not None and not valid_trace_id(args.trace_id):
        print(f"error: invalid --trace-id {args.trace_id!r}: 1-64 of [A-Za-z0-9._:-]", file=sys.stderr)
        return 2
    mdir = args.mappings or default_mappings_dir()
    try:
        schema = load_schema(mdir / "canonical.yaml")
        mappings = MappingSet.load_dir(mdir, schema)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    imports: list[Imported] = []
    rejected, companions = [], []
    limits = ImportLimits(max_bytes=args.max_bytes, max_events=args.max_events, max_devices=args.max_devices,
                          max_series=args.max_series, memory_bytes=args.memory_bytes,
                          cpu_seconds=args.cpu_seconds, timeout=args.timeout)
    importer = Importer(limits, args.top_kernels, mappings.raw_fields(), summary=args.format == "json")
    for f in args.files:
        try:
            imports.append(importer.file(f, trace_id=args.trace_id))
        except CompanionFile as exc:
            companions.append({"path": f, "note": str(exc)})
        except ProfileRejected as exc:
            rejected.append({"path": f, "reason": str(exc)})
    devices, result = _map(imports, mappings)
    for r in rejected:
        print(f"rejected: {r['path']}: {r['reason']}", file=sys.stderr)
    for c in companions:
        print(f"companion: {c['path']}: {c['note']}", file=sys.stderr)
    for imp in imports:  # what each file gave; a file that gives nothing but identity is suspect
        p = imp.profile
        names = sorted({_HISTOGRAM_PART.sub("", name)
                        for frame in _map([imp], mappings)[1].frames.values()
                        for name, _ in frame})
        if names:
            print(f"imported: {p.path} ({p.tool}): {len(names)} metrics: {', '.join(names)}; "
                  f"{_gpus(imp)}", file=sys.stderr)
        else:
            print(f"warning: {p.path} ({p.tool}): no series the canonical schema maps (counters the "
                  f"mappings do not know, or an empty capture); {_gpus(imp)}", file=sys.stderr)
    if args.format == "json":
        traces: dict[str, list[dict]] = {}
        for imp in imports:
            if imp.profile.trace_id:
                traces.setdefault(imp.profile.trace_id, []).append({
                    "path": imp.profile.path, "tool": imp.profile.tool,
                    "wall_zero_unix_ns": (imp.summary or {}).get("timeline", {}).get("wall_zero_unix_ns")})
        out = {"profiles": [imp.summary for imp in imports], "rejected": rejected,
               "companions": companions, "traces": traces,
               "series": [{"name": name, "labels": dict(labels), "value": value}
                          for name, labels, value in sorted(
                              (name, identity_labels(dev_id) + extra, value)
                              for dev_id, frame in result.frames.items() for (name, extra), value in frame.items())]}
        json.dump(out, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        store = Store()
        # no gpu_info: the GPU is the one the node's exporter already lists (a second gpu_info
        # through the textfile collector counts it twice, or as a phantom GPU when the artifact
        # has no UUID); the series carry vendor, gpu and uuid (when the artifact has it) to join on
        st = SourceState("profiles", stats=SourceStats(up=True, state="up"), provides_identity=False)
        st.devices, st.frames = devices, result.frames
        store.add(st)
        # the daemon's renderer, for the imported series only: not the exporter's self-metrics
        # nor this command's own process_* metrics (they collide with the textfile collector's
        # in node_exporter)
        renderer = Renderer(schema)
        renderer.self_metrics = False
        sys.stdout.buffer.write(renderer.render(store).text)
    sys.stdout.flush()
    return 1 if rejected else 0
