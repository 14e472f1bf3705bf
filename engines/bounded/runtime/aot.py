"""Ahead-of-time compilation of graph entry points with AOTInductor, cached on disk.

`load_or_compile` exports a program (torch.export, dynamic dims), compiles it with
`aoti_compile_and_package` (weights become constants in the package; on a CPU its shared
object linked so they land on cache lines: aligned.py) and loads it with
`aoti_load_package`. The package is stored under the cache root
(`$BOUNDED_BENCH_CACHE` or ~/.cache/bounded-bench) in `compiled/`, named by a digest of the
`CompileKey`: model fingerprint, dtypes, device, torch version, planned sizes and the
digest of the graph-defining source folders. A second start with the same key only loads.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Optional

import torch
from torch import nn

from engines.bounded.runtime import aligned
from engines.bounded.runtime.spans import span


def cache_root() -> Path:
    # same root as harness.presets.cache_root (engines never import harness)
    root = os.environ.get("BOUNDED_BENCH_CACHE") or Path.home() / ".cache" / "bounded-bench"
    return Path(root) / "compiled"


# The folders whose code lies under a compiled graph or lays out its inputs: the programs,
# the model and kernels they call, and the runtimes that export them and fill their
# arguments. An edit anywhere in them is a new cache key (a stale package must never load);
# tasks/, engine.py, options.py and plan.py only serve requests (plan sizes are in the key).
GRAPH_FOLDERS = ("kernels", "model", "programs", "runtime")


def source_digest(root: Optional[Path] = None) -> str:
    """Digest of every .py file under GRAPH_FOLDERS of `root` (default: this package)."""
    h = hashlib.sha256()
    root = Path(__file__).parent.parent if root is None else root
    for folder in GRAPH_FOLDERS:
        for f in sorted((root / folder).rglob("*.py")):
            h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class CompileKey:
    program: str
    model: str  # weights.fingerprint of the model directory
    dtype: str
    residual: str
    gemm: str
    device: str
    torch_version: str
    shapes: Any  # a frozen dataclass of the sizes the package is built for (plan.py)
    code: str = field(default_factory=source_digest)  # the graph-defining sources
    inductor: str = ""  # Inductor settings the package was compiled with (json)
    attention: str = "per_sequence"  # the packed prefill's attention (kernels/attention.py)
    native: bool = False  # the native CPU kernels were loaded (kernels/native.py): the graphs call them
    step_attention: str = ""  # a beam decode step's attention (programs/beam.STEP_ATTENTIONS); "": no step
    aligned: str = field(default_factory=aligned.form)  # the wrap placing a CPU package's weights (aligned.py)

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    def package_path(self) -> Path:
        return cache_root() / f"{self.program}-{self.digest()}.pt2"


def device_tag(device: torch.device) -> str:
    """What compiled code depends on: the device type, and for CUDA the architecture."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"cuda-sm{major}{minor}-{torch.cuda.get_device_name(device)}"
    return device.type


class PackageCall:
    """Calls a loaded package (torch's AOTICompiledModel) with its call spec parsed once:
    torch's own __call__ parses both tree specs from JSON on every call (~60 us, a tenth of the
    tiny model's whole scoring call). Positional tensors (or None) in, the program's outputs."""

    def __init__(self, package: Any):
        from torch.utils import _pytree as pytree

        self.package, self.loader = package, package.loader  # the package owns the loaded model
        self._unflatten = pytree.tree_unflatten
        self._out_spec = pytree.treespec_loads(self.loader.get_call_spec()[1])

    def __call__(self, *args: Any) -> Any:
        flat = [a for a in args if isinstance(a, torch.Tensor)]
        with span("bounded::graph"):  # bench profile: the package's time between its kernels
            return self._unflatten(self.loader.boxed_run(flat), self._out_spec)


def load_package(path: Path, single_threaded: bool = False) -> PackageCall:
    return PackageCall(torch._inductor.aoti_load_package(str(path), run_single_threaded=single_threaded))


@dataclass
class Loaded:
    runner: Callable[..., Any]
    path: Path
    compiled_now: bool  # False: loaded from the cache
    seconds: float


def load_or_compile(key: CompileKey, build: Callable[[], nn.Module], example_args: tuple,
                    dynamic_shapes: tuple, log: Callable[[str], None],
                    inductor_configs: Optional[dict[str, Any]] = None, single_threaded: bool = False) -> Loaded:
    """Load the package for `key`, compiling it first if the cache has none (or a broken one).
    `single_threaded`: load it to run on the caller's thread and stream only (what CUDA graph
    capture of a package needs)."""
    path = key.package_path()
    t0 = time.perf_counter()
    if path.is_file():
        try:
            runner = load_package(path, single_threaded)
            return Loaded(runner, path, False, time.perf_counter() - t0)
        except Exception as e:  # a truncated or foreign package: rebuild it
            log(f"cached package {path} does not load ({e}); recompiling")
    compile_package(key, build(), example_args, dynamic_shapes, log, inductor_configs)
    runner = load_package(path, single_threaded)
    return Loaded(runner, path, True, time.perf_counter() - t0)


def compile_package(key: CompileKey, module: nn.Module, example_args: tuple, dynamic_shapes: tuple,
                    log: Callable[[str], None], inductor_configs: Optional[dict[str, Any]] = None) -> Path:
    path = key.package_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    log(f"compiling {key.program} with AOTInductor for {key.device}/{key.dtype} "
        f"(once per model, dtype and shape policy; cached at {path}) ...")
    t0 = time.perf_counter()
    tmp = path.with_name(f"{path.stem}.tmp{os.getpid()}.pt2")
    # no_grad for the compile too: under grad mode Inductor's freezing leaves every linear an
    # aten mm on the plain weight; without it, the weights are prepacked for oneDNN.
    with torch.inference_mode(False), torch.no_grad():
        exported = torch.export.export(module, example_args, dynamic_shapes=dynamic_shapes)
        log(f"exported in {time.perf_counter() - t0:.1f} s; compiling ...")
        # a copy: Inductor adds its own entries to the dict it is given, and callers keep
        # theirs in the cache key of the next package they compile
        with aligned.aligned_constants(log) if key.device == "cpu" else contextlib.nullcontext():
            torch._inductor.aoti_compile_and_package(exported, package_path=str(tmp),
                                                     inductor_configs=dict(inductor_configs or {}))
    os.replace(tmp, path)
    path.with_suffix(".json").write_text(json.dumps(asdict(key), indent=1, sort_keys=True))
    log(f"compiled {key.program} in {time.perf_counter() - t0:.1f} s")
    drop_build_copies(path, log)
    prune_superseded(key, log)
    return path


def drop_build_copies(package: Path, log: Callable[[str], None]) -> int:
    """Delete the shared objects Inductor's build left in its own cache folder (under the
    system temp dir) once `package` holds its own copies: each one carries the model's weights
    as constants (~0.6-1.2 GB for the presets), so a few compiles used to fill a small disk.
    -> bytes freed. Only files named like the package's are touched (names are hashes)."""
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
        with zipfile.ZipFile(package) as z:
            names = {PurePosixPath(n).name for n in z.namelist() if n.endswith(".so")}
        freed = 0
        for name in names:
            for f in Path(cache_dir()).glob(f"*/{name}"):
                freed += f.stat().st_size
                f.unlink()
    except (ImportError, OSError, zipfile.BadZipFile) as e:  # a torch without that layout: keep them
        log(f"left Inductor's build files in place ({type(e).__name__}: {e})")
        return 0
    if freed:
        log(f"removed {freed / 2**20:.0f} MiB of Inductor build files the package holds a copy of")
    return freed


# what may change between builds of the same package (the rest of the key names the package)
_BUILD_FIELDS = ("code", "torch_version", "inductor")
# builds of one package kept in the cache: the new one and the newest before it, so two
# checkouts (or branches) sharing a cache do not delete each other's packages on every start
KEEP_BUILDS = 2


def prune_superseded(key: CompileKey, log: Callable[[str], None], keep: int = KEEP_BUILDS) -> None:
    """Delete cached packages that differ from `key` only in build fields (older sources,
    torch or Inductor settings), but for the newest `keep - 1` of them: each is ~1 GB."""
    mine = {k: v for k, v in asdict(key).items() if k not in _BUILD_FIELDS}
    others = []
    for meta in key.package_path().parent.glob(f"{key.program}-*.json"):
        if meta.stem == key.package_path().stem:
            continue
        try:
            other = json.loads(meta.read_text())
            written = meta.stat().st_mtime
        except (OSError, ValueError):
            continue
        if {k: v for k, v in other.items() if k not in _BUILD_FIELDS} == mine:
            others.append((written, meta))
    for _, meta in sorted(others, reverse=True)[max(keep - 1, 0):]:
        meta.with_suffix(".pt2").unlink(missing_ok=True)
        meta.unlink(missing_ok=True)
        log(f"removed superseded package {meta.with_suffix('.pt2').name}")
