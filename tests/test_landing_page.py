"""The landing page (exporter/serve/landing.py) rendered by a real browser: headless Chromium (Debian's
``chromium``) loads / from a simulated exporter held in its contended phase; the DOM it built must
show, per GPU, the memory state and reason /metrics reports (gpu_memory_state_info), colour-coded,
and the source's state; its screenshot must show the state colours.  The screenshot is kept: under
$ARTIFACTS_DIR when set, else the test's tmp directory (the path is printed).
"""

from __future__ import annotations

import os
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest

from exporter.serve.landing import STATE_COLOURS
from tests.conftest import require_binary
from tests.e2e_util import ProcessSet, http_get, start_exporter, wait_until

PHASE = "bandwidth_saturation"


class _Tables(HTMLParser):
    """Rows of the tables with an id: id -> [[(cell text, [(badge text, style)])]]."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[tuple[str, list[tuple[str, str]]]]]] = {}
        self._table: str | None = None
        self._cell: list | None = None
        self._badge: list | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table" and a.get("id"):
            self._table = a["id"]
            self.tables[self._table] = []
        elif tag == "tr" and self._table:
            self.tables[self._table].append([])
        elif tag == "td" and self._table:
            self._cell = ["", []]
        elif tag == "span" and self._cell is not None and "badge" in a.get("class", ""):
            self._badge = ["", a.get("style", "")]

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = None
        elif tag == "td" and self._cell is not None and self._table:
            self.tables[self._table][-1].append((self._cell[0].strip(), self._cell[1]))
            self._cell = None
        elif tag == "span" and self._badge is not None and self._cell is not None:
            self._cell[1].append((self._badge[0].strip(), self._badge[1]))
            self._badge = None

    def handle_data(self, data):
        if self._badge is not None:
            self._badge[0] += data
        if self._cell is not None:
            self._cell[0] += data + " "


def _chromium(binary: str, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    # tests talk only to loopback (tests/netguard covers Python, not chromium): no background
    # networking, no component updates, and every name but localhost unresolvable
    return subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--no-first-run", "--disable-background-networking", "--disable-component-update",
                           "--disable-sync", "--no-default-browser-check", "--disable-breakpad",
                           "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
                           f"--user-data-dir={tmp / 'chromium-profile'}", *args],
                          capture_output=True, text=True, timeout=120)


def _png_pixels(data: bytes) -> tuple[int, int, set[tuple[int, int, int]]]:
    """Width, height and the set of RGB colours of an 8-bit RGB/RGBA PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, ctype = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and ctype in (2, 6), (depth, ctype)
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw, stride, prev, colours = zlib.decompress(idat), width * bpp, bytearray(width * bpp), set()
    for y in range(height):
        ftype, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if ftype == 1:
                line[i] = (line[i] + a) & 255
            elif ftype == 2:
                line[i] = (line[i] + b) & 255
            elif ftype == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        colours.update(tuple(line[x:x + 3]) for x in range(0, stride, bpp))
        prev = line
    return width, height, colours


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]


def _states(server) -> dict[str, tuple[str, str]]:
    """uuid -> (state, reason) from gpu_memory_state_info on /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(http_get(server.url + "/metrics").text):
        for s in fam.samples:
            if s.name == "gpu_memory_state_info":
                out[s.labels["uuid"]] = (s.labels["state"], s.labels["reason"])
    return out


@pytest.fixture
def artefact_dir(tmp_path) -> Path:
    base = os.environ.get("ARTIFACTS_DIR")
    path = Path(base) / "landing-page" if base else tmp_path
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_landing_page_shows_each_gpus_state_reason_and_evidence_in_chromium(tmp_path, artefact_dir):
    chromium = require_binary("chromium", "chromium")
    with ProcessSet() as procs:
        server = start_exporter(procs, tmp_path, ["--simulate", "--simulate.phase", PHASE,
                                                  "--poll.interval", "250ms"])
        # a stable verdict on every GPU: the same state in two reads a second apart
        # the demo's Intel GPU is a spare in this phase (idle); the others are contended
        wait_until(lambda: sorted(s for s, _ in _states(server).values()) == ["contended"] * 4 + ["idle"],
                   30, 0.5, "every GPU contended but the idle Intel spare")
        expected = _states(server)
        dom = _chromium(chromium, tmp_path, "--dump-dom", server.url + "/")
        shot = artefact_dir / "landing-page.png"
        taken = _chromium(chromium, tmp_path, "--window-size=1400,1000", f"--screenshot={shot}", server.url + "/")
    assert dom.returncode == 0 and "<table" in dom.stdout, dom.stderr[-2000:]
    assert taken.returncode == 0 and shot.is_file(), taken.stderr[-2000:]
    print(f"landing page screenshot: {shot}")

    tables = _Tables()
    tables.feed(dom.stdout)
    header, *rows = tables.tables["gpus"]
    assert len(rows) == 5, rows
    seen = {}
    for cells in rows:
        texts = [t for t, _ in cells]
        uuid, (badge_text, style) = texts[3], cells[5][1][0]
        bg, fg = STATE_COLOURS[badge_text]
        assert f"background:{bg}" in style.replace(" ", "") and f"color:{fg}" in style.replace(" ", "")
        seen[uuid] = (badge_text, texts[6])
        if badge_text == "idle":
            continue
        evidence = texts[7]
        assert "bandwidth" in evidence and "active clients 2" in evidence, evidence
        assert "co-tenancy evidence: clients counted by simulator" in evidence, evidence
    assert seen == expected
    (src_name, _), (src_state, badges), *_ = tables.tables["sources"][1]
    assert (src_name, src_state, badges[0][0]) == ("simulator", "up", "up")

    width, height, colours = _png_pixels(shot.read_bytes())
    assert (width, height) == (1400, 1000)
    # the legend and the contended badges are painted in their colours (CSS applied, no script)
    assert {_rgb(bg) for bg, _ in STATE_COLOURS.values()} <= colours


def test_landing_page_says_why_a_gpu_has_no_co_tenancy_evidence(tmp_path):
    """A node whose sources count no clients (the simulated node with ``processes: off``): each
    GPU's evidence cell says "none" and the reason /metrics gives in gpu_contention_evidence_info.
    The HTML as served (no browser needed for text)."""
    (tmp_path / "config.yml").write_text("simulate:\n  processes: off\n")
    with ProcessSet() as procs:
        server = start_exporter(procs, tmp_path, ["--simulate", "--simulate.phase", PHASE, "--poll.interval",
                                                  "250ms", "--config.file", str(tmp_path / "config.yml")])
        wait_until(lambda: len(_states(server)) == 5, 30, 0.5, "every GPU evaluated")
        page = http_get(server.url + "/").text
    tables = _Tables()
    tables.feed(page)
    _, *rows = tables.tables["gpus"]
    assert len(rows) == 5
    for cells in rows:
        evidence = cells[7][0]
        assert "co-tenancy evidence: none (no_client_source)" in evidence, evidence
        assert "active clients" not in evidence, evidence


def test_evidence_text_names_a_partial_count_and_its_reason():
    from exporter.serve.landing import _evidence

    partial = {"gpu_contention_evidence_info": [({"evidence": "clients", "source": "fdinfo",
                                                   "reason": "pid_namespace_private"}, 1.0)],
               "gpu_active_clients": [({}, 2.0)]}
    text = _evidence(partial, {})
    assert "co-tenancy evidence: clients counted by fdinfo (partial: pid_namespace_private)" in text
    assert "active clients 2" in text
    none = {"gpu_contention_evidence_info": [({"evidence": "none", "source": "amdsmi",
                                                "reason": "procfs_unreadable"}, 1.0)]}
    assert "co-tenancy evidence: none (procfs_unreadable)" in _evidence(none, {})
    # a MIG GPU: the GPU's own row, not an instance's
    mig = {"gpu_contention_evidence_info": [({"evidence": "none", "source": "nvml", "reason": "no_permission"}, 1.0)],
           "gpu_active_clients": [({"gpu_instance": "1", "mig_profile": "3g.40gb"}, 2.0)]}
    assert "active clients" not in _evidence(mig, {})


def test_slowdown_is_na_while_contended_without_a_starvation_signal():
    """Issue 39: an AMD or Intel GPU (utilization basis: no memory-bound reference) read
    "slowdown 0%" while contended; nothing sized it."""
    from exporter.serve.landing import _evidence

    contended = [({"state": "contended"}, 1.0), ({"state": "idle"}, 0.0)]
    amd = {"gpu_memory_state": contended, "gpu_contention_slowdown_ratio": [({}, 0.0)]}
    assert "slowdown n/a (no compute-starvation signal to size it)" in _evidence(amd, {})
    unsized = {"gpu_memory_state": contended}  # the engine serves no slowdown while nothing sizes it
    assert "slowdown n/a (no compute-starvation signal to size it)" in _evidence(unsized, {})
    assumed = {"gpu_memory_state": contended, "gpu_contention_slowdown_ratio": [({}, 0.2)]}
    assert "slowdown 20% (assumed: indicators.cost.default_slowdown)" in _evidence(assumed, {})
    nvidia = {**amd, "gpu_contention_slowdown_ratio": [({}, 0.3)],
              "gpu_memory_bound_reference_percent": [({"basis": "occupancy"}, 40.0)]}
    assert "slowdown 30%" in _evidence(nvidia, {}) and "n/a" not in _evidence(nvidia, {})
    calm = {"gpu_memory_state": [({"state": "idle"}, 1.0)], "gpu_contention_slowdown_ratio": [({}, 0.0)]}
    assert "slowdown 0%" in _evidence(calm, {})

