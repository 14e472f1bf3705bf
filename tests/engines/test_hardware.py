"""The capability probe: which precisions each kind of device runs natively (the ISA cases
injected), and the real probe on this machine against /proc/cpuinfo."""
from pathlib import Path

import pytest

from engines.hardware import PRECISION_FLAGS, Capabilities, probe

ZEN4 = Capabilities("cpu", "AMD EPYC (Zen4)", frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_vnni"}))
ICE_LAKE = Capabilities("cpu", "Intel Xeon (Ice Lake)", frozenset({"avx2", "avx512f", "avx512_vnni"}))
SAPPHIRE = Capabilities("cpu", "Intel Xeon (Sapphire Rapids)",
                        frozenset({"avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile", "amx_bf16",
                                   "amx_int8"}))
# an Emerald Rapids in a VM whose hypervisor does not expose AMX: bf16 on AVX512-BF16 only
HIDDEN_AMX = Capabilities("cpu", "Intel Xeon (AMX hidden)",
                          frozenset({"avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx_vnni"}))
AVX2_ONLY = Capabilities("cpu", "old", frozenset({"avx2"}))


@pytest.mark.parametrize("caps, bf16, fp16, int8", [
    (ZEN4, True, False, "avx512_vnni"),
    (ICE_LAKE, False, False, "avx512_vnni"),
    (SAPPHIRE, True, True, "amx_int8"),
    (AVX2_ONLY, False, False, None),
])
def test_cpu_native_precisions(caps, bf16, fp16, int8):
    assert caps.native("float32")
    assert caps.native("bfloat16") is bf16
    assert caps.native("float16") is fp16
    assert caps.int8_isa == int8
    assert not caps.fp8
    facts = caps.facts()
    assert facts["native"] == {"float32": True, "bfloat16": bf16, "float16": fp16}
    assert facts["flags"] == sorted(caps.flags)


@pytest.mark.parametrize("cc, bf16, fp8", [((9, 0), True, True), ((8, 9), True, True), ((8, 0), True, False),
                                           ((7, 0), False, False)])
def test_gpu_native_precisions(cc, bf16, fp8):
    caps = Capabilities("cuda", "GPU", compute_capability=cc)
    assert caps.native("bfloat16") is bf16 and caps.native("float16") and caps.fp8 is fp8
    assert caps.facts()["compute_capability"] == f"{cc[0]}.{cc[1]}"


def test_cache_key_separates_cpus_of_one_name():
    # "AMD EPYC" names Zen2 to Zen5: the flags keep their measurements apart
    assert ZEN4.key() != Capabilities("cpu", ZEN4.name, ICE_LAKE.flags).key()


def test_real_probe_reads_this_machines_flags():
    caps = probe("cpu")
    text = Path("/proc/cpuinfo").read_text()
    flags = set(next(l for l in text.splitlines() if l.startswith("flags")).split(":", 1)[1].split())
    assert caps.flags == flags & set(PRECISION_FLAGS)
    assert caps.native("bfloat16") == bool({"avx512_bf16", "amx_bf16"} & flags)


def test_on_own_thread_runs_elsewhere_and_returns_or_raises():
    """The rate probes run on a thread that ends with them (its OpenMP team with it): the
    value comes back, an exception is raised on the caller's thread, and the probe's thread
    is gone after."""
    import threading

    from engines.hardware import on_own_thread

    caller = threading.get_ident()
    ran_on = on_own_thread(threading.get_ident)
    assert ran_on != caller
    assert all(t.ident != ran_on for t in threading.enumerate())
    with pytest.raises(ZeroDivisionError):
        on_own_thread(lambda: 1 / 0)
