"""The push's self-metrics: counted by the push thread, read by the next render (no lock: each
field is one int or float written by that thread only)."""

from __future__ import annotations

# self-metric name (after unified_gpu_exporter_) -> (type, help); exporter/render/exposition.py serves them
HELP: dict[str, tuple[str, str]] = {
    "otlp_exports_total": ("counter", "OTLP pushes by result (success, failure: the receiver refused it, "
                                      "timed out or could not be reached, retries included)."),
    "otlp_dropped_snapshots_total": ("counter", "Rendered cycles chosen for a push that were replaced by a "
                                                "newer one before the push thread took them (a push was still "
                                                "running: slow or unreachable receiver)."),
    "otlp_last_success_timestamp_seconds": ("gauge", "Unix time of the last OTLP push the receiver accepted."),
    "otlp_push_duration_seconds": ("gauge", "Duration of the last OTLP push (conversion and export), in seconds."),
    "otlp_points": ("gauge", "Data points in the last OTLP push."),
}


class PushStats:
    def __init__(self) -> None:
        self.enabled = False
        self.success = 0
        self.failure = 0
        self.dropped = 0
        self.last_success = 0.0
        self.duration = 0.0
        self.points = 0

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        if not self.enabled:
            return []
        out = [("otlp_exports_total", {"result": "success"}, float(self.success)),
               ("otlp_exports_total", {"result": "failure"}, float(self.failure)),
               ("otlp_dropped_snapshots_total", {}, float(self.dropped)),
               ("otlp_push_duration_seconds", {}, self.duration),
               ("otlp_points", {}, float(self.points))]
        if self.last_success:
            out.append(("otlp_last_success_timestamp_seconds", {}, self.last_success))
        return out


STATS = PushStats()
