"""Which collectors run, and what a missing backend means: the daemon's enable/absent/down rules.

- A collector runs when its flag (``--[no-]collector.<name>``) says so, else its config entry,
  else its default.  ``upstream`` defaults to on exactly when targets are configured.
- ``--simulate`` runs the simulator and only those hardware collectors asked for explicitly.
- Asked for explicitly (flag or config ``enabled: true``) makes a failure an error: a missing
  backend is ``down``.  Only on by default, a missing backend is ``absent``: not an error, no
  ``source_up`` series, and the collector stops trying.  A backend that was up before and goes
  missing is ``down`` whatever the default.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from ..sources.options import FdinfoOptions, Options, SimulatorOptions
from ..sources.registry import COLLECTORS, Collector

if TYPE_CHECKING:
    from ..config import CollectorConfig, Config
    from .settings import Settings

TIMEOUT_FLOOR = 2.0  # seconds: the default poll timeout is max(interval, this)


def enabled_collectors(settings: Settings, config: Config) -> list[tuple[Collector, bool]]:
    """(collector, explicit) for every collector that should run."""
    out = []
    simulate = settings.simulate is not None
    for name, col in COLLECTORS.items():
        flag = settings.collectors.get(name)
        conf = config.collector(name).enabled
        if name == "simulator":
            if simulate:
                out.append((col, True))
            continue
        if name == "upstream" and flag is None and conf is None:
            conf = bool(getattr(config.collector(name).options, "targets", None))
        explicit = flag is True or (flag is None and conf is True)
        on = flag if flag is not None else (conf if conf is not None else col.default)
        # with --simulate, hardware collectors run only when asked for explicitly
        if simulate and not explicit:
            on = False
        if on:
            out.append((col, explicit))
    return out


def runs_collector(settings: Settings, config: Config, name: str) -> bool:
    """Whether collector ``name`` is enabled (flag, then config, then its default)."""
    return any(col.name == name for col, _ in enabled_collectors(settings, config))


def counts_fdinfo(settings: Settings, config: Config) -> bool:
    """Whether the DRM fdinfo source runs and counts clients (``processes`` not ``off``): the
    one thing the counting process (and its capabilities) is there for (exporter/privsep/)."""
    if not runs_collector(settings, config, "fdinfo"):
        return False
    given = config.collector("fdinfo").options  # NoOptions where none were given: the defaults
    options = given if isinstance(given, FdinfoOptions) else FdinfoOptions.model_validate(given.options_dict())
    return options.processes != "off"


def missing_backend_state(explicit: bool, was_up: bool) -> Literal["down", "absent"]:
    """The state of a source whose backend is not there (see the module docstring)."""
    return "down" if explicit or was_up else "absent"


def collector_options(col: Collector, settings: Settings, config: Config) -> Options:
    """The typed options a collector's source is created with (the simulator's come from the
    flags first, then ``collectors.simulator.options``, then the ``simulate`` config section)."""
    typed = config.collector(col.name).options
    if col.name != "simulator":
        return typed
    options = typed.options_dict()
    options.setdefault("scenario", settings.simulate or "demo")
    if settings.simulate_phase:
        options["phase"] = settings.simulate_phase
    if settings.simulate_host:
        options["host"] = settings.simulate_host
    options.update({k: v for k, v in config.simulate.options_dict().items() if k not in options})
    return SimulatorOptions.model_validate(options)


def interval_and_timeout(cconf: CollectorConfig, poll_interval: float) -> tuple[float, float]:
    """A collector's poll interval (default: the global one) and poll timeout (default:
    max(interval, TIMEOUT_FLOOR))."""
    interval = cconf.interval or poll_interval
    return interval, cconf.timeout or max(TIMEOUT_FLOOR, interval)


def none_up_message(states) -> str:
    """Why no GPU is read after the first polls: each source's state and reason."""
    why = "; ".join(f"{st.name}: {st.stats.state} {st.stats.reason}".strip() for st in states) \
        or "no source is enabled"
    return (f"no source is up ({why}): no GPU is read, /metrics serves the exporter's own series "
            "only. --list-devices shows what each source finds, --simulate serves a simulated node")
