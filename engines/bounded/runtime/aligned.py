"""A CPU package's weights on cache-line boundaries.

An AOTInductor package copies its constants (the weights) at load into one block from
`std::malloc`, each at an offset that is a multiple of 64 from the block's start. glibc's
malloc aligns a block to 16 bytes only (a block mapped on its own lies 16 bytes past a page
boundary), so every weight of a package was 16, 32 or 48 bytes off a cache line. oneDNN's
int8 kernel reads its prepacked weights with AMX tile loads as they lie, and ran ~1.6x slower
that way: on a Xeon with AMX (2026-12-06) prefill_15's int8 GEMMs took 1,040-1,100 ms for two
requests inside the package against 660 ms with the block aligned, and the bf16 plan's ~4 %
more (its GEMMs copy the weights into their own layout first).

`aligned_constants()`, around a CPU package's compile, links its shared object with
`-Wl,--wrap=malloc` and a small object whose `__wrap_malloc` serves blocks of 1 MB and more
from `posix_memalign(64)` (free() takes them back as any other): only that shared object's
own calls change, and only those the runtime makes (the constants' block among them). A block
of 2 MB and more starts on a 2 MB boundary and is advised to take huge pages before its first
touch (MADV_HUGEPAGE), so the weights are copied in onto 2 MB pages (hugepages.py says why).
Elsewhere than Linux with a GNU-compatible compiler, or when the object cannot be built,
the package links as before (`status()` says why) and runs as before, unaligned.
`BOUNDED_ALIGNED=0` links as before too (to compare the two: the package cache key says
which form a package is).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

SOURCE = r"""
// engines/bounded/runtime/aligned.py: __wrap_malloc of an AOTInductor package's shared object
#include <stdlib.h>
#include <sys/mman.h>
extern "C" void* __real_malloc(size_t n);
extern "C" __attribute__((visibility("hidden"))) void* __wrap_malloc(size_t n) {
  const size_t huge = (size_t)2 << 20;
  if (n < ((size_t)1 << 20)) return __real_malloc(n);
  void* p = nullptr;
  if (posix_memalign(&p, n >= huge ? huge : 64, n) != 0) return nullptr;
  if (n >= huge) madvise(p, n / huge * huge, MADV_HUGEPAGE);  /* before the first touch (hugepages.py) */
  return p;
}
"""
# what the compile's link line gains (the object's path after it)
LINK_FLAGS = "-Wl,--wrap=malloc"

_lock = threading.Lock()
_users = 0
_saved: Optional[Any] = None
_status = "not built yet"


def _object_path() -> Path:
    from engines.bounded.runtime.aot import cache_root

    return cache_root().parent / "native" / f"aligned_malloc-{form() or 'off'}.o"


def enabled() -> bool:
    """Are CPU packages to be linked with the wrap (not turned off by BOUNDED_ALIGNED=0)?"""
    return os.environ.get("BOUNDED_ALIGNED", "1") != "0"


def form() -> str:
    """Which wrap a package links (its cache key's part): the source's digest, "" for none."""
    return hashlib.sha256(SOURCE.encode()).hexdigest()[:16] if enabled() else ""


def build_object(log: Callable[[str], None] = print) -> Optional[Path]:
    """The object with __wrap_malloc, built once per cache (~1 s); None (and `status()` says
    why) where it cannot be."""
    global _status
    if not enabled():
        _status = "off (BOUNDED_ALIGNED=0)"
        return None
    if not sys.platform.startswith("linux"):
        _status = f"not on Linux ({sys.platform})"
        return None
    obj = _object_path()
    if obj.is_file():
        _status = f"linked ({obj})"
        return obj
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        obj.parent.mkdir(parents=True, exist_ok=True)
        # this process's own source and object, renamed into place: two processes building
        # at once never read each other's half-written files
        src = obj.with_name(f"{obj.stem}.{os.getpid()}.cpp")
        tmp = obj.with_name(f"{obj.stem}.{os.getpid()}.o")
        src.write_text(SOURCE)
        try:
            subprocess.run([get_cpp_compiler(), "-O2", "-fPIC", "-c", str(src), "-o", str(tmp)],
                           check=True, capture_output=True, text=True, timeout=120)
            tmp.replace(obj)
        finally:
            src.unlink(missing_ok=True)
            tmp.unlink(missing_ok=True)
    except (ImportError, OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        _status = f"object not built: {type(e).__name__}: {detail.strip()[:200]}"
        log(f"[bounded] package weights stay unaligned: {_status}")
        return None
    _status = f"linked ({obj})"
    return obj


def status() -> str:
    return _status


def _linker(base: type, obj: Path) -> type:
    class AlignedLink(base):  # type: ignore[misc, valid-type]
        """Inductor's CppBuilder, its AOT shared-object link gaining LINK_FLAGS and `obj`."""

        def get_command_line(self) -> str:
            cmd = super().get_command_line()
            if (getattr(self, "_aot_mode", False) and getattr(self, "_do_link", False)
                    and str(getattr(self, "_target_file", "")).endswith(".so")):
                cmd += f" {LINK_FLAGS} {shlex.quote(str(obj))}"
            return cmd

    return AlignedLink


@contextlib.contextmanager
def aligned_constants(log: Callable[[str], None] = print) -> Iterator[bool]:
    """While held, AOTInductor links each CPU package's shared object with the aligned
    __wrap_malloc. -> whether it does (False: as before). Nested and concurrent holders share
    one patch of Inductor's builder, removed when the last one leaves."""
    global _users, _saved
    obj = build_object(log)
    if obj is None:
        yield False
        return
    import torch._inductor.codecache as codecache

    with _lock:
        if _users == 0:
            _saved = codecache.CppBuilder
            codecache.CppBuilder = _linker(_saved, obj)
        _users += 1
    try:
        yield True
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                codecache.CppBuilder = _saved
                _saved = None
