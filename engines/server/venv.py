"""Managed virtual environments for the servers the HTTP engines launch.

SGLang and vLLM each pin their own torch and pull gigabytes of packages, so neither ever
enters the project's environment: each gets a venv of its own under the cache folder, built
once by `ManagedVenv.setup` (pip install, the server's own fix-ups, a smoke test) and marked
finished by a small JSON file written last. The engines only ever run that venv's
interpreter as a server.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Callable

Log = Callable[[str], None]


class EnvSetupError(RuntimeError):
    """A server's environment could not be built or is not usable."""


def cache_dir() -> Path:
    """The project's cache folder (same rule as the harness: $BOUNDED_BENCH_CACHE or ~/.cache)."""
    return Path(os.environ.get("BOUNDED_BENCH_CACHE") or Path.home() / ".cache" / "bounded-bench")


def env_python(env_dir: Path) -> Path:
    return Path(env_dir) / "bin" / "python"


def env_for_python(python: Path) -> Path:
    """The venv folder of an interpreter path (`<env>/bin/python` -> `<env>`)."""
    return Path(python).parent.parent


class ManagedVenv:
    """One server's environment. Subclasses say what to install and how to check it."""

    label = "server"  # in messages: "SGLang", "vLLM"
    dirname = "server-venv"  # under cache_dir()
    marker = "bounded-bench-env.json"
    version_key = "version"  # the marker's field holding the server's version
    packages: tuple[str, ...] = ()  # pip install arguments
    size_note = ""  # e.g. "~1.6 GB download, ~11 GB on disk"
    min_free_gb = 1.0
    show = ("Collecting ", "Installing collected", "Successfully installed")  # pip lines shown

    # -- hooks ---------------------------------------------------------------------------

    def preflight(self) -> None:
        """Check what the build needs before anything is downloaded (raise EnvSetupError)."""

    def finish(self, env_dir: Path, log: Log) -> None:
        """Steps after pip install (stand-in libraries, removals)."""

    def complete(self, env_dir: Path) -> bool:
        """Files besides the interpreter that a finished env must have."""
        return True

    def smoke_test(self, python: Path, log_file: Path, log: Log) -> str:
        """Import the server as it will run; -> its version."""
        raise NotImplementedError

    # -- the build -----------------------------------------------------------------------

    def default_dir(self) -> Path:
        return cache_dir() / self.dirname

    def read_marker(self, env_dir: Path) -> dict | None:
        """The marker `setup` writes last; None if the env is absent or unfinished."""
        try:
            marker = json.loads((Path(env_dir) / self.marker).read_text())
        except (OSError, ValueError):
            return None
        if not env_python(env_dir).exists() or not self.complete(Path(env_dir)):
            return None
        return marker

    def setup(self, path: Path | str | None = None, log: Log = print) -> Path:
        """Build (once) the env at `path` (default `default_dir()`); return its python.

        Idempotent: an env with a marker is reused as is. Raises EnvSetupError with the
        reason (a missing tool, not enough disk, a pip failure with the tail of its log).
        """
        env_dir = Path(path).expanduser() if path else self.default_dir()
        if (marker := self.read_marker(env_dir)) is not None:
            return self._ready(env_dir, marker, log)
        self.preflight()
        self._check_disk(env_dir)
        env_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(env_dir.with_name(env_dir.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a second setup (CLI and tests at once) waits here
            if (marker := self.read_marker(env_dir)) is not None:
                return self._ready(env_dir, marker, log)
            return self._build(env_dir, log)

    def _ready(self, env_dir: Path, marker: dict, log: Log) -> Path:
        log(f"{self.label} {marker.get(self.version_key)} environment ready at {env_dir}")
        return env_python(env_dir)

    def _build(self, env_dir: Path, log: Log) -> Path:
        t0 = time.monotonic()
        log_file = env_dir / "setup.log"
        if not env_python(env_dir).exists():
            log(f"creating virtual environment {env_dir}")
            env_dir.parent.mkdir(parents=True, exist_ok=True)
            run([sys.executable, "-m", "venv", str(env_dir)], log_file, log)
        python = env_python(env_dir)
        log(f"installing {' '.join(self.packages)} into {env_dir} ({self.size_note}; "
            f"progress in {log_file})")
        run([str(python), "-m", "pip", "install", "--progress-bar", "off", *self.packages],
            log_file, log, show=self.show)
        self.finish(env_dir, log)
        version = self.smoke_test(python, log_file, log)
        built_s = round(time.monotonic() - t0, 1)
        (env_dir / self.marker).write_text(json.dumps(
            {self.version_key: version, "packages": list(self.packages), "built_s": built_s, "created": time.time()}))
        log(f"{self.label} {version} environment ready at {env_dir} ({built_s:.0f} s)")
        return python

    def _check_disk(self, env_dir: Path) -> None:
        probe = env_dir
        while not probe.exists():
            probe = probe.parent
        free_gb = shutil.disk_usage(probe).free / 2**30
        if free_gb < self.min_free_gb and not env_python(env_dir).exists():
            raise EnvSetupError(f"only {free_gb:.1f} GB free under {probe}; the {self.label} environment "
                                f"needs ~{self.min_free_gb:.0f} GB (set BOUNDED_BENCH_CACHE elsewhere)")


def run(cmd: list[str], log_file: Path, log: Log, show: tuple[str, ...] = (),
        env: dict[str, str] | None = None) -> str:
    """Run `cmd`, appending its output to `log_file`; forward lines starting with `show`;
    -> the last 50 lines of its output. Raises EnvSetupError with the tail on failure."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    tail: deque[str] = deque(maxlen=30)
    lines: deque[str] = deque(maxlen=50)
    with open(log_file, "a") as f, subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
        f.write(f"$ {' '.join(cmd)}\n")
        for line in proc.stdout:
            f.write(line)
            tail.append(line.rstrip())
            lines.append(line)
            if show and line.lstrip().startswith(show):
                log(line.rstrip()[:200])
        rc = proc.wait()
    if rc != 0:
        raise EnvSetupError(f"{cmd[0]} {' '.join(cmd[1:3])} ... failed (exit {rc}); "
                            f"last lines of {log_file}:\n" + "\n".join(tail))
    return "".join(lines)
