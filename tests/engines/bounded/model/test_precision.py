"""The precision policy: `auto` for each kind of CPU (the capability probe injected, and the
real one), explicit choices, GEMM kinds as registrations, and what describe() says."""
from __future__ import annotations

import pytest
import torch

from engines.base import Bounds, EngineConfig
from engines.bounded import engine as engine_mod
from engines.bounded.model import precision
from engines.bounded.model.layers import Linear
from engines.bounded.model.precision import GEMM_KINDS, GemmKind, PrecisionPolicy, choose_dtype
from engines.bounded.options import BoundedOptions
from engines.hardware import cpu_gemm_gflops, probe
from tests.engines.test_hardware import AVX2_ONLY, HIDDEN_AMX, ICE_LAKE, SAPPHIRE, ZEN4

# GEMM rates (GFLOP/s) as measured on these CPUs (2 cores, torch 2.13): bf16 on AVX512-BF16
# without AMX is ~2.4x float32 on a Zen 4 and ~0.6x on an Emerald Rapids whose AMX is hidden
ZEN4_RATES = {"float32": 185.0, "bfloat16": 450.0, "float16": 0.0}
HIDDEN_AMX_RATES = {"float32": 300.0, "bfloat16": 175.0, "float16": 290.0}


@pytest.mark.parametrize("caps, requested, want", [
    (ZEN4, "bfloat16", "bfloat16"), (ICE_LAKE, "bfloat16", "float32"), (SAPPHIRE, "bfloat16", "bfloat16"),
    (ZEN4, "float16", "float32"), (SAPPHIRE, "float16", "float16"), (ICE_LAKE, "float32", "float32"),
])
def test_auto_keeps_native_dtypes_and_falls_back_to_float32(caps, requested, want):
    dtype, why = choose_dtype(requested, "auto", caps)
    assert dtype == want
    assert ("native on" if dtype == requested else "has no native") in why and caps.name in why


@pytest.mark.parametrize("caps, rates, requested, want", [
    (ZEN4, ZEN4_RATES, "bfloat16", "bfloat16"),
    (HIDDEN_AMX, HIDDEN_AMX_RATES, "bfloat16", "float32"),  # native, but 0.58x float32's rate
    (HIDDEN_AMX, HIDDEN_AMX_RATES, "float16", "float16"),  # 0.97x: half the bytes, kept
    (HIDDEN_AMX, {**HIDDEN_AMX_RATES, "bfloat16": 0.81 * 300}, "bfloat16", "bfloat16"),
])
def test_auto_weighs_measured_rates_where_flags_leave_speed_open(caps, rates, requested, want):
    asked = []
    dtype, why = choose_dtype(requested, "auto", caps, lambda ds: asked.append(ds) or {d: rates[d] for d in ds})
    assert dtype == want and asked == [(requested, "float32")]
    assert f"{rates[requested]:,.0f}" in why and f"{rates['float32']:,.0f}" in why
    assert ("slower than float32" in why) is (want == "float32")


def test_auto_trusts_amx_and_never_measures_an_explicit_choice():
    def refuse(dtypes):
        raise AssertionError("measured")
    assert choose_dtype("bfloat16", "auto", SAPPHIRE, refuse)[0] == "bfloat16"
    assert choose_dtype("bfloat16", "auto", ICE_LAKE, refuse)[0] == "float32"
    assert choose_dtype("bfloat16", "bfloat16", HIDDEN_AMX, refuse)[0] == "bfloat16"


def test_explicit_choice_wins_on_any_cpu():
    assert choose_dtype("bfloat16", "bfloat16", ICE_LAKE) == ("bfloat16", "bfloat16: chosen by the precision option")
    assert choose_dtype("bfloat16", "float32", ZEN4)[0] == "float32"


@pytest.mark.parametrize("caps, want", [(ICE_LAKE, "float32"), (ZEN4, "bfloat16")])
def test_engine_policy_with_the_probe_injected(caps, want, tiny_dir, monkeypatch):
    monkeypatch.setattr(engine_mod, "probe", lambda device: caps)
    monkeypatch.setattr(engine_mod, "cpu_gemm_gflops", lambda ds: {d: ZEN4_RATES[d] for d in ds})
    cfg = EngineConfig(tiny_dir, "bfloat16", "cpu", Bounds(), "prefill_only", {"compile": "eager", "int8": ["down"]})
    e = engine_mod.BoundedEngine(cfg)
    d = e.describe()
    assert d.dtype == "bfloat16" and d.precision.dtype == want and d.precision.low_precision
    assert d.precision.summary == f"{want} + int8 [down]" and d.details["precision_policy"]["gemm"]["down"] == "int8"
    assert d.precision.why.startswith(want)


def test_real_probe_policy_on_this_machine(tiny_dir):
    e = engine_mod.BoundedEngine(EngineConfig(tiny_dir, "bfloat16", "cpu", Bounds(), "prefill_only",
                                              {"compile": "eager"}))
    caps = probe("cpu")
    if not caps.native("bfloat16"):
        assert e.policy.dtype == "float32"
    elif "amx_bf16" in caps.flags:
        assert e.policy.dtype == "bfloat16"
    else:  # AVX512-BF16 alone: decided by the rates measured in this process
        rates = cpu_gemm_gflops(("bfloat16", "float32"))  # cached: what the engine measured
        fast = rates["bfloat16"] >= precision.HALF_VS_FLOAT32 * rates["float32"]
        assert e.policy.dtype == ("bfloat16" if fast else "float32") and "GFLOP/s measured" in e.policy.why


def test_cpu_gemm_rates_are_measured_once_per_process():
    rates = cpu_gemm_gflops(("bfloat16", "float32"))
    assert set(rates) == {"bfloat16", "float32"} and min(rates.values()) > 0
    assert cpu_gemm_gflops(("bfloat16", "float32")) is rates


def test_int8_groups_refused_on_a_gpu_and_fp8_on_a_cpu():
    p = PrecisionPolicy("bfloat16", gemm={"down": "int8"})
    assert "CPU path" in p.unsupported("cuda", ZEN4)
    assert p.unsupported("cpu", ZEN4) is None
    assert "compute capability" in PrecisionPolicy(gemm={"o": "fp8"}).unsupported("cpu", ZEN4)


def test_int8_groups_refused_on_a_cpu_without_vnni_or_amx():
    # oneDNN's int8 kernel there sums u8 x s8 pairs in saturating 16 bits (measured on Zen 3)
    p = PrecisionPolicy("float32", gemm={"down": "int8"})
    assert "VNNI or AMX" in p.unsupported("cpu", AVX2_ONLY)
    assert p.unsupported("cpu", ICE_LAKE) is None and p.unsupported("cpu", SAPPHIRE) is None


def test_unknown_kind_lists_the_registered_ones():
    with pytest.raises(ValueError, match="kinds are dense, fp8, int8"):
        PrecisionPolicy(gemm={"qkv": "int4"})


def test_a_new_gemm_kind_is_a_registration(monkeypatch):
    """How fp8 (or any kind) plugs in: register it; Linear and the policy take it as is."""
    calls = []
    kind = GemmKind("halved", lambda w: {"weight": w * 0.5},
                    lambda x, bias, weight: calls.append(1) or x @ weight.t(), lambda device, caps: None)
    monkeypatch.setitem(GEMM_KINDS, "halved", kind)
    policy = PrecisionPolicy("float32", gemm={"gate_up": "halved"})
    w = torch.randn(4, 3)
    lin = Linear.for_group("gate_up", w, None, policy)
    x = torch.randn(2, 3)
    assert torch.allclose(lin(x), x @ (0.5 * w).t()) and calls == [1]
    assert policy.low_precision_groups() == {"gate_up": "halved"}
    assert Linear.for_group("qkv", w, None, policy).kind == "dense"


def test_options_map_groups_to_kinds():
    o = BoundedOptions.parse({"int8": ["gate_up", "down", "head"], "precision": "float32"})
    assert o.gemm_kinds() == {"gate_up": "int8", "down": "int8", "head": "int8"}
    p = PrecisionPolicy("float32", gemm=o.gemm_kinds())
    assert p.summary() == "float32 + int8 [down, gate_up, head]"
    assert p.cache_tag() == "down=int8,gate_up=int8,o=dense,qkv=dense"  # the head is not in the graphs
    assert precision.PRECISION_MODES == ("auto", "bfloat16", "float32", "float16")



def test_int8_mlp_runs_its_middle_in_one_native_pass_with_the_same_result():
    # gate_up and down both int8 in bf16: scaling, SwiGLU and down's quantisation in
    # swiglu_quant_bf16; its result is the three-pass one's to within int8's step
    from engines.bounded.kernels import int8, native
    from engines.bounded.model.layers import GatedMLP

    if not native.load(log=lambda _: None):
        pytest.skip(f"native CPU kernels unavailable here: {native.status()}")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20, 64, generator=g).bfloat16()
    up, down = Linear(torch.randn(2 * 96, 64, generator=g) / 8, None, "int8"), Linear(torch.randn(64, 96, generator=g) / 10, None, "int8")
    mlp = GatedMLP(up, down)
    got = mlp(x)
    xq, xs = int8.quantise_rows(x)
    hq, hs = torch.ops.bounded_native.swiglu_quant_bf16(int8.int8_product(xq, up.weight, up.weight_scale, up.weight_zero, x.dtype), xs)
    assert torch.equal(got, int8.int8_linear_quantised(hq, hs, down.weight, down.weight_scale, down.weight_zero, None, x.dtype))
    h = up(x).float()
    three_passes = down((torch.nn.functional.silu(h[:, :96]) * h[:, 96:]).bfloat16())
    assert got.dtype == torch.bfloat16 and got.shape == (20, 64)
    assert (got.float() - three_passes.float()).norm() / three_passes.float().norm() < 0.02
    assert not mlp.takes_quantised(torch.float32)  # float32 keeps the graph's passes
