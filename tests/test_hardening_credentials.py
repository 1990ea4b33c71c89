"""Issue 37, item 11: credentials in URLs.  An OTLP endpoint ``http://user:password@...`` needs
``allow_plaintext`` (it was accepted and sent in clear); no URL's password reaches a log line or
a config error (the OTLP endpoint's and an upstream target's were logged whole): it shows as
``xxxxx``, as Go's ``URL.Redacted`` writes it for Prometheus."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from exporter.config import load_config
from exporter.yamlfile import ConfigError
from tests.test_upstream_http import make_source, refused_url, target


def _otlp(tmp_path, endpoint: str, extra: str = ""):  # noqa: ANN202
    conf = tmp_path / "config.yml"
    conf.write_text(f"exporters:\n  otlp:\n    endpoint: {endpoint}\n{extra}")
    return load_config(conf)


def test_otlp_userinfo_over_plain_http_needs_allow_plaintext(tmp_path):
    with pytest.raises(ConfigError) as info:
        _otlp(tmp_path, "http://user:s3cret@127.0.0.1:4318/v1/metrics")
    assert "credentials in the URL" in str(info.value) and "s3cret" not in str(info.value)
    assert "user:xxxxx@127.0.0.1" in str(info.value)
    _otlp(tmp_path, "http://user:s3cret@127.0.0.1:4318/v1/metrics", "    allow_plaintext: true\n")
    _otlp(tmp_path, "https://user:s3cret@127.0.0.1:4318/v1/metrics")


def test_a_bad_url_error_does_not_quote_the_password(tmp_path):
    with pytest.raises(ConfigError) as info:
        _otlp(tmp_path, "ftp://user:s3cret@127.0.0.1/")
    assert "s3cret" not in str(info.value)


def test_an_upstream_url_with_credentials_is_refused_without_quoting_them(caplog):
    """urllib takes ``user:password@host`` for a host name: the password went into the failure
    logged at every state change (and to the resolver).  Refused at load, pointing to basic_auth."""
    url = refused_url().replace("http://", "http://scraper:s3cret@")
    with caplog.at_level(logging.INFO, logger="exporter.sources.upstream"), pytest.raises(ValueError) as info:
        make_source(target(url))
    # the message (what the config loader shows, yamlfile drops pydantic's input echo)
    msg = info.value.errors()[0]["msg"] if hasattr(info.value, "errors") else str(info.value)
    assert "credentials in the URL" in msg and "basic_auth" in msg
    assert "scraper:xxxxx@127.0.0.1" in msg
    assert "s3cret" not in msg and "s3cret" not in caplog.text


def test_an_upstream_failure_log_redacts_the_url(caplog):
    from exporter.sources.upstream import UpstreamSource

    src = make_source(target(refused_url()))
    src._targets[0] = dataclasses.replace(src._targets[0], url=src._targets[0].url.replace(
        "http://", "http://scraper:s3cret@"))  # as if it came from elsewhere than the checked config
    assert isinstance(src, UpstreamSource)
    with caplog.at_level(logging.INFO, logger="exporter.sources.upstream"):
        src._target_failed(src._targets[0], "read_error", "refused", _Sample(), set())
    assert "scraper:xxxxx@127.0.0.1" in caplog.text and "s3cret" not in caplog.text


class _Sample:
    def __init__(self) -> None:
        import collections
        self.errors: collections.Counter = collections.Counter()
        self.devices: list = []
        self.device_up: dict = {}


def test_redact_url():
    from exporter.http_deadline import redact_url
    assert redact_url("http://u:p@h:1/x?q=1") == "http://u:xxxxx@h:1/x?q=1"
    assert redact_url("http://h:1/x") == "http://h:1/x"
    assert redact_url("http://u@h/") == "http://u@h/"  # a user alone is no secret


def test_the_otlp_push_log_does_not_show_the_password(tmp_path, caplog):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otlp extra (make install)")
    from exporter.map.schema import load_schema
    from exporter.otlp.naming import load_mapping
    from exporter.render.otlp_stats import PushStats
    from tests.test_otlp_hardening import _load, _offer, _pusher

    schema = load_schema()
    cfg = _load(tmp_path, refused_url().replace("http://", "http://pusher:s3cret@") + "/v1/metrics",
                "    allow_plaintext: true\n").exporters.otlp
    caplog.set_level(logging.INFO, logger="unified_gpu_exporter")
    stats = PushStats()
    pusher = _pusher(cfg, (schema, load_mapping(schema)), stats)
    _offer(pusher)
    pusher.close(wait=5)
    assert stats.failure == 1
    (record,) = [r for r in caplog.records if r.getMessage().startswith("OTLP push failing")]
    assert record.endpoint.startswith("http://pusher:xxxxx@127.0.0.1")
    assert "s3cret" not in caplog.text
