"""Reading and validating everything a (re)load needs, without touching running state.

``prepare`` runs on a worker thread at reload (a large file never blocks scrapes) and once at
start; config and mapping errors are reported together, each naming file, line and field.
"""

from __future__ import annotations

import math
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from .config import Config, load_config
from .enrich.cloud import CloudEnricher
from .exposition import SELF_METRICS
from .mapping import MappingSet
from .schema import Schema, default_mappings_dir, load_schema
from .seriesfilter import SeriesFilter
from .yamlfile import ConfigError

if TYPE_CHECKING:
    from .daemon import Settings
    from .enrich.kubernetes import PodResourcesEnricher
    from .simulate import Scenario

# the kubelet's pod-resources socket (exporter.enrich.pod_index.DEFAULT_SOCKET, repeated here so a
# node without Kubernetes and without an enrich.kubernetes section never loads the enricher)
KUBELET_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


class Loaded(NamedTuple):
    config: Config
    schema: Schema
    mappings: MappingSet
    cloud: CloudEnricher
    k8s: PodResourcesEnricher | None  # None: not configured and not a Kubernetes node
    series_filter: SeriesFilter | None


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
    cloud, k8s = _enrichers(settings, config)
    if settings.simulate is not None:
        config = _with_scenario_prices(config, _check_scenario(settings, mappings))
    _check_upstream(settings, config)
    return Loaded(config, schema, mappings, cloud, k8s, series_filter)


def _check_upstream(settings: Settings, config: Config) -> None:
    """Upstream targets are validated at load (--check-config, reload): http(s) URLs only."""
    options = config.collector("upstream").options_dict()
    if not options.get("targets"):
        return
    from .sources.upstream import parse_targets

    try:
        parse_targets(options)
    except (ValueError, TypeError, OSError, ssl.SSLError) as exc:
        where = str(settings.config_path or "configuration")
        raise ConfigError(f"{where}: collectors.upstream.options: {exc}") from None


def _series_filter(settings: Settings, config: Config, schema: Schema) -> SeriesFilter | None:
    try:
        filt = SeriesFilter(config.exposition, schema, tuple(SELF_METRICS))
    except ValueError as exc:
        raise ConfigError(f"{settings.config_path or 'configuration'}: {exc}") from None
    return filt if filt.active else None


def _check_scenario(settings: Settings, mappings: MappingSet) -> Scenario:
    """A bad scenario is a configuration error at start, not a source that stays down."""
    from .simulate import load_scenario

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


def _enrichers(settings: Settings, config: Config) -> tuple[CloudEnricher, PodResourcesEnricher | None]:
    errors = []
    cloud = k8s = None
    for section, opts in config.enrich.items():  # finite, sensible bounds on every period
        for key, low in (("refresh_seconds", 0.1), ("timeout_seconds", 0.01)):
            v = opts.get(key) if isinstance(opts, dict) else None
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or not math.isfinite(v) or not low <= v <= 86400):
                errors.append(f"{config.where('enrich', section, key)}: enrich.{section}.{key}: "
                              f"{v!r} out of range (a number of seconds from {low:g} to 86400)")
    try:
        cloud = CloudEnricher(config.enrich.get("cloud"))
    except (ValueError, TypeError) as exc:
        errors.append(f"{config.where('enrich', 'cloud')}: enrich.cloud: {exc}")
    section = config.enrich.get("kubernetes")
    opts = dict(section or {})
    # on by default only where the kubelet's pod-resources socket exists (a Kubernetes node)
    opts.setdefault("enabled", Path(opts.get("socket", KUBELET_SOCKET)).exists())
    if section is None and not opts["enabled"]:
        k8s_off = True  # nothing to validate, nothing to run: the enricher's code stays unloaded
    else:
        k8s_off = False
        from .enrich.kubernetes import PodResourcesEnricher

        try:
            k8s = PodResourcesEnricher(opts, procfs=settings.procfs)
        except (ValueError, TypeError) as exc:
            errors.append(f"{config.where('enrich', 'kubernetes')}: enrich.kubernetes: {exc}")
    for name in sorted(set(config.enrich) - {"cloud", "kubernetes"}):
        errors.append(f"{config.where('enrich', name)}: enrich.{name}: unknown section "
                      "(known: cloud, kubernetes)")
    if errors:
        raise ConfigError("\n".join(errors))
    assert cloud is not None and (k8s is not None or k8s_off)
    return cloud, k8s
