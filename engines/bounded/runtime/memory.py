"""glibc's malloc while a CPU engine runs: freed memory kept in the process, no block mapped
afresh per call.

A prefill batch's activations are tens of MB (prefill_15 at concurrency 4: ~5,800 token rows,
its gate_up output alone 71 MB in bf16). glibc serves a block over its mmap threshold (32 MB
at most) from a fresh mapping and unmaps it when freed, and trims the heap's free top back
to the system, so every such buffer of every layer of every call was faulted in again page
by page (the kernel zeroing each 4 KB). Measured on a Xeon with AMX (2026-12-06): prefill_15
at concurrency 4, 0.97 -> 1.22-1.28 requests/s (alternated runs); an eager oneDNN int8 GEMM
[1,440, 1,024] x [1,024, 6,144] in a fresh process, 15.7 -> 4.3 ms a call.

The engine's model thread allocates from an arena of its own, whose heaps (64 MB at most
each) glibc unmaps as soon as one is wholly free, whatever the trim threshold: with the two
settings below alone, steady-state prefill_15 requests still made 250-350 mmaps, twice as
many munmaps and 110-360 page faults each (a Xeon with AMX, 2026-12-07: `perf stat` over 6 s
of ~1 s requests, getrusage per request; one run of 20 fell into
245,728 faults a request and 1,225 ms against ~900). A top pad of a whole heap stops that
(glibc keeps a free heap while the pad exceeds what deleting it would leave): 0 of each, and
a request of a token count not met before 5,100-5,600 faults (new oneDNN kernels, the heap's
growth) against 8,700-26,000 (alternated; the times within that hour's noise).

`keep_freed_memory()` sets all three (M_MMAP_MAX 0: every block from the heap;
M_TRIM_THRESHOLD at its largest: the heap never shrinks; M_TOP_PAD a heap: a thread's heaps
stay) until the last holder calls
`release()`, which puts glibc's defaults back (its dynamic mmap threshold stays where it was)
and hands the kept memory back with `malloc_trim(0)`: without it a freed block left at the
heap's top, or in a hole below a live one, would stay in the process (and serve the next large
block with no fault). The price: the process keeps its peak heap
while the engine runs. `BOUNDED_MALLOC=0` leaves malloc alone; elsewhere than glibc there is
nothing to do.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import threading
from typing import Optional

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4  # mallopt parameters (malloc.h)
DEFAULT_TRIM_THRESHOLD, DEFAULT_TOP_PAD, DEFAULT_MMAP_MAX = 128 * 1024, 128 * 1024, 65536  # glibc's defaults
HEAP_PAD = 64 << 20  # a thread arena's heap size (HEAP_MAX_SIZE, 64-bit): as top pad, no heap is ever deleted

_lock = threading.Lock()
_holders = 0


def _libc() -> Optional[ctypes.CDLL]:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def _mallopt() -> Optional[ctypes._CFuncPtr]:
    libc = _libc()
    return getattr(libc, "mallopt", None) if libc is not None else None


class Held:
    """A holder of the setting: `release()` once (later calls do nothing)."""

    def __init__(self, active: bool):
        self.active = active

    def release(self) -> None:
        global _holders
        if not self.active:
            return
        self.active = False
        with _lock:
            _holders -= 1
            if _holders == 0:
                libc = _libc()
                libc.mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
                libc.mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)
                libc.mallopt(M_TOP_PAD, DEFAULT_TOP_PAD)
                libc.malloc_trim(0)


def keep_freed_memory() -> Held:
    """Keep freed memory in the process and map no block afresh, until released. -> the
    holder (inactive where BOUNDED_MALLOC=0 or malloc is not glibc's)."""
    global _holders
    if os.environ.get("BOUNDED_MALLOC", "1") == "0":
        return Held(False)
    mallopt = _mallopt()
    if mallopt is None:
        return Held(False)
    with _lock:
        if _holders == 0 and not (mallopt(M_MMAP_MAX, 0) and mallopt(M_TRIM_THRESHOLD, 2**31 - 1)
                                  and mallopt(M_TOP_PAD, HEAP_PAD)):
            return Held(False)
        _holders += 1
    return Held(True)
