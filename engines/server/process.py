"""Launch an inference server as a child process, wait until it is healthy, and stop exactly
the process group it started.

The server runs in a new session (its own process group): SGLang and vLLM fork scheduler,
engine-core and worker processes, and stopping the group takes them down with it without
touching anything else.
"""
from __future__ import annotations

import atexit
import os
import shlex
import signal
import socket
import subprocess
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import httpx

from engines.base import EngineUnavailable


@dataclass(frozen=True)
class LaunchSpec:
    """What to run: `command` (a server listening on `host:port`) in `env`, logging to `log_path`."""

    label: str  # the server's name in messages, e.g. "SGLang"
    command: tuple[str, ...]
    host: str
    port: int
    log_path: Path
    startup_timeout_s: float
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    health_route: str = "/health"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        with open(path, errors="replace") as f:
            return "\n".join(line.rstrip() for line in deque(f, maxlen=lines))
    except OSError:
        return "(no server log)"


def split_args(args: str | Sequence[str] | None) -> tuple[str, ...]:
    """Server arguments given as one shell-like string or as a list."""
    if args is None:
        return ()
    if isinstance(args, str):
        return tuple(shlex.split(args))
    return tuple(str(a) for a in args)


class LaunchedServer:
    """One server process group that this object started."""

    def __init__(self, spec: LaunchSpec):
        self.spec = spec
        self.url = f"http://{spec.host}:{spec.port}"
        self._proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.spec.log_path, "ab") as log:
            log.write(f"$ {shlex.join(self.spec.command)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(self.spec.command, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=self.spec.env,
                                          start_new_session=True)
        # Its own session does not get our Ctrl-C: make sure an exiting harness takes it down.
        atexit.register(self.stop)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.spec.startup_timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise EngineUnavailable(f"{self.spec.label} server exited with code {self._proc.returncode} "
                                        f"during start-up; {self.log_excerpt()}")
            try:
                if httpx.get(f"{self.url}{self.spec.health_route}", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise EngineUnavailable(f"{self.spec.label} server not healthy after {self.spec.startup_timeout_s:.0f} s "
                                f"(option startup_timeout_s); {self.log_excerpt()}")

    def log_excerpt(self) -> str:
        return f"last lines of {self.spec.log_path}:\n{log_tail(self.spec.log_path)}"

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc else None

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the group, then SIGKILL what is left of it after `timeout_s`."""
        if self._proc is None:
            return
        atexit.unregister(self.stop)
        pgid = self._proc.pid  # start_new_session: the group id is the leader's pid
        _signal_group(pgid, signal.SIGTERM)
        try:
            self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(pgid, signal.SIGKILL)  # children outliving the leader, or a stuck leader
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self._proc = None


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
