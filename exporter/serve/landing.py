"""The landing page (GET /): what the exporter says about each GPU right now, without JavaScript.

Per GPU its memory state (colour-coded), the reason the state machine gives and the evidence
behind it (bandwidth, the compute signal, active clients, the dominant cause, the slowdown against
the memory-bound reference, contended seconds); per source its state and reason.  Everything is
read from what the last poll and indicator step left (``Store``, ``Daemon.extra_series``): opening
the page computes nothing and never touches a device.  Every value is HTML-escaped: model names,
process names and reasons come from drivers and other users' processes.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from .. import __version__
from ..model import DeviceId

if TYPE_CHECKING:
    from ..run.daemon import Daemon

# state -> (background, text) colour; a state this table does not know gets the neutral one
STATE_COLOURS = {
    "contended": ("#c62828", "#fff"),
    "shared": ("#ad1457", "#fff"),
    "throttled": ("#ef6c00", "#fff"),
    "unknown": ("#f9a825", "#000"),
    "memory_bound": ("#1565c0", "#fff"),
    "healthy": ("#2e7d32", "#fff"),
    "idle": ("#9e9e9e", "#000"),
}
SOURCE_COLOURS = {"up": ("#2e7d32", "#fff"), "down": ("#c62828", "#fff"),
                  "starting": ("#f9a825", "#000"), "absent": ("#e0e0e0", "#000")}
NEUTRAL = ("#e0e0e0", "#000")
# canonical inputs shown as evidence, in this order: (series, label)
EVIDENCE_INPUTS = (("gpu_memory_bandwidth_utilization_percent", "bandwidth"),
                   ("gpu_compute_occupancy_percent", "occupancy"),
                   ("gpu_sm_active_percent", "SM active"),
                   ("gpu_compute_utilization_percent", "utilization"))
MAX_ROWS = 4096  # bounded output whatever the number of devices a source reports
STYLE = """body{font-family:sans-serif;margin:1.5em;color:#212121}
table{border-collapse:collapse;margin-bottom:1.5em}th,td{border:1px solid #bdbdbd;padding:.3em .6em;
text-align:left;vertical-align:top}th{background:#f5f5f5}.badge{display:inline-block;padding:.1em .5em;
border-radius:.3em;font-weight:bold}.sim{background:#fff3e0;border:1px solid #ef6c00;padding:.5em}
.legend span{margin-right:.5em}small{color:#616161}"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _badge(text: str, colours: dict[str, tuple[str, str]]) -> str:
    bg, fg = colours.get(text, NEUTRAL)
    return (f'<span class="badge state-{_e(text)}" style="background:{bg};color:{fg}">'
            f"{_e(text)}</span>")


def _num(value: float, unit: str = "") -> str:
    return f"{value:.0f}{unit}" if abs(value) >= 10 else f"{value:.2g}{unit}"


def _indicators(daemon: Daemon) -> dict[DeviceId, dict[str, list[tuple[dict[str, str], float]]]]:
    """The indicators' latest output per device: name -> [(own labels, value)]."""
    out: dict[DeviceId, dict[str, list[tuple[dict[str, str], float]]]] = {}
    for dev, frame in daemon.extra_series(daemon.store).items():
        mine = out[dev] = {}
        for (name, extra), value in frame.items():
            mine.setdefault(name, []).append((dict(extra), value))
    return out


def _inputs(daemon: Daemon) -> dict[DeviceId, dict[str, float]]:
    """The canonical evidence inputs per device (device-level series: no labels beyond identity)."""
    wanted = {name for name, _ in EVIDENCE_INPUTS}
    out: dict[DeviceId, dict[str, float]] = {}
    for st in daemon.store.sources.values():
        for dev, frame in st.frames.items():
            for (name, extra), value in frame.items():
                if name in wanted and not extra:
                    out.setdefault(dev, {})[name] = value
    return out


def _evidence(ind: dict[str, list[tuple[dict[str, str], float]]], inputs: dict[str, float]) -> str:
    parts = [f"{label} {_num(inputs[name], '%')}" for name, label in EVIDENCE_INPUTS if name in inputs]
    # the GPU's own rows (a MIG GPU's instances carry gpu_instance)
    one = {name: own[0] for name, rows in ind.items() if (own := [r for r in rows if "gpu_instance" not in r[0]])}
    if "gpu_contention_evidence_info" in one:
        lab = one["gpu_contention_evidence_info"][0]
        if lab.get("evidence") == "clients":
            parts.append(f"co-tenancy evidence: clients counted by {lab.get('source', '')}"
                         + (f" (partial: {lab['reason']})" if lab.get("reason") else ""))
        else:
            parts.append(f"co-tenancy evidence: none ({lab.get('reason', '')})")
    if "gpu_active_clients" in one:
        parts.append(f"active clients {one['gpu_active_clients'][1]:.0f}")
    if "gpu_top_process_info" in one:
        parts.append(f"top process {one['gpu_top_process_info'][0].get('process', '')}")
    if "gpu_contention_cause_info" in one:
        parts.append(f"cause {one['gpu_contention_cause_info'][0].get('cause', '')}")
    if "gpu_memory_bound_reference_percent" in one:
        lab, v = one["gpu_memory_bound_reference_percent"]
        parts.append(f"memory-bound reference {lab.get('basis', '')} {_num(v, '%')}")
    if "gpu_contention_slowdown_ratio" in one or _contended(ind):
        parts.append(_slowdown(one, ind))
    seconds = sum(v for _, v in ind.get("gpu_memory_contention_seconds_total", []))
    if seconds:
        parts.append(f"contended {seconds:.0f} s since start")
    if any(v == 1 for _, v in ind.get("gpu_baseline_deviation", [])):
        parts.append("below its own baseline")
    return "<br>".join(_e(p) for p in parts) or "<small>no evidence yet</small>"


def _slowdown(one: dict[str, tuple[dict[str, str], float]],
              ind: dict[str, list[tuple[dict[str, str], float]]]) -> str:
    """The slowdown as the engine sized it; while contended without a memory-bound reference
    (no compute-starvation signal: AMD and Intel utilization never starves), nothing sized it:
    ``n/a``, or the configured assumption (``indicators.cost.default_slowdown``) when not 0."""
    if "gpu_contention_slowdown_ratio" not in one:  # the engine serves none while it cannot size it
        return "slowdown n/a (no compute-starvation signal to size it)"
    value = one["gpu_contention_slowdown_ratio"][1]
    if _contended(ind) and "gpu_memory_bound_reference_percent" not in one:
        return f"slowdown {value:.0%} (assumed: indicators.cost.default_slowdown)" if value > 0 else \
            "slowdown n/a (no compute-starvation signal to size it)"
    return f"slowdown {value:.0%}"


def _contended(ind: dict[str, list[tuple[dict[str, str], float]]]) -> bool:
    return any(lab.get("state") == "contended" and v == 1 for lab, v in ind.get("gpu_memory_state", []))


def _gpu_rows(daemon: Daemon) -> list[str]:
    indicators, inputs = _indicators(daemon), _inputs(daemon)
    rows = []
    for source, dev in daemon.store.info_devices()[:MAX_ROWS]:
        ind = indicators.get(dev.id, {})
        info = [r for r in ind.get("gpu_memory_state_info", []) if "gpu_instance" not in r[0]]
        state, reason = (info[0][0].get("state", ""), info[0][0].get("reason", "")) if info else ("", "")
        cells = [_e(dev.vendor), _e(dev.index), _e(dev.model), _e(dev.uuid),
                 _e(source) + (" <small>(simulated)</small>" if dev.simulated else ""),
                 _badge(state, STATE_COLOURS) if state else "<small>not evaluated</small>",
                 _e(reason), _evidence(ind, inputs.get(dev.id, {}))]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return rows


def _simulated_note(daemon: Daemon) -> str:
    if not daemon.settings.simulate:
        return ""
    phase = ""
    for rt in daemon.runtimes:
        current = getattr(rt.source, "current_phase", None)
        if callable(current):
            phase = f", phase <b>{_e(current())}</b>"
    held = " (held by --simulate.phase)" if daemon.settings.simulate_phase else ""
    return (f'<p class="sim">SIMULATED node: scenario <b>{_e(daemon.settings.simulate)}</b>{phase}'
            f"{held}. Values are synthetic.</p>")


def render_landing(daemon: Daemon, telemetry_path: str) -> str:
    path = _e(telemetry_path)
    sources = "".join(
        f"<tr><td>{_e(st.name)}</td><td>{_badge(st.stats.state, SOURCE_COLOURS)}</td><td>{_e(st.stats.reason)}</td>"
        f"<td>{len({d.id for d in st.devices.values()})}</td></tr>" for st in list(daemon.store.sources.values())[:MAX_ROWS])
    legend = "".join(_badge(s, STATE_COLOURS) for s in STATE_COLOURS)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="10">
<title>unified-gpu-exporter</title><style>{STYLE}</style></head>
<body><h1>unified-gpu-exporter {_e(__version__)}</h1>
<p>GPU metrics of NVIDIA, AMD and Intel GPUs in one schema, and per GPU whether its memory is
<b>contended</b>: bandwidth saturated with evidence that tenants interfere (co-located clients or a
throughput drop against the GPU's own memory-bound reference), as opposed to a single job that is
merely memory-bound.  This page refreshes every 10 s.</p>
<p><a href="{path}">Metrics</a> · <a href="/healthz">healthz</a> · <a href="/readyz">readyz</a></p>
{_simulated_note(daemon)}<h2>GPUs</h2>
<p class="legend"><small>memory states:</small> {legend}</p>
<table id="gpus"><tr><th>vendor</th><th>gpu</th><th>model</th><th>uuid</th><th>source</th>
<th>memory state</th><th>reason</th><th>evidence</th></tr>{''.join(_gpu_rows(daemon))}</table>
<h2>Sources</h2><table id="sources"><tr><th>source</th><th>state</th><th>reason</th><th>devices</th></tr>
{sources}</table>
</body></html>"""
