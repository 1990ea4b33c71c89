"""The HTTP server's self-metrics: written by the web config watcher and the connection guard,
read by the next render (no lock: each field is one int written by one thread at a time)."""

from __future__ import annotations

# self-metric name (after unified_gpu_exporter_) -> (type, help); exporter/render/exposition.py serves them
HELP: dict[str, tuple[str, str]] = {
    "web_config_reloads_total": (
        "counter", "Changes of the web config file by result: applied; invalid (not a config: every request "
                   "and handshake is refused until it is fixed); refused_looser (valid but looser than the "
                   "config in force: users, client_auth_type, client_allowed_sans, min_version, cipher_suites, "
                   "curve_preferences, a security header, rate_limit or TLS dropped or weakened; the stricter "
                   "config keeps serving, with the file's users, until a restart applies it)."),
    "idle_connection_eviction": (
        "gauge", "1 when idle keep-alive connections can be evicted to make room for a new one under "
                 "--web.max-connections; 0 when the installed aiohttp lacks what the check reads (then only "
                 "connections before their first request and TLS handshakes are evicted)."),
}
RELOAD_RESULTS = ("applied", "invalid", "refused_looser")


class ServerStats:
    def __init__(self) -> None:
        self.web_config = False  # a web config file is in use
        self.reloads = dict.fromkeys(RELOAD_RESULTS, 0)
        self.eviction: bool | None = None  # None: no connection guard installed

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        out: list[tuple[str, dict[str, str], float]] = []
        if self.web_config:
            out += [("web_config_reloads_total", {"result": r}, float(n)) for r, n in self.reloads.items()]
        if self.eviction is not None:
            out.append(("idle_connection_eviction", {}, 1.0 if self.eviction else 0.0))
        return out


STATS = ServerStats()
