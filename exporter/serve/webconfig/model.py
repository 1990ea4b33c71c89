"""The web config file's schema (exporter-toolkit ``web-config.yml``) as pydantic models."""

from __future__ import annotations

import re
import ssl
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)


class WebConfigError(Exception):
    """The web config file is unreadable or invalid; the message names the file and the field."""


# ----------------------------------------------------------------------------------------------
# Schema
# ----------------------------------------------------------------------------------------------

_TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}

# Go crypto/tls tls.CipherSuites() (the "secure" list exporter-toolkit accepts) -> OpenSSL name.
# None: a TLS 1.3 suite, which Go ignores in this setting and Python cannot configure either.
_GO_CIPHER_SUITES: dict[str, str | None] = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",  # Go alias
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",  # Go alias
    "TLS_AES_128_GCM_SHA256": None,
    "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
}

_CURVES = {"CurveP256", "CurveP384", "CurveP521", "X25519"}

ClientAuthType = Literal[
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
]

# exporter-toolkit headers.go: allowed headers and, where restricted, allowed values.
_ALLOWED_HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}

# $2a$ / $2b$ / $2y$ and a cost Go's x/crypto/bcrypt accepts (MinCost 4 .. MaxCost 31);
# exporter-toolkit checks every hash with bcrypt.Cost() before it serves
_BCRYPT_RE = re.compile(r"\A\$2[aby]\$(\d{2})\$[./A-Za-z0-9]{53}\Z")
BCRYPT_MIN_COST, BCRYPT_MAX_COST = 4, 31
# bcrypt uses the first 72 bytes of a password; Go's CompareHashAndPassword ignores the rest
BCRYPT_MAX_PASSWORD = 72


def _parse_duration(text: str) -> float:
    """The shared duration grammar (exporter/durations.py): ``1h30m``, ``1.5s``, ``500ms``, ``1d``."""
    from ...durations import parse_duration

    return parse_duration(text)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TLSServerConfig(_Strict):
    cert_file: str = ""
    key_file: str = ""
    cert: str = ""
    key: str = Field(default="", repr=False)
    client_auth_type: ClientAuthType = "NoClientCert"
    client_ca_file: str = ""
    client_ca: str = ""
    client_allowed_sans: list[str] = Field(default_factory=list)
    min_version: Literal["TLS10", "TLS11", "TLS12", "TLS13"] = "TLS12"
    max_version: Literal["TLS10", "TLS11", "TLS12", "TLS13"] = "TLS13"
    cipher_suites: list[str] = Field(default_factory=list)
    prefer_server_cipher_suites: bool = True
    curve_preferences: list[str] = Field(default_factory=list)

    @field_validator("cipher_suites")
    @classmethod
    def _known_ciphers(cls, v: list[str]) -> list[str]:
        for name in v:
            if name not in _GO_CIPHER_SUITES:
                raise ValueError(f"unknown or insecure cipher suite {name!r} "
                                 "(only Go tls.CipherSuites() names are allowed)")
        return v

    @field_validator("curve_preferences")
    @classmethod
    def _known_curves(cls, v: list[str]) -> list[str]:
        for name in v:
            if name not in _CURVES:
                raise ValueError(f"unknown curve {name!r} (allowed: {', '.join(sorted(_CURVES))})")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> TLSServerConfig:
        if self.cert_file and self.cert:
            raise ValueError("cert and cert_file are mutually exclusive")
        if self.key_file and self.key:
            raise ValueError("key and key_file are mutually exclusive")
        has_cert = bool(self.cert_file or self.cert)
        has_key = bool(self.key_file or self.key)
        if has_cert and not has_key:
            raise ValueError("missing key_file (or key)")
        if has_key and not has_cert:
            raise ValueError("missing cert_file (or cert)")
        if self.client_ca_file and self.client_ca:
            raise ValueError("client_ca and client_ca_file are mutually exclusive")
        has_ca = bool(self.client_ca_file or self.client_ca)
        if has_ca and self.client_auth_type == "NoClientCert":
            raise ValueError("client CA given but client_auth_type is NoClientCert")
        if self.client_auth_type in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert") and not has_ca:
            raise ValueError(f"client_auth_type {self.client_auth_type} needs client_ca_file")
        if self.client_auth_type == "RequireAnyClientCert":
            raise ValueError("client_auth_type RequireAnyClientCert (require a certificate but do not "
                             "verify it) cannot be expressed with Python's ssl module and is insecure; "
                             "use RequireAndVerifyClientCert with client_ca_file")
        if self.client_allowed_sans and self.client_auth_type != "RequireAndVerifyClientCert":
            raise ValueError("client_allowed_sans needs client_auth_type RequireAndVerifyClientCert")
        if (self.cipher_suites and self.min_version != "TLS13"
                and not any(_GO_CIPHER_SUITES[n] for n in self.cipher_suites)):
            raise ValueError("cipher_suites lists only TLS 1.3 suites, which cannot be configured "
                             "(TLS 1.3 always uses its own): TLS 1.2 clients could not connect; "
                             "list TLS 1.2 suites or set min_version: TLS13")
        if _TLS_VERSIONS[self.min_version] > _TLS_VERSIONS[self.max_version]:
            raise ValueError(f"min_version {self.min_version} is above max_version {self.max_version}")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file or self.cert)


class HTTPServerConfig(_Strict):
    http2: bool = True
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("headers")
    @classmethod
    def _allowed_headers(cls, v: dict[str, str]) -> dict[str, str]:
        canonical = {k.lower(): k for k in _ALLOWED_HEADERS}
        out: dict[str, str] = {}
        for name, value in v.items():
            key = canonical.get(name.lower())
            if key is None:
                raise ValueError(f"HTTP header {name!r} can not be configured "
                                 f"(allowed: {', '.join(_ALLOWED_HEADERS)})")
            allowed = _ALLOWED_HEADERS[key]
            if allowed is not None and str(value).lower() not in allowed:
                raise ValueError(f"invalid value {value!r} for header {key} (allowed: {', '.join(allowed)})")
            if "\r" in str(value) or "\n" in str(value):
                raise ValueError(f"header {key} value contains a line break")
            out[key] = str(value)
        return out


class RateLimit(_Strict):
    interval: str = "0s"
    burst: int = Field(default=0, ge=0)

    @field_validator("interval")
    @classmethod
    def _duration(cls, v: str) -> str:
        _parse_duration(v)
        return v

    @property
    def interval_seconds(self) -> float:
        return _parse_duration(self.interval)


class _WebConfigFile(_Strict):
    tls_server_config: TLSServerConfig = Field(default_factory=TLSServerConfig)
    http_server_config: HTTPServerConfig = Field(default_factory=HTTPServerConfig)
    basic_auth_users: dict[str, str] = Field(default_factory=dict)
    rate_limit: RateLimit = Field(default_factory=RateLimit)

    @field_validator("basic_auth_users", mode="before")
    @classmethod
    def _users(cls, v: Any) -> Any:
        if v is None or v == {}:
            # "basic_auth_users:" with no users under it (or a file cut short while it is
            # rewritten) must not read as "no basic auth": remove the key to serve without it
            raise ValueError("no users listed (remove the key to serve without basic auth)")
        if not isinstance(v, dict):
            raise ValueError("must be a map of user name to bcrypt hash")  # noqa: TRY004 (pydantic)
        for user, hashed in v.items():
            if not isinstance(user, str) or not user or ":" in user:
                raise ValueError(f"invalid user name {user!r} (non-empty, no ':')")
            m = _BCRYPT_RE.match(hashed) if isinstance(hashed, str) else None
            if m is None:
                # never echo the value: it is a secret hash
                raise ValueError(f"user {user!r}: password is not a bcrypt hash with prefix $2a$, "
                                 "$2b$ or $2y$ (create one with: htpasswd -nBC 10 \"\" | tr -d ':\\n')")
            if not BCRYPT_MIN_COST <= int(m.group(1)) <= BCRYPT_MAX_COST:
                raise ValueError(f"user {user!r}: bcrypt cost {int(m.group(1))} is outside "
                                 f"{BCRYPT_MIN_COST}..{BCRYPT_MAX_COST}")
        return v


def _format_validation_error(path: Path, err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        parts.append(f"{loc}: {msg}")
    return f"web config {path}: " + "; ".join(parts)
