"""Launch `python -m sglang.launch_server` from SGLang's own environment, wait until it is
healthy, and stop exactly the process group it started.

The server runs in a new session (its own process group): SGLang forks a scheduler and a
detokenizer, and stopping the group takes them down with it without touching anything else.
"""
from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import httpx

from engines.base import EngineUnavailable
from engines.sglang.env import cpu_server_env

# What SGLang 0.5.23 needs on a CPU: the CPU engine, eager torch attention, and a KV pool
# cap (without it the pool takes ~11 GB of RAM).
CPU_ARGS = ("--device", "cpu", "--attention-backend", "torch_native", "--max-total-tokens", "16384")


@dataclass(frozen=True)
class LaunchSpec:
    python: Path
    model_dir: Path
    dtype: str
    device: str
    host: str
    port: int
    extra_args: tuple[str, ...]
    log_path: Path
    startup_timeout_s: float

    def command(self) -> list[str]:
        cmd = [str(self.python), "-m", "sglang.launch_server", "--model-path", str(self.model_dir),
               "--host", self.host, "--port", str(self.port), "--dtype", self.dtype]
        if self.device == "cpu":
            cmd += CPU_ARGS
        elif self.device.startswith("cuda:"):
            cmd += ["--base-gpu-id", self.device.split(":", 1)[1]]
        return cmd + list(self.extra_args)  # extra args last: argparse lets them override ours

    def environment(self) -> dict[str, str]:
        return cpu_server_env(self.python) if self.device == "cpu" else dict(os.environ)


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


class LaunchedServer:
    """One SGLang server process group that this object started."""

    def __init__(self, spec: LaunchSpec):
        self.spec = spec
        self.url = f"http://{spec.host}:{spec.port}"
        self._proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.spec.log_path, "ab") as log:
            log.write(f"$ {' '.join(self.spec.command())}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(self.spec.command(), stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=self.spec.environment(),
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
                raise EngineUnavailable(f"SGLang server exited with code {self._proc.returncode} during "
                                        f"start-up; last lines of {self.spec.log_path}:\n"
                                        f"{log_tail(self.spec.log_path)}")
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise EngineUnavailable(f"SGLang server not healthy after {self.spec.startup_timeout_s:.0f} s "
                                f"(option startup_timeout_s); last lines of {self.spec.log_path}:\n"
                                f"{log_tail(self.spec.log_path)}")

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


def split_args(args: str | Sequence[str] | None) -> tuple[str, ...]:
    import shlex

    if args is None:
        return ()
    if isinstance(args, str):
        return tuple(shlex.split(args))
    return tuple(str(a) for a in args)
