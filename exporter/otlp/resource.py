"""The resource every push describes: this host, its cloud identity and Kubernetes placement.

From what the exporter already knows: the host name, the cloud enricher's labels (which the
exposition puts on every series and the push moves here), the node name pod attribution uses
(``enrich.kubernetes.node_name`` or ``$NODE_NAME``), the exporter's own pod from the downward API
(``$POD_NAME``, ``$POD_NAMESPACE``), the static ``labels`` of the config (as they are named) and
``exporters.otlp.resource_attributes`` (which win).

``host.name`` is the node's name where that is known: the DaemonSet has no host network, so the
container's host name is the pod's, not the node's (a Collector's host-based processing and
every backend's host view would see one "host" per exporter pod).  Elsewhere it is the system's
host name.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping

from .. import __version__

# cloud enricher label (exporter/enrich/cloud.py LABELS) -> resource attribute
CLOUD_ATTRIBUTES = {"cloud": "cloud.provider", "region": "cloud.region", "zone": "cloud.availability_zone",
                    "instance_type": "host.type", "instance_id": "host.id"}
# the downward-API variables read, and the attribute each gives
ENV_ATTRIBUTES = {"NODE_NAME": "k8s.node.name", "POD_NAME": "k8s.pod.name", "POD_NAMESPACE": "k8s.namespace.name"}


def resource_attributes(static_labels: Iterable[tuple[str, str]], cloud_names: Iterable[str] = (),
                        node_name: str = "", configured: Mapping[str, str] | None = None,
                        environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``static_labels``: what the render added to every series (config labels, then the cloud
    labels named in ``cloud_names``)."""
    env = os.environ if environ is None else environ
    out = {"service.name": "unified-gpu-exporter", "service.version": __version__,
           "host.name": socket.gethostname()}
    cloud = set(cloud_names)
    for k, v in static_labels:
        if k in cloud and k in CLOUD_ATTRIBUTES:
            out[CLOUD_ATTRIBUTES[k]] = v
        elif k not in cloud:
            out[k] = v
    for var, attr in ENV_ATTRIBUTES.items():
        if env.get(var):
            out[attr] = env[var]
    if node_name:
        out["k8s.node.name"] = node_name
    if out.get("k8s.node.name"):
        out["host.name"] = out["k8s.node.name"]  # not the pod's host name (module docstring)
    out.update(configured or {})
    return out
