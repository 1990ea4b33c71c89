"""web-config.yml parsing and validation (exporter-toolkit format); no network here."""

from __future__ import annotations

import textwrap
from pathlib import Path

import bcrypt
import pytest

from exporter.serve.webconfig import WebConfig, WebConfigError, WebConfigWatcher

REPO = Path(__file__).resolve().parent.parent
HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()


def write(tmp_path: Path, text: str, name: str = "web.yml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_empty_file_is_refused_not_no_tls_no_auth(tmp_path):
    # exporter-toolkit reads an empty file as "no TLS, no auth"; here it is an error (issue 26)
    with pytest.raises(WebConfigError, match="no settings"):
        WebConfig.load(write(tmp_path, ""))
    cfg = WebConfig.load(write(tmp_path, "http_server_config: {headers: {X-Frame-Options: deny}}\n"))
    assert not cfg.tls_enabled
    assert not cfg.auth_enabled
    assert cfg.ssl_context() is None


def test_users_and_headers_parsed(tmp_path):
    cfg = WebConfig.load(write(tmp_path, f"""
        basic_auth_users:
          prometheus: '{HASH}'
        http_server_config:
          headers:
            x-frame-options: deny
            X-Content-Type-Options: nosniff
            Strict-Transport-Security: max-age=31536000
    """))
    assert cfg.users == {"prometheus": HASH.encode()}
    # header names are canonicalised, values kept
    assert cfg.headers == {"X-Frame-Options": "deny", "X-Content-Type-Options": "nosniff",
                           "Strict-Transport-Security": "max-age=31536000"}


@pytest.mark.parametrize(("body", "fragment"), [
    ("unknown_key: 1\n", "unknown_key: unknown field"),
    ("tls_server_config:\n  cert_file: a.pem\n", "tls_server_config: missing key_file"),
    ("tls_server_config:\n  key_file: a.key\n", "tls_server_config: missing cert_file"),
    ("tls_server_config:\n  bogus: 1\n", "tls_server_config.bogus: unknown field"),
    ("tls_server_config:\n  client_auth_type: Sometimes\n", "tls_server_config.client_auth_type"),
    ("tls_server_config:\n  min_version: TLS14\n", "tls_server_config.min_version"),
    ("tls_server_config:\n  min_version: TLS13\n  max_version: TLS12\n",
     "min_version TLS13 is above max_version TLS12"),
    ("tls_server_config:\n  cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]\n",
     "tls_server_config.cipher_suites: unknown or insecure cipher suite 'TLS_RSA_WITH_RC4_128_SHA'"),
    ("tls_server_config:\n  curve_preferences: [P999]\n", "unknown curve 'P999'"),
    ("tls_server_config:\n  client_auth_type: NoClientCert\n  client_ca_file: ca.pem\n",
     "client CA given but client_auth_type is NoClientCert"),
    ("tls_server_config:\n  client_auth_type: RequireAndVerifyClientCert\n",
     "RequireAndVerifyClientCert needs client_ca_file"),
    ("tls_server_config:\n  client_auth_type: RequireAnyClientCert\n", "use RequireAndVerifyClientCert"),
    ("basic_auth_users:\n  alice: plaintext\n", "user 'alice': password is not a bcrypt hash"),
    ("basic_auth_users: [a, b]\n", "basic_auth_users: must be a map"),
    ("http_server_config:\n  headers:\n    Server: x\n", "HTTP header 'Server' can not be configured"),
    ("http_server_config:\n  headers:\n    X-Frame-Options: allow\n",
     "invalid value 'allow' for header X-Frame-Options"),
    ("rate_limit:\n  interval: soon\n", "rate_limit.interval: invalid duration 'soon'"),
    ("- a\n- b\n", "top level must be a map"),
    ("a: [\n", "invalid YAML"),
])
def test_invalid_file_names_file_and_field(tmp_path, body, fragment):
    p = write(tmp_path, body)
    with pytest.raises(WebConfigError) as ei:
        WebConfig.load(p)
    msg = str(ei.value)
    assert msg.startswith(f"web config {p}")
    assert fragment in msg


def test_bad_hash_value_is_not_echoed(tmp_path):
    p = write(tmp_path, "basic_auth_users:\n  alice: hunter2-not-a-hash\n")
    with pytest.raises(WebConfigError) as ei:
        WebConfig.load(p)
    assert "hunter2" not in str(ei.value)


def test_missing_file(tmp_path):
    with pytest.raises(WebConfigError, match=r"web config .*nope\.yml: cannot read file"):
        WebConfig.load(tmp_path / "nope.yml")


def test_unreadable_cert_names_field(tmp_path):
    (tmp_path / "c.pem").write_text("not a certificate\n")
    (tmp_path / "k.pem").write_text("not a key\n")
    p = write(tmp_path, "tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n")
    with pytest.raises(WebConfigError, match=r"tls_server_config\.cert_file/key_file: cannot load"):
        WebConfig.load(p)


def test_cert_paths_relative_to_config_dir(tmp_path):
    sub = tmp_path / "etc"
    sub.mkdir()
    p = write(sub, "tls_server_config:\n  cert_file: tls/c.pem\n  key_file: /abs/k.pem\n")
    with pytest.raises(WebConfigError, match="No such file"):
        WebConfig.load(p)
    data = WebConfig.__new__(WebConfig)  # resolution itself, without loading the files
    WebConfig.__init__(data, WebConfig.empty()._data, p)
    assert data.resolve("tls/c.pem") == sub / "tls" / "c.pem"
    assert data.resolve("/abs/k.pem") == Path("/abs/k.pem")


def test_valid_hash_prefixes_accepted(tmp_path):
    h2y = HASH.replace("$2b$", "$2y$", 1)
    cfg = WebConfig.load(write(tmp_path, f"basic_auth_users:\n  a: '{h2y}'\n"))
    assert bcrypt.checkpw(b"s3cret", cfg.users["a"])


def test_watcher_reloads_changed_file_and_fails_closed_on_invalid(tmp_path):
    p = write(tmp_path, f"basic_auth_users:\n  a: '{HASH}'\n")
    w = WebConfigWatcher(p)
    assert set(w.current().users) == {"a"}
    p.write_text(f"basic_auth_users:\n  b: '{HASH}'\n  c: '{HASH}'\n")
    assert set(w.current().users) == {"b", "c"}  # the very next request (no check interval)
    p.write_text("basic_auth_users:\n  d: not-a-hash-at-all\n")
    assert "bcrypt" in w.current().broken  # invalid edit: refuse (as exporter-toolkit), not open
    p.write_text("")
    assert "empty" in w.current().broken
    p.unlink()
    assert "cannot read" in w.current().broken
    p.write_text(f"basic_auth_users:\n  b: '{HASH}'\n")
    assert not w.current().broken and set(w.current().users) == {"b"}


def test_watcher_without_file_is_open():
    w = WebConfigWatcher(None)
    assert not w.current().auth_enabled
    assert w.ssl_context() is None
