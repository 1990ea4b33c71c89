"""Our cached exposition writer says exactly what prometheus-client's writers say: both outputs,
parsed by prometheus-client's parsers, give the same families and samples; promtool accepts it."""

from __future__ import annotations

import math
import subprocess

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client import exposition as text_format
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as om_format
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
from prometheus_client.parser import text_string_to_metric_families as text_parse
from prometheus_client.samples import Sample

from exporter.render.textformat import Family, PrefixCache, body, format_value, write
from tests.conftest import require_binary


def render(families: list[Family], cache: PrefixCache, openmetrics: bool) -> bytes:
    """The renderer's writer over these families: each family's sample lines, then ``write``."""
    return write([(f, body(f, cache)) for f in families], openmetrics)

FAMILIES = [
    Family("gpu_power_watts", "gauge", 'Power "draw" in W\\n with a backslash \\ and\nnewline', "watts", [
        ("gpu_power_watts", (("vendor", "nvidia"), ("gpu", "0"), ("uuid", "GPU-1")), 631.95),
        ("gpu_power_watts", (("vendor", "amd"), ("gpu", "1"), ("uuid", 'we"ird\\va\nl')), 0.0),
    ]),
    Family("gpu_energy_joules", "counter", "Energy.", "joules", [
        ("gpu_energy_joules_total", (("vendor", "nvidia"), ("gpu", "0"), ("uuid", "GPU-1")), 1.5e12),
    ]),
    Family("gpu_kernel_execution_time_milliseconds", "histogram", "Kernel time.", "milliseconds", [
        ("gpu_kernel_execution_time_milliseconds_bucket", (("kernel", "k"), ("le", "1")), 1.0),
        ("gpu_kernel_execution_time_milliseconds_bucket", (("kernel", "k"), ("le", "+Inf")), 3.0),
        ("gpu_kernel_execution_time_milliseconds_sum", (("kernel", "k"),), 4.5),
        ("gpu_kernel_execution_time_milliseconds_count", (("kernel", "k"),), 3.0),
    ]),
    Family("unified_gpu_exporter_build_info", "gauge", "Version.", "", [
        ("unified_gpu_exporter_build_info", (("version", "0.1.0"),), 1.0),
    ]),
    Family("gpu_special", "gauge", "Specials.", "", [
        ("gpu_special", (("v", "inf"),), math.inf), ("gpu_special", (("v", "-inf"),), -math.inf),
        ("gpu_special", (("v", "big"),), 1.2345678901234567e300), ("gpu_special", (("v", "small"),), 5e-324),
    ]),
]


def _reference(openmetrics: bool) -> bytes:
    class Snap:
        def collect(self):
            for f in FAMILIES:
                m = Metric(f.name, f.help, f.type, f.unit)
                m.samples = [Sample(n, dict(lbl), v, None, None) for n, lbl, v in f.samples]
                yield m

    reg = CollectorRegistry(auto_describe=False)
    reg.register(Snap())
    return (om_format if openmetrics else text_format).generate_latest(reg)


def _parsed(body: bytes, openmetrics: bool):
    parse = om_parse if openmetrics else text_parse
    return sorted(((f.name, f.type, f.documentation, getattr(f, "unit", ""),
                    sorted((s.name, tuple(sorted(s.labels.items())), repr(s.value)) for s in f.samples))
                   for f in parse(body.decode())), key=lambda x: x[0])


@pytest.mark.parametrize("openmetrics", [False, True])
def test_same_families_and_samples_as_prometheus_client(openmetrics):
    ours = render(FAMILIES, PrefixCache(), openmetrics)
    assert _parsed(ours, openmetrics) == _parsed(_reference(openmetrics), openmetrics)
    if openmetrics:
        assert ours.endswith(b"# EOF\n")


def test_prefixes_are_cached_and_reused():
    cache = PrefixCache()
    first = render(FAMILIES, cache, False)
    size = len(cache)
    assert render(FAMILIES, cache, False) == first and len(cache) == size
    assert size == sum(len(f.samples) for f in FAMILIES)


def test_format_value():
    assert [format_value(v) for v in (math.inf, -math.inf, math.nan, 1.0, 0.25)] == [
        "+Inf", "-Inf", "NaN", "1.0", "0.25"]


def test_promtool_accepts_the_text_output():
    promtool = require_binary("promtool", "prometheus")
    body = render([f for f in FAMILIES if f.name != "gpu_special"], PrefixCache(), False)
    proc = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=30)
    # the seed's name keeps milliseconds; promtool's lint notes it and nothing else
    problems = [ln for ln in proc.stdout.decode().splitlines() + proc.stderr.decode().splitlines()
                if ln.strip() and "milliseconds" not in ln]
    assert problems == []
