"""What AOTInductor needs to compile a package for a device, checked before compiling so that
a missing piece is named instead of surfacing as a compiler's first error line.

Every device: a C++ compiler (Inductor builds the package's wrapper and CPU kernels with it).
CUDA also: the CUDA toolkit headers (`cuda.h`, `cuda_runtime_api.h` under CUDA_HOME/include;
torch finds CUDA_HOME from $CUDA_HOME / $CUDA_PATH, `nvcc` on PATH, or /usr/local/cuda),
the driver library to link against (`-lcuda` needs an unversioned `libcuda.so` where the
linker looks) and to run with (`libcuda.so.1`), and Triton (the GPU kernels). Loading an
already compiled package needs none of the build parts.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

HEADERS = ("cuda.h", "cuda_runtime_api.h")
# where the linker looks when no -L names the library (Debian/Ubuntu, RHEL, plain)
SYSTEM_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
                   "/lib/x86_64-linux-gnu", "/lib64", "/lib", "/usr/local/lib")


class ToolchainMissing(RuntimeError):
    pass


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str  # what was found, or what is missing and how to provide it


def check(device_type: str) -> list[Check]:
    """Every check for compiling on `device_type` ("cpu" or "cuda")."""
    checks = [cxx_compiler()]
    if device_type == "cuda":
        home = cuda_home()
        checks += [cuda_headers(home), cuda_link_library(_link_dirs(home)), cuda_driver(), triton()]
    return checks


def missing(device_type: str) -> list[str]:
    """What is missing to compile on `device_type`, one line each (empty: nothing)."""
    return [f"{c.name}: {c.detail}" for c in check(device_type) if not c.ok]


def cxx_compiler() -> Check:
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        cxx = get_cpp_compiler()
        first = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
        return Check("C++ compiler", True, f"{cxx} ({first.splitlines()[0] if first else 'version unknown'})")
    except Exception as e:  # Inductor raises InvalidCxxCompiler when none of its candidates runs
        return Check("C++ compiler", False, f"none found ({type(e).__name__}); install g++ or set $CXX")


def cuda_home() -> Optional[str]:
    """The CUDA_HOME Inductor will use (None when torch has no CUDA or finds none)."""
    try:
        from torch.utils import cpp_extension

        return cpp_extension.CUDA_HOME
    except Exception:
        return None


def cuda_headers(home: Optional[str], extra_roots: Iterable[Path] = ()) -> Check:
    """`home`: CUDA_HOME; `extra_roots`: where else headers may sit (pip's nvidia packages)."""
    if home:
        absent = [h for h in HEADERS if not (Path(home) / "include" / h).is_file()]
        if not absent:
            return Check("CUDA headers", True, f"{Path(home) / 'include'}")
        where = f"{', '.join(absent)} missing from {Path(home) / 'include'}"
    else:
        where = "no CUDA_HOME ($CUDA_HOME, $CUDA_PATH, nvcc on PATH and /usr/local/cuda all absent)"
    hint = next((r for r in [*extra_roots, *_pip_cuda_roots()] if all((r / "include" / h).is_file() for h in HEADERS)),
                None)
    fix = f"; export CUDA_HOME={hint} (headers found there)" if hint else \
        "; install the CUDA toolkit headers (e.g. cuda-cudart-dev / cuda-driver-dev) and set CUDA_HOME"
    return Check("CUDA headers", False, where + fix)


def cuda_link_library(dirs: Iterable[str]) -> Check:
    """The unversioned libcuda.so `-lcuda` links against, in `dirs` (the linker's paths)."""
    dirs = list(dict.fromkeys(dirs))
    for d in dirs:
        if (Path(d) / "libcuda.so").exists():
            return Check("libcuda.so (link)", True, str(Path(d) / "libcuda.so"))
    versioned = next((Path(d) / "libcuda.so.1" for d in dirs if (Path(d) / "libcuda.so.1").exists()), None)
    if versioned is not None:
        return Check("libcuda.so (link)", False,
                     f"only {versioned}: link it as libcuda.so in a folder on LIBRARY_PATH "
                     f"(mkdir -p /tmp/cudalink && ln -sf {versioned} /tmp/cudalink/libcuda.so && "
                     "export LIBRARY_PATH=/tmp/cudalink:$LIBRARY_PATH)")
    return Check("libcuda.so (link)", False, f"not in {', '.join(dirs)}: is the NVIDIA driver installed?")


def cuda_driver() -> Check:
    try:
        ctypes.CDLL("libcuda.so.1")
        return Check("CUDA driver", True, "libcuda.so.1 loads")
    except OSError as e:
        return Check("CUDA driver", False, f"libcuda.so.1 does not load ({e})")


def triton() -> Check:
    spec = importlib.util.find_spec("triton")
    if spec is None:
        return Check("triton", False, "not installed (Inductor's GPU kernels); pip install triton")
    import importlib.metadata as md

    try:
        return Check("triton", True, md.version("triton"))
    except md.PackageNotFoundError:
        return Check("triton", True, "installed")


def _link_dirs(home: Optional[str]) -> list[str]:
    env = [p for p in os.environ.get("LIBRARY_PATH", "").split(":") if p]
    cuda = [str(Path(home) / sub) for sub in ("lib64", "lib64/stubs", "lib", "lib/stubs")] if home else []
    return [*env, *cuda, *SYSTEM_LIB_DIRS]


def _pip_cuda_roots() -> list[Path]:
    """Folders of pip's nvidia-* packages that have an include/ folder."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    roots = []
    for base in (spec.submodule_search_locations or []) if spec else []:
        roots += [p.parent for p in sorted(Path(base).glob("*/include")) if p.is_dir()]
    return roots
