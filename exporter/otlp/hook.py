"""What the daemon calls: configure at every (re)load, offer every rendered cycle, close at stop.

A disabled push costs one attribute test per render.  Nothing of OpenTelemetry is imported
here; the pusher's thread imports the SDK when the first push is due.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..render.otlp_stats import STATS

if TYPE_CHECKING:  # the mapping model and the pusher load only with the push enabled
    from ..map.schema import Schema
    from .naming import OtelMapping


class OtlpOutput:
    def __init__(self, after_warmup: Callable[[], None] | None = None) -> None:
        self.pusher: Any = None  # pusher.Pusher while enabled
        self._after_warmup = after_warmup  # handed to each pusher (run/gctune.after_warmup)

    def configure(self, config: Any, schema: Schema, mapping: OtelMapping | None, cloud: Any = None) -> None:
        """Apply ``config.exporters.otlp`` with its names (``mappings/otel.yaml``, read and
        validated by ``run.loading.prepare``; None with the push off)."""
        cfg = config.exporters.otlp
        if not cfg.enabled or mapping is None:
            self.close()
            STATS.enabled = False
            return
        from .pusher import Pusher
        from .resource import resource_attributes

        k8s = config.enrich.kubernetes
        node = (k8s.node_name or "") if k8s is not None else ""

        def resource(static: tuple) -> dict[str, str]:
            names = set(cloud.labels()) if cloud is not None else set()
            return resource_attributes(static, names, node, cfg.resource_attributes)

        STATS.enabled = True
        if self.pusher is not None and self.pusher.keeps(cfg, mapping, schema):
            self.pusher.set_resource(resource)  # an unchanged push carries on
            return
        new = Pusher(cfg, mapping, schema, resource, after_warmup=self._after_warmup)
        self.close()
        self.pusher = new

    def offer(self, rendered: Any, static_labels: tuple) -> None:
        if self.pusher is not None:
            self.pusher.offer(rendered, static_labels)

    def close(self, wait: float = 0.0) -> None:
        if self.pusher is not None:
            self.pusher.close(wait)
            self.pusher = None

    def flush(self) -> None:
        """--once: wait for the pending push (bounded by its timeout), then stop."""
        if self.pusher is not None:
            self.close(self.pusher.cfg.timeout + 1.0)
