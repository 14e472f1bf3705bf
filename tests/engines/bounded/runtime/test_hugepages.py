"""runtime/hugepages.py: which mappings are advised and collapsed (smaps parsed), the turned-off
and unsupported paths, and a real collapse of a dense anonymous mapping of this process."""
from __future__ import annotations

import mmap
import os
import sys

import pytest

from engines.bounded.runtime import hugepages
from engines.bounded.runtime.hugepages import HUGE, Mapping

SMAPS = """\
7f0000000000-7f0000a00000 rw-p 00000000 00:00 0
Size:              10240 kB
Rss:                9000 kB
VmFlags: rd wr mr mw me ac
7f0000a00000-7f0000c00000 rw-p 00000000 00:00 0                          [stack]
Rss:                 100 kB
VmFlags: rd wr mr mw me gd ac
7f0000c00000-7f0001000000 r--p 00000000 08:01 123                        /usr/lib/libc.so.6
Rss:                4096 kB
VmFlags: rd mr mw me
7f0001000000-7f0001400000 rw-s 00000000 00:05 9                          /dev/zero (deleted)
Rss:                4096 kB
VmFlags: rd wr sh mr mw me ms
7f0001400000-7f0001800000 rw-p 00000000 00:00 0
Rss:                4096 kB
VmFlags: rd wr mr mw me ac nh
55d000001000-55d000500000 rw-p 00000000 00:00 0                          [heap]
Rss:                5116 kB
VmFlags: rd wr mr mw me ac
"""


def test_only_private_anonymous_writable_mappings_are_advisable(tmp_path):
    path = tmp_path / "smaps"
    path.write_text(SMAPS)
    got = list(hugepages.mappings(str(path)))
    assert [m.advisable for m in got] == [True, False, False, False, False, True]  # stack, file, shared, nh
    assert got[0].resident == 9000 << 10 and got[0].end - got[0].start == 10 << 20
    # the heap starts 4 KB past a huge page: its whole huge pages are the two after
    assert got[5].huge_range() == (0x55D000200000, 0x55D000400000)
    assert got[0].flags == ("rd", "wr", "mr", "mw", "me", "ac") and got[5].path == "[heap]"
    a, b = Mapping(0x1000, 0x200000, "rw-p", "").huge_range()
    assert b <= a  # no whole huge page inside


def test_turned_off_it_does_nothing_and_says_so(monkeypatch):
    monkeypatch.setenv("BOUNDED_HUGEPAGES", "0")
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    got = hugepages.back_with_huge_pages()
    assert got.collapsed == 0 and "BOUNDED_HUGEPAGES=0" in got.line()
    hugepages.advise_torch_allocations()
    assert "THP_MEM_ALLOC_ENABLE" not in os.environ


@pytest.mark.skipif(not sys.platform.startswith("linux") or hugepages.thp_mode() in (None, "never"),
                    reason="needs Linux with transparent huge pages")
def test_torchs_large_blocks_take_huge_pages_and_the_environment_is_put_back():
    import subprocess

    code = ("import os, torch; from engines.bounded.runtime import hugepages as h; "
            "h.advise_torch_allocations(); assert 'THP_MEM_ALLOC_ENABLE' not in os.environ; "
            "x = torch.empty(64 << 20, dtype=torch.uint8); x.fill_(1); "
            "print('hg' in [m for m in h.mappings() if m.start <= x.data_ptr() < m.end][0].flags)")
    env = {k: v for k, v in os.environ.items() if k not in ("THP_MEM_ALLOC_ENABLE", "BOUNDED_HUGEPAGES")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == ["True"]  # its mapping advised to take huge pages (torch's own madvise)


def test_without_transparent_huge_pages_it_says_why(monkeypatch, tmp_path):
    monkeypatch.delenv("BOUNDED_HUGEPAGES", raising=False)
    setting = tmp_path / "enabled"
    setting.write_text("always madvise [never]\n")
    monkeypatch.setattr(hugepages, "THP_ENABLED", setting)
    assert hugepages.thp_mode() == "never"
    assert "never" in hugepages.back_with_huge_pages().line()
    monkeypatch.setattr(hugepages, "THP_ENABLED", tmp_path / "absent")
    assert "no transparent huge pages" in hugepages.back_with_huge_pages().note


@pytest.mark.skipif(not sys.platform.startswith("linux") or hugepages.thp_mode() in (None, "never"),
                    reason="needs Linux with transparent huge pages")
def test_a_dense_anonymous_mapping_ends_up_on_huge_pages(monkeypatch):
    monkeypatch.delenv("BOUNDED_HUGEPAGES", raising=False)
    size = 8 * HUGE
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf.write(b"\x01" * size)  # on 4 KB pages where THP is "madvise" (on huge ones under "always")
    got = hugepages.back_with_huge_pages()
    if got.note:
        pytest.skip(got.note)  # e.g. a kernel before 6.1
    assert got.collapsed >= 6 * HUGE and got.seconds > 0
    import ctypes

    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    huge = next(m.huge for m in hugepages.mappings() if m.start <= addr < m.end)
    assert huge >= 6 * HUGE, huge  # the mapping's whole huge pages (it may start mid-page)
    assert buf[:16] == b"\x01" * 16 and buf[size - 16:] == b"\x01" * 16  # the contents kept
    buf.close()

