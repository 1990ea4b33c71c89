"""The fleet's processes: start, wait until ready, kill one, restart it with the same command (same
ports, same data directory), stop all.  A process that dies is reported, never a reason to stop
the others: a fleet must be able to rehearse a failure.

Requests from another shell (``fleet.py --workdir W --kill NAME``) arrive as JSON files in
W/control/ and are carried out by the running fleet's supervision loop (`handle_requests`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from fleet_util import http_get


@dataclass
class Proc:
    name: str
    cmd: list[str]
    log: Path
    cwd: Path
    ready_url: str | None = None
    popen: subprocess.Popen | None = None
    stopped_on_purpose: bool = False
    restart_at: float | None = None       # a kill with a down time: restart then


@dataclass
class Supervisor:
    workdir: Path
    procs: dict[str, Proc] = field(default_factory=dict)

    @property
    def control_dir(self) -> Path:
        return self.workdir / "control"

    def spawn(self, name: str, cmd: list[str], ready_url: str | None, cwd: Path | None = None) -> Proc:
        log = self.workdir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        proc = Proc(name, cmd, log, cwd or self.workdir, ready_url)
        self.procs[name] = proc
        self._popen(proc)
        return proc

    def _popen(self, proc: Proc) -> None:
        with open(proc.log, "ab") as fh:
            proc.popen = subprocess.Popen(proc.cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          cwd=str(proc.cwd), start_new_session=True)
        proc.stopped_on_purpose = False
        proc.restart_at = None
        self._write_state()

    def logs(self, name: str, tail: int = 4000) -> str:
        path = self.workdir / "logs" / f"{name}.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    def wait_ready(self, proc: Proc, timeout: float) -> None:
        if proc.ready_url is None:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.popen and proc.popen.poll() is not None:
                raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{self.logs(proc.name)}")
            try:
                if http_get(proc.ready_url, timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{proc.name} not ready at {proc.ready_url} after {timeout:.0f}s:\n{self.logs(proc.name)}")

    def running(self, name: str) -> bool:
        popen = self.procs[name].popen
        return popen is not None and popen.poll() is None

    def kill(self, name: str, sig: int = signal.SIGKILL, down_for: float | None = None) -> None:
        """Kill one process (SIGKILL: a crash, nothing flushed; SIGTERM: a clean stop).  With
        ``down_for`` the supervision loop restarts it that many seconds later."""
        proc = self._get(name)
        proc.stopped_on_purpose = True
        if proc.popen and proc.popen.poll() is None:
            os.killpg(proc.popen.pid, sig)
            try:
                proc.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.popen.pid, signal.SIGKILL)
                proc.popen.wait(timeout=10)
        proc.restart_at = None if down_for is None else time.monotonic() + down_for
        self._write_state()

    def restart(self, name: str, timeout: float = 60.0) -> None:
        proc = self._get(name)
        if self.running(name):
            self.kill(name, signal.SIGTERM)
        self._popen(proc)
        self.wait_ready(proc, timeout)

    def failed(self) -> list[str]:
        """Processes that died without being asked to."""
        return [p.name for p in self.procs.values()
                if p.popen and p.popen.poll() is not None and not p.stopped_on_purpose]

    def stop_all(self) -> None:
        for proc in reversed(list(self.procs.values())):
            if proc.popen and proc.popen.poll() is None:
                proc.popen.terminate()
        deadline = time.monotonic() + 10
        for proc in reversed(list(self.procs.values())):
            if proc.popen is None:
                continue
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.popen.pid, signal.SIGKILL)
                proc.popen.wait(timeout=5)
        self.procs = {}

    # ------------------------------------------------------------------ requests from outside
    def request(self, action: str, name: str, down_for: float | None = None) -> Path:
        """Ask the fleet running in this workdir to kill or restart a process (fleet.py --kill)."""
        if action not in ("kill", "restart"):
            raise ValueError(f"unknown action {action!r}")
        self.control_dir.mkdir(parents=True, exist_ok=True)
        path = self.control_dir / f"{time.time_ns()}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"action": action, "name": name, "down_for": down_for}))
        tmp.rename(path)
        return path

    def handle_requests(self) -> list[str]:
        """Carry out the requests in control/ and the restarts that are due; what was done."""
        done = []
        for path in sorted(self.control_dir.glob("*.json")) if self.control_dir.is_dir() else []:
            try:
                req = json.loads(path.read_text())
                name, action = str(req["name"]), req["action"]
                if name not in self.procs:
                    raise KeyError(f"no process {name!r}; known: {', '.join(self.procs)}")
                if action == "kill":
                    self.kill(name, down_for=req.get("down_for"))
                    done.append(f"killed {name}" + (f" for {req['down_for']}s" if req.get("down_for") else ""))
                elif action == "restart":
                    self.restart(name)
                    done.append(f"restarted {name}")
            except (KeyError, ValueError, TypeError, OSError, RuntimeError) as exc:
                done.append(f"request {path.name} refused: {exc}")
            path.unlink(missing_ok=True)
        for proc in self.procs.values():
            if proc.restart_at is not None and time.monotonic() >= proc.restart_at:
                # a restart that fails (the binary exits, never gets ready) is one component
                # down, reported like any other death: never a reason to stop the fleet
                try:
                    self.restart(proc.name)
                    done.append(f"restarted {proc.name}")
                except (OSError, RuntimeError) as exc:
                    proc.restart_at = None
                    done.append(f"restart of {proc.name} failed: {exc}")
        return done

    def _get(self, name: str) -> Proc:
        if name not in self.procs:
            raise KeyError(f"no process {name!r}; known: {', '.join(self.procs)}")
        return self.procs[name]

    def _write_state(self) -> None:
        state = {n: {"pid": p.popen.pid if p.popen else None, "cmd": p.cmd, "running": self.running(n)}
                 for n, p in self.procs.items()}
        (self.workdir / "fleet-state.json").write_text(json.dumps(state, indent=1))
