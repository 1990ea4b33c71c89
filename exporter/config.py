"""The YAML configuration file (``--config.file``), validated with pydantic.

Command-line flags override the file.  Durations use the grammar of ``exporter/durations.py``
(``250ms``, ``1.5s``, ``1m30s``, ``1d``, or a number of seconds).  Every level is strict: an
unknown key, an unknown collector name, an unknown option of a collector or a value of the wrong
type is an error naming file, line and field, and every error of the file is reported at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    create_model,
)

from .durations import Duration, parse_duration
from .enrich.options import EnrichConfig
from .indicators.config import IndicatorConfig
from .otlp.config import ExportersConfig
from .render.seriesfilter import ExpositionConfig
from .sources.options import OPTIONS, NoOptions, Options, SimulatorOptions
from .yamlfile import ConfigError, load_yaml, validation_message

__all__ = ["Config", "CollectorConfig", "Duration", "load_config", "parse_duration"]



class CollectorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool | None = Field(None, description=(
        "true or false; unset: on by default where the backend is found (upstream and profiles: off)"))
    interval: Duration | None = Field(None, description="poll interval (default: poll_interval)")
    timeout: Duration | None = Field(None, description=(
        "poll timeout: a poll still running then is abandoned and the source is down (default: "
        "max(interval, 2 s), collector_policy.interval_and_timeout)"))
    options: Options = NoOptions()

    def options_dict(self) -> dict[str, Any]:
        return self.options.options_dict()


class _UncheckedOptions(Options):
    """Options of a collector registered at runtime without a model (tests' fake sources)."""

    model_config = ConfigDict(extra="allow")


def _collectors_model(names: tuple[str, ...]) -> type[BaseModel]:
    """``collectors:`` with one typed entry per known collector; any other name is an error."""
    fields: dict[str, Any] = {}
    for name in names:
        options = OPTIONS.get(name, _UncheckedOptions)
        entry = create_model(f"{name.capitalize()}CollectorConfig", __base__=CollectorConfig,
                             options=(options, options()))
        fields[name] = (entry | None, None)
    return create_model("Collectors", __config__=ConfigDict(extra="forbid"), **fields)


Collectors = _collectors_model(tuple(OPTIONS))


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    poll_interval: Duration = Field(1.0, description=(
        "default poll interval of every source (a collector's `interval` overrides it; the flag "
        "--poll.interval overrides the file)"))
    fast_interval: Duration = Field(0.5, description=(
        "fast sampling of the cheap signals that feed the contention indicators (sources that offer "
        "poll_fast) and the indicator evaluation itself, while a GPU is near contention "
        "(indicators.contention.fast_bandwidth_percent; a calm node samples once per full poll, at most "
        "1 s apart): there the default gives two indicator samples per default poll, contention counted "
        "to the half second at half the CPU of 250 ms (README \"What sampling costs\"); 250ms or 100ms "
        "for shorter bursts"))
    collectors: Collectors = Collectors()  # type: ignore[valid-type]
    labels: dict[str, str] = Field({}, description=(
        "static labels added to every canonical series (e.g. node, cluster)"))
    mappings_dir: Path | None = Field(None, description=(
        "folder of canonical.yaml and the vendor mapping files (default: the checkout's mappings/ when run "
        "from a checkout, else the installed copy)"))
    indicators: IndicatorConfig = IndicatorConfig()
    simulate: SimulatorOptions = SimulatorOptions()
    exposition: ExpositionConfig = Field(ExpositionConfig(), description=(
        "cardinality control: profile, include/exclude globs, label allow-list "
        "(exporter/render/seriesfilter.py)"))
    enrich: EnrichConfig = Field(EnrichConfig(), description=(
        "cloud labels, pod attribution (exporter/enrich/options.py)"))
    exporters: ExportersConfig = Field(ExportersConfig(), description=(
        "push outputs beside /metrics: otlp (exporter/otlp/config.py)"))
    # where the file was read from, and the line of each field (for errors found after
    # validation, e.g. by the enrichers)
    _path: Path | None = PrivateAttr(default=None)
    _lines: dict[tuple, int] = PrivateAttr(default_factory=dict)

    # the names of `labels` are checked against the schema and the enrichers at load
    # (loading._check_static_labels), each error with the line of its key

    def collector(self, name: str) -> CollectorConfig:
        return getattr(self.collectors, name, None) or CollectorConfig()

    def where(self, *loc: str | int) -> str:
        """``file:line`` of a field (or of its deepest known parent), for error messages."""
        from .yamlfile import line_of

        if self._path is None:
            return "configuration"
        line = line_of(self._lines, loc)
        return f"{self._path}:{line}" if line else str(self._path)


def load_config(path: Path | None) -> Config:
    if path is None:
        return Config()
    data, lines = load_yaml(path)
    model = config_model()
    try:
        config = model.model_validate({} if data is None else data)
    except ValidationError as exc:
        raise ConfigError(validation_message(path, lines, _explain_unknown_keys(exc, model))) from None
    config._path, config._lines = path, lines
    return config


_MODELS: dict[tuple[str, ...], type[Config]] = {}


def config_model() -> type[Config]:
    """Config whose ``collectors`` know every registered collector (the registry may grow)."""
    from .sources.registry import COLLECTORS

    names = tuple(COLLECTORS)
    if names == tuple(OPTIONS):
        return Config
    if names not in _MODELS:
        collectors = _collectors_model(names)
        _MODELS[names] = create_model("Config", __base__=Config,
                                      collectors=(collectors, collectors()))
    return _MODELS[names]


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The pydantic model that validates the mapping at ``loc`` (list indexes skipped)."""
    import typing

    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(str(part))
        if field is None:
            return None
        current = field.annotation
        # unwrap X | None and list[X]
        for _ in range(3):
            args = [a for a in typing.get_args(current) if a is not type(None)]
            if typing.get_origin(current) in (list, typing.Union) or type(current).__name__ == "UnionType":
                current = args[0] if args else current
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _explain_unknown_keys(exc: ValidationError, model: type[BaseModel]) -> ValidationError:
    """"Extra inputs are not permitted" -> "unknown key; known: ...; did you mean ...?"."""
    import difflib

    from pydantic_core import InitErrorDetails, PydanticCustomError

    details: list[InitErrorDetails] = []
    for err in exc.errors():
        if err["type"] == "extra_forbidden":
            where = _model_at(model, tuple(err["loc"][:-1]))
            known = sorted(where.model_fields) if where is not None else []
            key = str(err["loc"][-1])
            close = difflib.get_close_matches(key, known, n=1)
            msg = "unknown key" + (f", did you mean {close[0]!r}?" if close else "")
            msg += f" (known: {', '.join(known)})" if known else ""
            details.append(InitErrorDetails(type=PydanticCustomError("unknown_key", msg),
                                            loc=err["loc"], input=err["input"]))
        else:
            details.append(InitErrorDetails(type=PydanticCustomError(err["type"], err["msg"]),
                                            loc=err["loc"], input=err["input"]))
    return ValidationError.from_exception_data(exc.title, details)
