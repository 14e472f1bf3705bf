"""runtime/memory.py: while held, a large block freed and allocated again comes from the
process's heap (no fresh mapping faulted in page by page), a thread's arena too; holders
nest; the last release hands the kept memory back; BOUNDED_MALLOC=0 leaves malloc alone.

The fault counts run in a fresh interpreter: glibc's default (a 64 MB block mapped afresh)
holds there, while in the suite's process the big blocks torch freed earlier raise glibc's
dynamic thresholds and can leave a free 64 MB in the heap, with or without this module."""
import ctypes
import os
import platform
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from engines.bounded.runtime import memory

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")

MB64 = 64 * 2**20  # over glibc's largest mmap threshold (32 MB): mapped afresh by default


def faults_of_a_fresh_block() -> int:
    """Minor page faults of malloc'ing and writing a 64 MB block, after one was freed."""
    libc = _libc()
    block = libc.malloc(MB64)
    ctypes.memset(block, 1, MB64)
    libc.free(block)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(MB64)
    ctypes.memset(block, 2, MB64)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    libc.free(block)
    return faults


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    return libc


def in_fresh_process(body: str) -> None:
    """Run `body` (a function of this module) in a fresh interpreter, BOUNDED_MALLOC unset;
    its assertion, if any, fails the test."""
    env = {k: v for k, v in os.environ.items() if k != "BOUNDED_MALLOC"}
    root = Path(__file__).resolve().parents[4]
    code = f"from tests.engines.bounded.runtime.test_memory import {body}; {body}()"
    run = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]


def test_held_blocks_come_back_from_the_heap_and_holders_nest():
    assert memory._holders == 0, "an earlier test left an engine (or a holder) unreleased"
    in_fresh_process("held_blocks_come_back_from_the_heap_and_holders_nest")


def test_the_last_release_hands_the_kept_memory_back():
    in_fresh_process("the_last_release_hands_the_kept_memory_back")


def test_a_threads_arena_keeps_its_heaps_while_held():
    in_fresh_process("a_threads_arena_keeps_its_heaps_while_held")


def a_threads_arena_keeps_its_heaps_while_held():
    """The engine's model thread allocates from an arena of its own, whose heaps (64 MB at
    most each) glibc unmaps once wholly free, whatever the trim threshold: a block that needed
    a second heap was mapped and faulted in afresh every time (prefill_15: ~350 mmaps and
    ~700 munmaps a request). While held, the heaps stay."""
    import threading

    libc, size, got = _libc(), 40 * 2**20, []

    def second_heap_again() -> None:  # on a thread: its own arena
        first = libc.malloc(size)
        ctypes.memset(first, 1, size)
        second = libc.malloc(size)  # does not fit beside the first in one heap
        ctypes.memset(second, 1, size)
        libc.free(second)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        second = libc.malloc(size)
        ctypes.memset(second, 2, size)
        got.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        libc.free(second)
        libc.free(first)

    held = memory.keep_freed_memory()
    try:
        worker = threading.Thread(target=second_heap_again)
        worker.start()
        worker.join()
    finally:
        held.release()
    assert got and got[0] < (size // 4096) // 20, got


def held_blocks_come_back_from_the_heap_and_holders_nest():
    assert memory._holders == 0
    pages = MB64 // 4096
    assert faults_of_a_fresh_block() > pages // 2  # glibc's default: mapped, faulted in again
    first, second = memory.keep_freed_memory(), memory.keep_freed_memory()
    try:
        assert first.active and second.active
        assert faults_of_a_fresh_block() < pages // 20
        first.release()
        first.release()  # a second release does nothing: the other holder still holds
        assert faults_of_a_fresh_block() < pages // 20
    finally:
        first.release()
        second.release()
    assert memory._holders == 0


def the_last_release_hands_the_kept_memory_back():
    """A large block freed while held stays in the heap (a small block allocated after it
    still lives); once released, the next large block must be mapped afresh, not served
    from what the engine kept."""
    libc = _libc()
    held = memory.keep_freed_memory()
    block = libc.malloc(3 * MB64)
    ctypes.memset(block, 1, 3 * MB64)
    live = libc.malloc(4096)
    libc.free(block)
    held.release()
    try:
        again = libc.malloc(MB64)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        ctypes.memset(again, 2, MB64)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        libc.free(again)
    finally:
        libc.free(live)
    assert faults > (MB64 // 4096) // 2


def test_bounded_malloc_0_leaves_malloc_alone(monkeypatch):
    monkeypatch.setenv("BOUNDED_MALLOC", "0")
    held = memory.keep_freed_memory()
    assert not held.active and memory._holders == 0
    held.release()
    assert memory._holders == 0
