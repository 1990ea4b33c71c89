"""Reading and validating everything a (re)load needs, without touching running state.

``prepare`` runs on a worker thread at reload (a large file never blocks scrapes) and once at
start; config and mapping errors are reported together, each naming file, line and field.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from ..config import Config, load_config
from ..enrich.cloud import CloudEnricher, CloudIdentity
from ..enrich.options import CLOUD_LABELS, KubernetesOptions
from ..map.mapping import MappingSet
from ..map.schema import LABEL_RE, Schema, default_mappings_dir, load_schema
from ..render.exposition import SELF_METRICS
from ..render.seriesfilter import SeriesFilter
from ..yamlfile import ConfigError

if TYPE_CHECKING:
    from ..enrich.kubernetes import PodResourcesEnricher
    from ..otlp.naming import OtelMapping
    from ..simulate import Scenario
    from .settings import Settings

class Loaded(NamedTuple):
    config: Config
    schema: Schema
    mappings: MappingSet
    cloud: CloudEnricher
    k8s: PodResourcesEnricher | None  # None: not configured and not a Kubernetes node
    series_filter: SeriesFilter | None
    otel: OtelMapping | None  # mappings/otel.yaml, read only with exporters.otlp enabled


def prepare(settings: Settings) -> Loaded:
    """Read and validate config, schema, mappings, enrichers, scenario and upstream targets."""
    errors: list[str] = []
    config: Config | None = None
    try:
        config = load_config(settings.config_path)
    except ConfigError as exc:
        errors.append(str(exc))
    mdir = settings.mappings_dir or (config.mappings_dir if config else None) or default_mappings_dir()
    try:
        schema = load_schema(mdir / "canonical.yaml")
        mappings = MappingSet.load_dir(mdir, schema)
    except ConfigError as exc:
        errors.append(str(exc))
    if errors:
        raise ConfigError("\n".join(errors))
    assert config is not None
    series_filter = _series_filter(settings, config, schema)
    problems = []  # enricher options and static labels: reported together
    cloud = k8s = None
    scenario = _check_scenario(settings, mappings) if settings.simulate is not None else None
    try:
        cloud, k8s = _enrichers(settings, config, scenario)
    except ConfigError as exc:
        problems.append(str(exc))
    try:
        _check_static_labels(config, schema, k8s)
    except ConfigError as exc:
        problems.append(str(exc))
    if problems:
        raise ConfigError("\n".join(problems))
    assert cloud is not None
    if scenario is not None:
        config = _with_scenario_prices(config, scenario)
    _check_upstream(config, mappings)
    return Loaded(config, schema, mappings, cloud, k8s, series_filter, _otel_mapping(config, schema, mdir))


def _otel_mapping(config: Config, schema: Schema, mdir: Path) -> OtelMapping | None:
    """The OTel names of the push (exporter/otlp/naming.py), validated with everything else here
    on the load worker; nothing of it is read with the push off."""
    if not config.exporters.otlp.enabled:
        return None
    from ..otlp.naming import load_mapping

    return load_mapping(schema, mdir)


# names Prometheus gives a meaning of its own (target labels, histogram/summary parts); a
# static label of that name is renamed (exported_instance) or breaks the series it lands on
_PROMETHEUS_LABELS = frozenset({"instance", "job", "le", "quantile"})
_ATTRIBUTION_LABELS = frozenset({"namespace", "pod", "container", "workload"})


def _check_static_labels(config: Config, schema: Schema, k8s: PodResourcesEnricher | None) -> None:
    """Static ``labels`` must not collide with a label any series already carries: the sample
    would hold the name twice and Prometheus would refuse the whole scrape."""
    taken = set(schema.device_labels) | set(schema.instance_labels)
    for m in schema.metrics.values():
        taken |= m.allowed_labels
    taken -= _ATTRIBUTION_LABELS  # on gpu_pod_info, which exists only with pod attribution
    # the cloud enricher's labels (region, zone, ...) go on every series the same way: where a
    # series has one of its own (a process's memory region) the series' value wins, as it does
    # for the enricher's (series_lines.extend_labels)
    taken -= set(CLOUD_LABELS)
    attribution = k8s is not None and k8s.enabled
    errors = []
    for name in config.labels:
        if not LABEL_RE.match(name):
            why = f"{name!r} is not a label name ([a-zA-Z_][a-zA-Z0-9_]*)"
        elif name.startswith("__"):
            why = "names starting with __ are reserved by Prometheus"
        elif name in _PROMETHEUS_LABELS:
            why = f"{name} is set by Prometheus itself (a target label or a histogram part)"
        elif name in taken:
            why = f"{name} is a label of the canonical series (mappings/canonical.yaml)"
        elif attribution and (name in _ATTRIBUTION_LABELS or name.startswith("label_")):
            why = f"{name} is set by pod attribution (enrich.kubernetes)"
        else:
            continue
        field = f"labels.{name}" if LABEL_RE.match(name) else f"labels[{name!r}]"
        errors.append(f"{config.where('labels', name)}: {field}: {why}; choose another name")
    if errors:
        raise ConfigError("\n".join(errors))


def _check_upstream(config: Config, mappings: MappingSet) -> None:
    """A target's ``schema`` pin must name a schema of its exporter's mapping file (the rest of
    a target, TLS and password files included, is checked by its options model at load)."""
    from ..sources.options import UpstreamOptions

    options = config.collector("upstream").options
    if not isinstance(options, UpstreamOptions) or not any(t.schema_pin for t in options.targets):
        return  # the default path loads none of the upstream code
    from ..sources.upstream_identity import EXPORTERS

    errors = []
    for i, target in enumerate(options.targets):
        if not target.schema_pin:
            continue
        cm = mappings.get(EXPORTERS[target.exporter].mapping)
        known = [s.name for s in cm.schemas] if cm is not None else []
        if target.schema_pin not in known:
            where = config.where("collectors", "upstream", "options", "targets", i, "schema")
            errors.append(f"{where}: collectors.upstream.options.targets[{i}].schema: "
                          f"{target.schema_pin!r} is not a schema of {target.exporter} "
                          f"(known: {', '.join(known) or 'none'})")
    if errors:
        raise ConfigError("\n".join(errors))


def _series_filter(settings: Settings, config: Config, schema: Schema) -> SeriesFilter | None:
    try:
        filt = SeriesFilter(config.exposition, schema, tuple(SELF_METRICS))
    except ValueError as exc:
        raise ConfigError(f"{settings.config_path or 'configuration'}: {exc}") from None
    return filt if filt.active else None


def _check_scenario(settings: Settings, mappings: MappingSet) -> Scenario:
    """A bad scenario is a configuration error at start, not a source that stays down."""
    from ..simulate import load_scenario

    scenario = load_scenario(settings.simulate or "demo")
    if settings.simulate_phase:
        scenario.phase(settings.simulate_phase)
    missing = sorted({m for d in scenario.devices for m in [d.mapping, *d.extra_mappings]
                      if mappings.get(m) is None})
    if missing:
        raise ConfigError(f"scenario {scenario.name}: devices use unknown mappings {missing} "
                          f"(known: {', '.join(sorted(mappings.mappings))})")
    return scenario


def _with_scenario_prices(config: Config, scenario: Scenario) -> Config:
    """The scenario's list prices stand in for a price table the configuration does not give."""
    cost = config.indicators.cost
    if cost.prices or not scenario.prices:
        return config
    indicators = config.indicators.model_copy(
        update={"cost": cost.model_copy(update={"prices": tuple(scenario.prices)})})
    return config.model_copy(update={"indicators": indicators})


def _enrichers(settings: Settings, config: Config,
               scenario: Scenario | None) -> tuple[CloudEnricher, PodResourcesEnricher | None]:
    """The enrichers of ``enrich:`` (validated with the file, config.EnrichConfig); what only an
    enricher can check (``api: on`` without an API server) is reported here, naming the line.
    The simulated node's cloud labels are its scenario's (it never asks a metadata service)."""
    static = None
    if scenario is not None and scenario.cloud is not None:
        static = CloudIdentity(**scenario.cloud.model_dump())
    cloud = CloudEnricher(config.enrich.cloud, sysfs=settings.sysfs, simulated=scenario is not None,
                          static=static)
    section = config.enrich.kubernetes
    opts = section or KubernetesOptions()
    if opts.enabled is None:  # on by default only where the kubelet's pod-resources socket exists
        opts = opts.model_copy(update={"enabled": Path(opts.socket).exists()})
    if section is None and not opts.enabled:
        return cloud, None  # nothing to validate, nothing to run: the enricher's code stays unloaded
    from ..enrich.kubernetes import PodResourcesEnricher

    try:
        return cloud, PodResourcesEnricher(opts, procfs=settings.procfs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{config.where('enrich', 'kubernetes')}: enrich.kubernetes: {exc}") from None
