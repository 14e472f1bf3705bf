"""The dedicated Python environment SGLang runs in, and how to launch it on a CPU.

SGLang pins its own torch and pulls ~11 GB of packages, so it never enters the project's
environment: `VENV.setup()` builds a separate venv (engines/server/venv.py: the shared build) with
`sglang==SGLANG_VERSION` plus a stand-in `libcuda.so.1` (see libcuda_stub.c) that lets
`sgl_kernel` import on a machine without an NVIDIA driver.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from engines.server.venv import EnvSetupError, Log, ManagedVenv, env_for_python, env_python, run

SGLANG_VERSION = "0.5.23"
STUB_SOURCE = Path(__file__).with_name("libcuda_stub.c")

SGLangEnvError = EnvSetupError


def stub_dir(env_dir: Path) -> Path:
    return Path(env_dir) / "stub-libcuda"


class SGLangVenv(ManagedVenv):
    label = "SGLang"
    dirname = "sglang-venv"
    marker = "bounded-bench-sglang.json"
    version_key = "sglang"
    packages = (f"sglang=={SGLANG_VERSION}",)
    size_note = "~1.6 GB download, ~11 GB on disk"
    min_free_gb = 14.0  # ~1.6 GB download + ~11 GB installed, with some room
    show = ("Collecting sglang", "Installing collected", "Successfully installed")

    def preflight(self) -> None:
        find_compiler()

    def complete(self, env_dir: Path) -> bool:
        return (stub_dir(env_dir) / "libcuda.so.1").exists()

    def finish(self, env_dir: Path, log: Log) -> None:
        build_stub_libcuda(env_dir, log=log)

    def smoke_test(self, python: Path, log_file: Path, log: Log) -> str:
        """Import sgl_kernel through the stand-in driver, as the server will."""
        code = "import sglang, sgl_kernel; print(sglang.__version__)"
        out = run([str(python), "-c", code], log_file, log, env=cpu_server_env(python))
        return out.strip().splitlines()[-1]


VENV = SGLangVenv()


def cpu_server_env(python: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """Process environment for a CPU SGLang server run by `python`."""
    env = dict(os.environ if base is None else base)
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    stub = stub_dir(env_for_python(python))
    if stub.exists():
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(stub), env.get("LD_LIBRARY_PATH")) if p)
    return env


def build_stub_libcuda(env_dir: Path, compiler: str | None = None, log: Log = print) -> Path:
    out = stub_dir(env_dir) / "libcuda.so.1"
    out.parent.mkdir(parents=True, exist_ok=True)
    compiler = compiler or find_compiler()
    log(f"building stand-in {out} with {compiler}")
    run([compiler, "-shared", "-fPIC", "-O2", "-o", str(out), str(STUB_SOURCE)], Path(env_dir) / "setup.log", log)
    return out


def find_compiler() -> str:
    for name in ("gcc", "cc"):
        if found := shutil.which(name):
            return found
    raise SGLangEnvError("no C compiler (gcc) on PATH: it is needed to build the stand-in "
                         "libcuda.so.1 for SGLang on CPU (Debian: apt-get install gcc)")


__all__ = ["SGLANG_VERSION", "SGLangEnvError", "VENV", "build_stub_libcuda", "cpu_server_env", "env_python", "stub_dir"]
