"""The dedicated Python environment SGLang runs in, and how to launch it on a CPU.

SGLang pins its own torch and pulls ~11 GB of packages, so it never enters the project's
environment: `setup_env` builds a separate venv with `sglang==SGLANG_VERSION` plus a
stand-in `libcuda.so.1` (see libcuda_stub.c) that lets `sgl_kernel` import on a machine
without an NVIDIA driver. The engine only ever runs that venv's interpreter as a server.
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

SGLANG_VERSION = "0.5.23"
MARKER = "bounded-bench-sglang.json"
STUB_SOURCE = Path(__file__).with_name("libcuda_stub.c")
MIN_FREE_GB = 14.0  # ~1.6 GB download + ~11 GB installed, with some room

Log = Callable[[str], None]


class SGLangEnvError(RuntimeError):
    """The SGLang environment could not be built or is not usable."""


def cache_dir() -> Path:
    """The project's cache folder (same rule as the harness: $BOUNDED_BENCH_CACHE or ~/.cache)."""
    return Path(os.environ.get("BOUNDED_BENCH_CACHE") or Path.home() / ".cache" / "bounded-bench")


def default_env_dir() -> Path:
    return cache_dir() / "sglang-venv"


def env_python(env_dir: Path) -> Path:
    return env_dir / "bin" / "python"


def stub_dir(env_dir: Path) -> Path:
    return env_dir / "stub-libcuda"


def read_marker(env_dir: Path) -> dict | None:
    """The marker `setup_env` writes last; None if the env is absent or unfinished."""
    try:
        marker = json.loads((env_dir / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not env_python(env_dir).exists() or not (stub_dir(env_dir) / "libcuda.so.1").exists():
        return None
    return marker


def env_for_python(python: Path) -> Path:
    """The venv folder of an interpreter path (`<env>/bin/python` -> `<env>`)."""
    return Path(python).parent.parent


def cpu_server_env(python: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """Process environment for a CPU SGLang server run by `python`."""
    env = dict(os.environ if base is None else base)
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    stub = stub_dir(env_for_python(python))
    if stub.exists():
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(stub), env.get("LD_LIBRARY_PATH")) if p)
    return env


def setup_env(path: Path | str | None = None, log: Log = print) -> Path:
    """Build (once) the SGLang venv at `path` (default `default_env_dir()`); return its python.

    Idempotent: an env with a marker is reused as is. Raises SGLangEnvError with the
    reason (no compiler, not enough disk, pip failure with the tail of its log).
    """
    env_dir = Path(path).expanduser() if path else default_env_dir()
    marker = read_marker(env_dir)
    if marker is not None:
        log(f"SGLang {marker.get('sglang')} environment ready at {env_dir}")
        return env_python(env_dir)
    compiler = _find_compiler()
    _check_disk(env_dir)
    env_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(env_dir.with_name(env_dir.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second setup (CLI and tests at once) waits here
        if (marker := read_marker(env_dir)) is not None:
            log(f"SGLang {marker.get('sglang')} environment ready at {env_dir}")
            return env_python(env_dir)
        return _build(env_dir, compiler, log)


def _build(env_dir: Path, compiler: str, log: Log) -> Path:
    t0 = time.monotonic()
    if not env_python(env_dir).exists():
        log(f"creating virtual environment {env_dir}")
        env_dir.parent.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "venv", str(env_dir)], env_dir / "setup.log", log)
    python = env_python(env_dir)
    log(f"installing sglang=={SGLANG_VERSION} into {env_dir} (~1.6 GB download, ~11 GB on disk; "
        f"progress in {env_dir / 'setup.log'})")
    _run([str(python), "-m", "pip", "install", "--progress-bar", "off", f"sglang=={SGLANG_VERSION}"],
         env_dir / "setup.log", log,
         show=("Collecting sglang", "Installing collected", "Successfully installed"))
    build_stub_libcuda(env_dir, compiler, log)
    version = _smoke_test(python, env_dir / "setup.log", log)
    (env_dir / MARKER).write_text(json.dumps(
        {"sglang": version, "built_s": round(time.monotonic() - t0, 1), "created": time.time()}))
    log(f"SGLang {version} environment ready at {env_dir} ({time.monotonic() - t0:.0f} s)")
    return python


def build_stub_libcuda(env_dir: Path, compiler: str | None = None, log: Log = print) -> Path:
    out = stub_dir(env_dir) / "libcuda.so.1"
    out.parent.mkdir(parents=True, exist_ok=True)
    compiler = compiler or _find_compiler()
    log(f"building stand-in {out} with {compiler}")
    _run([compiler, "-shared", "-fPIC", "-O2", "-o", str(out), str(STUB_SOURCE)],
         env_dir / "setup.log", log)
    return out


def _find_compiler() -> str:
    for name in ("gcc", "cc"):
        if found := shutil.which(name):
            return found
    raise SGLangEnvError("no C compiler (gcc) on PATH: it is needed to build the stand-in "
                         "libcuda.so.1 for SGLang on CPU (Debian: apt-get install gcc)")


def _check_disk(env_dir: Path) -> None:
    probe = env_dir
    while not probe.exists():
        probe = probe.parent
    free_gb = shutil.disk_usage(probe).free / 2**30
    if free_gb < MIN_FREE_GB and not env_python(env_dir).exists():
        raise SGLangEnvError(f"only {free_gb:.1f} GB free under {probe}; the SGLang environment "
                             f"needs ~{MIN_FREE_GB:.0f} GB (set BOUNDED_BENCH_CACHE elsewhere)")


def _smoke_test(python: Path, log_file: Path, log: Log) -> str:
    """Import sgl_kernel through the stand-in driver, as the server will."""
    code = "import sglang, sgl_kernel; print(sglang.__version__)"
    out = _run([str(python), "-c", code], log_file, log, env=cpu_server_env(python))
    return out.strip().splitlines()[-1]


def _run(cmd: list[str], log_file: Path, log: Log, show: tuple[str, ...] = (),
         env: dict[str, str] | None = None) -> str:
    """Run `cmd`, appending its output to `log_file`; forward lines starting with `show`."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    tail: deque[str] = deque(maxlen=30)
    lines: list[str] = []
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
        raise SGLangEnvError(f"{cmd[0]} {' '.join(cmd[1:3])} ... failed (exit {rc}); "
                             f"last lines of {log_file}:\n" + "\n".join(tail))
    return "".join(lines[-50:])
