"""The command lines' flags: the daemon's parser (``build_parser``, node_exporter-style flags, also
read by the container health check) and the one-line-error parser it and ``import`` use (a flag
error in one line plus a hint, not the whole usage)."""

from __future__ import annotations

import argparse
import difflib
import os
from pathlib import Path

from .. import __version__
from ..config import parse_duration
from ..durations import check_interval
from ..sources.registry import COLLECTORS
from .settings import Settings


class OneLineErrorParser(argparse.ArgumentParser):
    """Flag errors in one line plus a hint (the closest flag, or --help), not the whole usage."""

    def error(self, message: str, hint: str = "") -> None:  # type: ignore[override]
        """Exit 2 with ``message`` and a hint (``hint`` first, when given)."""
        hint = f"{hint} (see {self.prog} --help)" if hint else f"see {self.prog} --help"
        if message.startswith("unrecognized arguments: "):
            flags = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
            for arg in message.split(": ", 1)[1].split():
                close = difflib.get_close_matches(arg.split("=", 1)[0], flags, n=1)
                if close:
                    hint = f"did you mean {close[0]}? ({hint})"
                    break
        self.exit(2, f"{self.prog}: error: {message}\n{self.prog}: {hint}\n")


DEFAULT_PORT = 9632


def _duration(text: str) -> float:
    try:
        return check_interval(parse_duration(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _connections(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if not 2 <= value <= 1_000_000:
        raise argparse.ArgumentTypeError("must be from 2 to 1000000")
    return value


def parse_listen_address(addr: str) -> tuple[str | None, int]:
    """':9632' -> (None, 9632) (all interfaces); '127.0.0.1:9632'; '[::1]:9632'."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"invalid listen address {addr!r}: use [host]:port")
    host = host.strip("[]")
    return (host or None), int(port)


def default_state_dir() -> Path | None:
    """systemd's ``$STATE_DIRECTORY`` (the first, if StateDirectory= names several)."""
    first = os.environ.get("STATE_DIRECTORY", "").split(":")[0].strip()
    return Path(first) if first else None


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(
        prog="unified-gpu-exporter",
        description="Prometheus exporter for NVIDIA, AMD and Intel GPUs with one canonical schema.",
        epilog="subcommands:\n  unified-gpu-exporter import FILE... [--format text|json]\n"
               "                        import profiler artifacts (ncu CSV, nsys SQLite, rocprof CSV,\n"
               "                        Kineto JSON, unitrace CSV) and print the canonical series;\n"
               "                        see `unified-gpu-exporter import --help`\n"
               "  unified-gpu-exporter health --node [--url URL] [--check CLASS]\n"
               "                        judge this node's GPUs from the local exporter: exit 0 ok,\n"
               "                        1 problem, 2 unknown (a node-problem-detector plugin);\n"
               "                        see `unified-gpu-exporter health --help`",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--web.listen-address", dest="listen", action="append", type=parse_listen_address,
                   help=f"address to listen on, repeatable (default :{DEFAULT_PORT})")
    p.add_argument("--web.telemetry-path", dest="telemetry_path", default="/metrics",
                   help="path under which the metrics are served (default /metrics)")
    p.add_argument("--web.config.file", dest="web_config", type=Path,
                   help="exporter-toolkit web configuration (TLS, basic auth)")
    p.add_argument("--web.systemd-socket", dest="systemd_socket", action="store_true",
                   help="use the listening sockets passed by systemd socket activation")
    p.add_argument("--web.max-connections", dest="max_connections", type=_connections, default=512,
                   help="open connections at most; a new one evicts the oldest idle or slow one, "
                        "so scrapes always get through (default 512)")
    p.add_argument("--config.file", dest="config", type=Path, help="YAML configuration file")
    p.add_argument("--path.sysfs", dest="sysfs", type=Path, default=Path("/sys"),
                   help="sysfs mount point: the host's /sys mounted elsewhere in a container "
                        "(default /sys)")
    p.add_argument("--path.procfs", dest="procfs", type=Path, default=Path("/proc"),
                   help="procfs mount point (default /proc)")
    p.add_argument("--path.mappings", dest="mappings", type=Path,
                   help="directory with canonical.yaml and the vendor mappings (default: shipped)")
    p.add_argument("--poll.interval", dest="poll_interval", type=_duration,
                   help="default poll interval of every source (default 1s)")
    p.add_argument("--poll.fast-interval", dest="fast_interval", type=_duration,
                   help="fast sampling interval of the signals feeding the contention indicators "
                        "(default 500ms), while a GPU is near contention (a calm node: with the full polls)")
    p.add_argument("--state.dir", dest="state_dir", type=Path, default=default_state_dir(),
                   help="directory for learned baselines (kept across restarts); default: "
                        "$STATE_DIRECTORY (set by systemd's StateDirectory= and by the image), "
                        "else none (baselines are learned again after a restart)")
    p.add_argument("--log.level", dest="log_level", default="info",
                   choices=["debug", "info", "warn", "error"],
                   help="lowest level logged: debug, info, warn or error (default info)")
    p.add_argument("--log.format", dest="log_format", default="logfmt", choices=["logfmt", "json"],
                   help="log line format: logfmt or json (default logfmt)")
    p.add_argument("-v", "--version", action="version", version=f"unified-gpu-exporter {__version__}")
    p.add_argument("--check-config", action="store_true",
                   help="validate the configuration and mappings, then exit 0 (valid) or 1")
    p.add_argument("--help-config", action="store_true",
                   help="print every setting of the configuration file (type, default, description; "
                        "docs/configuration.md) and exit")
    p.add_argument("--once", action="store_true",
                   help="poll as often as rate metrics need, print the exposition, exit "
                        "(non-zero if an explicitly enabled source failed)")
    p.add_argument("--list-devices", action="store_true",
                   help="print the GPUs the enabled sources find; exit 1 when there are none")
    p.add_argument("--simulate", nargs="?", const="demo", metavar="SCENARIO",
                   help="serve the built-in simulated node (scenario name or YAML file; default demo)")
    p.add_argument("--simulate.phase", dest="simulate_phase", metavar="PHASE",
                   help="hold the simulated scenario in this phase until stopped (default: walk "
                        "through the phases in turn)")
    p.add_argument("--simulate.host", dest="simulate_host", metavar="NAME",
                   help="name the simulated GPUs' UUIDs derive from (default: the host name), so "
                        "two simulated nodes never report the same GPU")
    for name, col in COLLECTORS.items():
        if name == "simulator":
            continue
        state = "on" if col.default else "off"
        # --collector.NAME enables, --no-collector.NAME disables (both listed in --help)
        p.add_argument(f"--collector.{name}", dest=f"collector_{name}",
                       action=argparse.BooleanOptionalAction, default=None,
                       help=f"{col.description} (default {state})")
    return p


def settings_from(args: argparse.Namespace) -> Settings:
    collectors = {n: getattr(args, f"collector_{n}") for n in COLLECTORS if n != "simulator"
                  and getattr(args, f"collector_{n}") is not None}
    return Settings(config_path=args.config, sysfs=args.sysfs, procfs=args.procfs,
                    poll_interval=args.poll_interval, fast_interval=args.fast_interval,
                    collectors=collectors,
                    simulate=args.simulate, simulate_phase=args.simulate_phase,
                    simulate_host=args.simulate_host,
                    state_dir=args.state_dir, mappings_dir=args.mappings)
