"""`bench serve` as a child process: start it on a free loopback port, wait until it prints
its URL, stop it with SIGTERM (graceful: it finishes in-flight requests) and SIGKILL only
if it will not go. Used by `bench soak` and the tests."""
from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

READY = re.compile(r"^serving \S+ on (http://\S+)$")


class ServeFailed(RuntimeError):
    pass


class ServeProcess:
    def __init__(self, scenario: str | Path, engine: str, args: Sequence[str] = (), *,
                 startup_timeout_s: float = 180.0, log_path: str | Path | None = None, port: int = 0):
        self.cmd = [sys.executable, "-m", "harness.cli", "serve", str(scenario), "--engine", engine,
                    "--port", str(port), *args]
        self.startup_timeout_s = startup_timeout_s
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="bench-serve-", suffix=".log")[1])
        self.proc: subprocess.Popen | None = None
        self.url = ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> str:
        log = open(self.log_path, "wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env,
                                     start_new_session=True)
        log.close()
        deadline = time.monotonic() + self.startup_timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([self.proc.stdout], [], [], min(left, 1.0))[0]:
                if self.proc.poll() is not None:
                    break
                continue
            line = self.proc.stdout.readline()  # the server prints one line, when ready
            if not line:
                break
            m = READY.match(line.strip())
            if m:
                self.url = m.group(1)
                return self.url
        self.stop(timeout_s=5)
        raise ServeFailed(f"`{' '.join(self.cmd)}` did not become ready; last log lines:\n{self.log_tail()}")

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, wait up to timeout_s for the graceful shutdown, then SIGKILL."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        return self.proc.returncode

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> "ServeProcess":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
