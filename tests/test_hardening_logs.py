"""Issue 37, items 6 and 12: a log line is one line whatever a peer puts in it (control
characters escaped as node_exporter's go-kit logfmt does, long values cut with a marker), and an
upstream target that changes its unknown metric names at every poll writes one summarized line,
not one line per poll with every name whole."""

from __future__ import annotations

import json
import logging

from exporter.logs import JsonFormatter, LogfmtFormatter
from tests.test_upstream_http import ExporterServer, Route, server  # noqa: F401
from tests.test_upstream_versions import DATA, source


def _record(msg: str, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("unified_gpu_exporter", logging.WARNING, __file__, 1, msg, (), None)
    rec.__dict__.update(extra)
    return rec


def test_control_characters_cannot_forge_or_hide_a_line() -> None:
    # a drop-dir file name: CR moves the terminal's cursor, ESC clears the screen, LF starts a
    # forged line (before the fix only LF, TAB, space, = and " were escaped)
    name = 'x.ncu-rep\rts=2026-01-01 level=error msg="root login"\x1b[2J\x85\u2028end'
    line = LogfmtFormatter().format(_record("import rejected", file=name))
    assert not any(ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f or c in "\u2028\u2029" for c in line), repr(line)
    assert 'file="x.ncu-rep\\rts=2026-01-01 level=error msg=\\"root login\\"\\u001b[2J\\u0085\\u2028end"' in line
    doc = json.loads(JsonFormatter().format(_record("import rejected", file=name)))
    assert doc["file"] == name  # JSON escapes them itself, the value round-trips


def test_a_long_value_is_cut_with_a_marker() -> None:
    big = "A" * 1_200_000
    for fmt in (LogfmtFormatter(), JsonFormatter()):
        line = fmt.format(_record("upstream names: " + big, names=big))
        assert len(line) < 20_000, len(line)
        assert "(cut, 1200000 characters)" in line


def test_changing_unknown_names_are_summarized(server: ExporterServer, caplog) -> None:  # noqa: F811
    text = (DATA / "dcgm-exporter-4.9.prom").read_text()
    src = source(server, "/names", text)
    src.open()
    labels = 'gpu="0",UUID="GPU-5b7c3a2e-9d41-4f6a-b8e2-1c0d9e8f7a65",pci_bus_id="00000000:1B:00.0"'
    with caplog.at_level(logging.INFO, logger="exporter.sources.upstream"):
        for poll in range(5):  # a target that invents new names at every poll, each 100k long
            extra = "".join(f"DCGM_FI_X{poll}_{i}_{'N' * 100_000}{{{labels}}} 1\n" for i in range(3))
            server.routes["/names"] = Route(body=(text + extra).encode())
            src.poll()
    src.close()
    lines = [r.getMessage() for r in caplog.records if "no mapping knows" in r.getMessage()]
    assert len(lines) == 1, len(lines)  # before the fix: one line per poll, 300 kB each
    assert len(lines[0]) < 2000, len(lines[0])
    assert "(100013 characters)" in lines[0]
