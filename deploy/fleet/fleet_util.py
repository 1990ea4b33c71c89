"""Helpers of the reference fleet (deploy/fleet/fleet.py): ports, HTTP, durations, the rule copies
the central engine evaluates, a self-signed CA for the write path, and the webhook sink that
records every notification Alertmanager sends.  Standard library and PyYAML only."""

from __future__ import annotations

import http.server
import json
import os
import re
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 3.0, headers: dict[str, str] | None = None,
             cafile: Path | None = None) -> tuple[int, bytes]:
    context = ssl.create_default_context(cafile=str(cafile)) if cafile else None
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def duration_seconds(text: str) -> float:
    total = 0.0
    for num, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)", str(text)):
        total += float(num) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800,
                               "y": 31536000}[unit]
    return total


def capped_for(rule: dict, max_for: str) -> str:
    """``for:`` capped at ``max_for``, but never below twice the longest window of an
    ``increase()`` / ``absent_over_time()`` the alert reads (``increase(errors[2m]) > 0 for 10m``
    means "failures kept coming for longer than the window"; capped to 30 s it would fire for one
    failure during a peer's restart), and never above the rule's own."""
    own = duration_seconds(rule["for"])
    windows = [duration_seconds(w) for w in
               re.findall(r"\b(?:increase|absent_over_time)\([^()\[]*\[(\d+(?:ms|[smhdwy]))\]", rule.get("expr", ""))]
    seconds = min(own, max(duration_seconds(max_for), 2 * max(windows, default=0)))
    return rule["for"] if seconds == own else f"{seconds:.0f}s"


# Runbook links of the rules the central engine evaluates: rendered into the rule files, not an
# external label (vmalert adds -external.label values to every recorded series and alert it
# writes: a URL label on every rollup of the 2-year store, new series whenever it changes).
RUNBOOK_DEFAULT = "deploy/prometheus/runbooks.md"
RUNBOOK_VARIABLE = "FLEET_RUNBOOK_BASE"
_RUNBOOK_BASE = re.compile(r"[A-Za-z0-9._~:/?&=%+@!$,;*()\[\]-]{1,1000}")  # no space, quote, #, {, }
_RUNBOOK_LINE = re.compile(r"^(?P<key>[ \t]*runbook_url:)[ \t]*(?P<value>\S.*?)[ \t]*$", re.M)


def runbook_base(value: str | None = None) -> str:
    """The fleet's runbook base: ``value``, else $FLEET_RUNBOOK_BASE, else the repository path of
    runbooks.md.  A URL or path with no space, quote, ``#`` or brace (it is pasted into a Go
    template, before the alert's ``#anchor``)."""
    base = value if value is not None else (os.environ.get(RUNBOOK_VARIABLE) or RUNBOOK_DEFAULT)
    if not _RUNBOOK_BASE.fullmatch(base):
        raise ValueError(f"runbook base {base!r}: give a URL or path of runbooks.md without spaces, quotes, "
                         "'#' or braces (the alert's #anchor is appended)")
    return base


def link_runbooks(text: str, base: str, where: str = "rules") -> str:
    """A rule file's text with every ``runbook_url`` rendered as ``base#<anchor>`` (the anchor the
    source gives), comments and layout kept; checked by parsing the result."""
    base = runbook_base(base)

    def render(m: re.Match) -> str:
        value = yaml.safe_load(m.group("value"))
        if not isinstance(value, str) or "#" not in value:
            raise ValueError(f"{where}: runbook_url {m.group('value')!r} has no #anchor")
        return f"{m.group('key')} '{base}#{value.rsplit('#', 1)[1]}'"

    out = _RUNBOOK_LINE.sub(render, text)
    for group in (yaml.safe_load(out) or {}).get("groups", []):
        for rule in group.get("rules", []):
            url = rule.get("annotations", {}).get("runbook_url")
            if "alert" in rule and (url is None or not url.startswith(base + "#")):
                raise ValueError(f"{where}: alert {rule['alert']}: runbook_url not rendered ({url!r})")
    return out


def rule_sources() -> list[Path]:
    """Every rule file the central engine evaluates."""
    return sorted((REPO / "deploy" / "prometheus" / "rules").glob("*.yml")) + sorted((HERE / "rules").glob("*.yml"))


def prepare_rules(dest: Path, max_for: str | None, runbooks: str | None = None) -> list[Path]:
    """Copies of every rule file the central engine evaluates, their runbook links under
    ``runbook_base(runbooks)``.  With ``max_for`` the copies drop the groups' own intervals (the
    engine's -evaluationInterval applies) and cap every ``for:`` at ``max_for``: a demo or a test
    sees alerts in seconds instead of 15 minutes."""
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    base = runbook_base(runbooks)
    for src in rule_sources():
        doc = yaml.safe_load(link_runbooks(src.read_text(), base, str(src)))
        for group in doc["groups"]:
            for rule in group["rules"]:
                # Debian's vmalert (1.79) refuses keep_firing_for (a Prometheus 2.42+ field), so
                # the central copies go without it (docs/fleet.md: what that costs)
                rule.pop("keep_firing_for", None)
        if max_for is not None:
            for group in doc["groups"]:
                group.pop("interval", None)
                for rule in group["rules"]:
                    if "for" in rule:
                        rule["for"] = capped_for(rule, max_for)
        path = dest / src.name
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        out.append(path)
    return out


def write_secret(path: Path, text: str) -> Path:
    """A credential file only its owner can read (written before anything is put into it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    return path


def self_signed_tls(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (which is its own CA) and its key: the write path's TLS."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "ingest.crt", directory / "ingest.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                    "-nodes", "-days", "7", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    os.chmod(key, 0o600)
    return cert, key


class _Sink(http.server.BaseHTTPRequestHandler):
    """Alertmanager webhook receiver: records every notification (receiver, status, alert labels)."""

    events: list[dict[str, Any]] = []
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 (http.server API)
        body = self.rfile.read(min(int(self.headers.get("Content-Length", 0)), 10_000_000))
        receiver = self.path.strip("/")
        try:
            alerts = json.loads(body).get("alerts", [])
        except ValueError:
            alerts = []
        now = time.time()
        with self.lock:
            for alert in alerts:
                self.events.append({"time": now, "receiver": receiver, "status": alert.get("status"),
                                    "labels": dict(alert.get("labels", {}))})
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


class WebhookSink:
    def __init__(self) -> None:
        _Sink.events = []
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def events(self, since: float = 0.0) -> list[dict[str, Any]]:
        with _Sink.lock:
            return [e for e in _Sink.events if e["time"] >= since]

    def firing(self) -> dict[str, set[str]]:
        """receiver -> {"Alertname{cloud=...}"} of every firing notification so far."""
        out: dict[str, set[str]] = {}
        for e in self.events():
            if e["status"] == "firing":
                key = f"{e['labels'].get('alertname')}{{cloud={e['labels'].get('cloud', '')}}}"
                out.setdefault(e["receiver"], set()).add(key)
        return out

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
