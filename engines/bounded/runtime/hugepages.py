"""The engine's memory on 2 MB pages, where each 4 KB page first touched in a while is dear.

On the machines this project runs on (Firecracker VMs on shared hosts), memory in 4 KB pages
that a core has not touched for a few hundred milliseconds costs far more than its bytes:
every page is a nested page walk whose own entries have left the caches (another guest ran
on the core meanwhile). Measured on a Xeon with AMX (2026-12-07, one process, alternated):
3,000 lookups in a 200k-entry dict took 1.2-2.3 ms back to back and 3.4-52 ms after an idle
0.8 s; summing 128 MB took 50 ms after 0.2 s idle and 106 ms after 0.8 s on 4 KB pages, 9-10
ms on 2 MB pages. An engine is exactly such a process: its weights, buffers and Python objects are read
once a request, a request apart. The request check of prefill_15 (1.4 ms alone) took 19-49 ms
inside the engine, and the beam head's 272 MB weight stream 31-33 ms a call on 4 KB pages
against 24-26 on 2 MB ones.

`advise_torch_allocations()` (on importing engines.bounded) has torch's CPU allocator advise
every block of 2 MB and more to take huge pages before its first touch (torch's
THP_MEM_ALLOC_ENABLE, read at the process's first such block: a process that made one before
keeps 4 KB pages for its tensors until the sweep below); the AOT packages' weights get the
same from aligned.py. `back_with_huge_pages()` (the engine's start calls it, once all is loaded and warm)
advises every dense private anonymous mapping of the process (weights, the malloc arenas'
heaps the engine keeps, runtime/memory.py; tensors; Python's object arenas) to take huge
pages (MADV_HUGEPAGE: its later faults) and collapses the pages it has now (MADV_COLLAPSE,
Linux 6.1+, whatever the system's THP setting but "never"). Sparse mappings (thread stacks,
reserved heap space: less than half resident) are left alone: collapsing would make them
resident. It costs a copy of what it collapses, once (0-2.5 s at a 0.5B model's start here, its
weights already on huge pages; 10-14 s when they were not), and at most 2 MB a mapping of
memory. `BOUNDED_HUGEPAGES=0` turns it off; elsewhere than Linux, or where the kernel refuses,
nothing changes and `Backing.note` says why.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

HUGE = 2 << 20  # the x86-64 / arm64 (4 KB base) huge page
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25  # linux/mman.h
DENSE = 0.5  # a mapping at least this resident is collapsed
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@dataclass(frozen=True)
class Backing:
    collapsed: int = 0  # bytes now on huge pages (collapsed here, or already)
    refused: int = 0  # bytes the kernel would not collapse (a mapping it refuses; too little memory free)
    seconds: float = 0.0
    note: str = ""  # why nothing was done, where it was not

    def line(self) -> str:
        if self.note:
            return f"huge pages: {self.note}"
        refused = f", {self.refused / 2**20:,.0f} MB refused" if self.refused else ""
        return f"huge pages: {self.collapsed / 2**20:,.0f} MB collapsed in {self.seconds:.1f} s{refused}"


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    perms: str  # smaps' "rw-p" ...
    path: str  # "" for anonymous memory, "[heap]", a file, "[stack]" ...
    resident: int = 0  # bytes (Rss)
    huge: int = 0  # bytes on huge pages (AnonHugePages)
    flags: tuple[str, ...] = ()  # VmFlags ("hg": advised huge, "nh": no huge pages)

    @property
    def advisable(self) -> bool:
        """Private, anonymous, writable and not marked no-huge-pages."""
        return (self.perms.startswith("rw") and self.perms[3:4] == "p" and self.path in ("", "[heap]")
                and "nh" not in self.flags)

    def huge_range(self) -> tuple[int, int]:
        """The whole huge pages inside the mapping: [a, b), maybe empty."""
        return -(-self.start // HUGE) * HUGE, self.end // HUGE * HUGE


def thp_mode() -> Optional[str]:
    """The system's THP setting ("always", "madvise", "never"), None where there is none."""
    try:
        text = THP_ENABLED.read_text()
    except OSError:
        return None
    return text[text.find("[") + 1:text.find("]")] if "[" in text else None


def mappings(smaps: str = "/proc/self/smaps") -> Iterator[Mapping]:
    """This process's mappings, from smaps (header lines `start-end perms offset dev inode [path]`,
    then `Field: value` lines)."""
    head: Optional[list[str]] = None
    fields: dict[str, list[str]] = {}
    with open(smaps) as f:
        for line in f:
            words = line.split()
            if not words:
                continue
            if words[0].endswith(":"):
                fields[words[0]] = words[1:]
                continue
            if head is not None:
                yield _mapping(head, fields)
            head, fields = words, {}
    if head is not None:
        yield _mapping(head, fields)


def _mapping(head: list[str], fields: dict[str, list[str]]) -> Mapping:
    lo, hi = (int(x, 16) for x in head[0].split("-"))
    kb = lambda name: int(fields.get(name, ["0"])[0]) << 10  # noqa: E731
    return Mapping(lo, hi, head[1], head[5] if len(head) > 5 else "", kb("Rss:"), kb("AnonHugePages:"),
                   tuple(fields.get("VmFlags:", ())))


def _why_not() -> str:
    if os.environ.get("BOUNDED_HUGEPAGES", "1") == "0":
        return "off (BOUNDED_HUGEPAGES=0)"
    if not sys.platform.startswith("linux"):
        return f"not on Linux ({sys.platform})"
    mode = thp_mode()
    if mode is None:
        return "the kernel has no transparent huge pages"
    if mode == "never":
        return f"the system's THP setting is never ({THP_ENABLED})"
    return ""


def advise_torch_allocations() -> None:
    """torch's large CPU blocks on huge pages from their first touch (unless turned off, or
    set already). torch reads THP_MEM_ALLOC_ENABLE once, at its first such block: one is made
    here with it set, and the environment is put back, so the servers of other engines that
    this process starts do not inherit it."""
    if _why_not() or "THP_MEM_ALLOC_ENABLE" in os.environ:
        return
    import torch

    os.environ["THP_MEM_ALLOC_ENABLE"] = "1"
    try:
        torch.empty(HUGE, dtype=torch.uint8)
    finally:
        del os.environ["THP_MEM_ALLOC_ENABLE"]


def back_with_huge_pages() -> Backing:
    """Advise and collapse the process's dense anonymous memory onto huge pages (see above)."""
    why = _why_not()
    if why:
        return Backing(note=why)
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    t0 = time.perf_counter()
    done = refused = 0
    unsupported = ""
    for m in list(mappings()):
        a, b = m.huge_range()
        if not m.advisable or b <= a or m.resident < DENSE * (m.end - m.start):
            continue
        libc.madvise(a, b - a, MADV_HUGEPAGE)
        if libc.madvise(a, b - a, MADV_COLLAPSE) == 0:
            done += b - a
            continue
        err = ctypes.get_errno()
        if err == 22 and done == 0 and not unsupported:  # EINVAL on the first: maybe a kernel without it
            unsupported = os.strerror(err)
        refused += b - a
    if done == 0 and unsupported:
        return Backing(note=f"the kernel would not collapse (MADV_COLLAPSE: {unsupported}; Linux 6.1+)")
    return Backing(done, refused, time.perf_counter() - t0)
