"""Peaks per precision and the MFU denominator, for each kind of device (capabilities and
rates injected), the cache, and the real measurement on this machine at small sizes."""
import json

import pytest
import torch

import harness.device.peak as peak
from engines.hardware import Capabilities
from harness.device.peak import Peaks, cpu_peaks, device_peaks, gpu_rates
from tests.engines.test_hardware import ICE_LAKE, ZEN4

# rates (TFLOP/s) as DESIGN.md 7 measured them on the two CPUs of this kind of machine
ICE_LAKE_RATES = {"float32": {"s": 0.32}, "bfloat16": {"s": 0.064}, "int8": {"s": 1.07}}
ZEN4_RATES = {"float32": {"s": 0.20}, "bfloat16": {"s": 0.44}, "int8": {"s": 0.80}}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BOUNDED_BENCH_CACHE", str(tmp_path))
    return tmp_path / "peaks.json"


def test_without_native_bf16_the_denominator_is_fp32_and_bf16_is_emulated(cache):
    p = cpu_peaks(ICE_LAKE, measure=lambda caps: ICE_LAKE_RATES)
    assert p.mfu_precision == "float32" and p.mfu_tflops == 0.32
    assert p.rates["int8"] == 1.07  # reported beside, never the denominator
    why = p.emulated("bfloat16")
    assert "no AVX512-BF16" in why and "float32 runs natively at 320 GFLOP/s" in why
    assert p.emulated("float32") is None
    assert "float32" in p.why() and "320" in p.why()


def test_with_native_bf16_the_denominator_is_bf16_and_nothing_warns(cache):
    p = cpu_peaks(ZEN4, measure=lambda caps: ZEN4_RATES)
    assert p.mfu_precision == "bfloat16" and p.mfu_tflops == 0.44
    assert p.emulated("bfloat16") is None and p.emulated("float32") is None
    assert "no AVX512-FP16" in p.emulated("float16")  # no native fp16 on Zen4: not measured, still named


def test_rates_are_cached_per_cpu_flags_torch_and_threads(cache, monkeypatch):
    calls = []
    measure = lambda caps: calls.append(caps) or ZEN4_RATES  # noqa: E731
    cpu_peaks(ZEN4, measure=measure)
    cpu_peaks(ZEN4, measure=measure)
    assert len(calls) == 1
    cpu_peaks(Capabilities("cpu", ZEN4.name, ICE_LAKE.flags), measure=lambda caps: ICE_LAKE_RATES)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 97)
    cpu_peaks(ZEN4, measure=measure)
    assert len(calls) == 2 and len(json.loads(cache.read_text())) == 3
    cpu_peaks(ZEN4, refresh=True, measure=measure)
    assert len(calls) == 3


def test_gpu_rates_from_the_table_without_tf32():
    h200 = Capabilities("cuda", "NVIDIA H200", compute_capability=(9, 0))
    r = gpu_rates(h200.name, h200)
    assert r == {"float32": 67.0, "float16": 989.0, "bfloat16": 989.0, "int8": 1978.0, "float8": 1978.0}
    p = device_peaks("cuda", caps=h200)
    assert p.mfu_precision == "bfloat16" and p.mfu_tflops == 989.0 and p.emulated("bfloat16") is None
    a100 = Capabilities("cuda", "NVIDIA A100-SXM4-80GB", compute_capability=(8, 0))
    assert "float8" not in gpu_rates(a100.name, a100)
    with pytest.raises(ValueError, match="--peak-tflops"):
        device_peaks("cuda", caps=Capabilities("cuda", "Mystery GPU", compute_capability=(9, 0)))


def test_override_replaces_the_denominator_only():
    p = device_peaks("cpu", caps=ICE_LAKE, override=0.5)
    assert p.mfu_tflops == 0.5 and "command line" in p.why()
    assert "no AVX512-BF16" in p.emulated("bfloat16")  # the ISA facts still say so
    assert p.to_json()["capabilities"]["native"]["bfloat16"] is False


def test_preset_gemm_shapes_are_measured():
    shapes = peak.gemm_shapes()
    assert shapes["qwen3-0.6b gate_up, 1440 tokens"] == (1440, 1024, 6144)
    assert shapes["qwen2.5-0.5b down, 100 beams"] == (100, 4864, 896)


def test_int8_kernel_matches_integer_reference():
    torch.manual_seed(0)
    x, w = torch.randint(-127, 128, (8, 64), dtype=torch.int8), torch.randint(-127, 128, (16, 64), dtype=torch.int8)
    y = peak.int8_linear(x, w)()
    assert torch.equal(y.float(), (x.long() @ w.long().t()).float())


def test_real_measurement_on_this_cpu(cache, monkeypatch):
    from engines.hardware import probe

    monkeypatch.setattr(peak, "gemm_shapes", lambda: {"small": (64, 128, 256), "tall": (256, 64, 128)})
    caps = probe("cpu")
    p = cpu_peaks(caps)
    assert set(p.rates) >= {"float32", "bfloat16"} and all(r > 0 for r in p.rates.values())
    assert ("float16" in p.rates) == caps.native("float16")
    assert ("int8" in p.rates) == (caps.int8_isa is not None)
    assert set(p.by_shape["float32"]) == {"small", "tall"}
    assert p.mfu_tflops == max(r for d, r in p.rates.items() if d != "int8")


def test_measured_with_malloc_held_as_the_engine_runs(monkeypatch):
    # no GEMM output is mapped afresh per call while the rates are measured (as in the
    # engine), and the setting is given back afterwards
    from engines.bounded.runtime import memory
    from engines.hardware import probe

    monkeypatch.delenv("BOUNDED_MALLOC", raising=False)
    monkeypatch.setattr(peak, "gemm_shapes", lambda: {"small": (32, 64, 64)})
    holders, real = [], peak._best_rate
    monkeypatch.setattr(peak, "_best_rate", lambda fn, flops, s: holders.append(memory._holders) or real(fn, flops, s))
    before = memory._holders
    peak.measure_cpu(probe("cpu"), 0.01)
    held = 0 if memory._mallopt() is None else 1  # glibc only
    assert holders and all(h == before + held for h in holders)
    assert memory._holders == before


def test_a_run_says_when_its_host_was_slower_than_the_cached_peak(cache):
    rates = {"float32": {peak.SPOT_SHAPE: 0.32}, "bfloat16": {peak.SPOT_SHAPE: 0.064}}
    p = cpu_peaks(ICE_LAKE, measure=lambda caps: rates)
    asked = []
    slow = p.checked("start", measure=lambda caps, dtype: asked.append(dtype) or 0.16).checked(
        "end", measure=lambda caps, dtype: 0.30)
    assert asked == ["float32"]  # the MFU precision's cached shape, measured again
    assert slow.mfu_tflops == p.mfu_tflops  # the denominator stays the cached peak
    (warning,) = slow.slow_host()
    assert "float32 2048 square GEMM at 50% of its cached rate at the run's start (160 vs 320 GFLOP/s" in warning
    checks = slow.to_json()["host_checks"]
    assert [(c["when"], c["tflops"], c["of_cached"]) for c in checks] == [("start", 0.16, 0.5),
                                                                          ("end", 0.30, pytest.approx(0.9375))]
    fair = p.checked("start", measure=lambda caps, dtype: 0.29)  # 91 %: within a shared machine's noise
    assert fair.slow_host() == [] and len(fair.checks) == 1


def test_no_host_check_without_a_cached_rate_to_compare(cache):
    no = lambda caps, dtype: pytest.fail("measured")  # noqa: E731
    assert device_peaks("cpu", caps=ICE_LAKE, override=0.5).checked("start", measure=no).checks == ()
    other = cpu_peaks(ZEN4, measure=lambda caps: ZEN4_RATES)  # no 2048-square entry
    assert other.checked("start", measure=no).checks == ()
    h200 = Capabilities("cuda", "NVIDIA H200", compute_capability=(9, 0))
    assert device_peaks("cuda", caps=h200).checked("start", measure=no).checks == ()


def test_the_host_check_measures_the_cached_shape_on_this_cpu(monkeypatch):
    monkeypatch.setattr(peak, "gemm_shapes", lambda: {peak.SPOT_SHAPE: (64, 128, 256)})
    assert peak.spot_rate(Capabilities("cpu", "this"), "float32", seconds=0.01) > 0
