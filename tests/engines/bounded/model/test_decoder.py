"""The bounded decoder (model/decoder.py via programs.prefill.ScorePrefill, eager) against
transformers."""
from __future__ import annotations

import random

import pytest
import torch

from engines.bounded.kernels.attention import ATTENTIONS
from engines.bounded.model.decoder import load_model
from engines.bounded.model.precision import PrecisionPolicy
from engines.bounded.programs.prefill import ScorePrefill
from engines.bounded.runtime.buffers import pack

from ..conftest import random_seqs, reference


def _scores(model_dir, dtype, seqs, labels, attention="per_sequence", policy=None):
    prog = ScorePrefill(load_model(model_dir, policy or PrecisionPolicy(dtype)), attention)
    with torch.no_grad():
        b = pack(seqs)
        return torch.softmax(prog(*b.varlen_args(), b.prefix, torch.tensor(labels)), -1)


@pytest.mark.parametrize("attention", [a for a in ATTENTIONS if a != "native"])  # padded: the GPU's, run here
def test_float32_matches_transformers(preset_dir, attention):
    rng = random.Random(0)
    seqs = random_seqs(rng, 16)
    labels = [rng.randrange(151936) for _ in range(3)]
    got = _scores(preset_dir, "float32", seqs, labels, attention)
    want = reference(preset_dir).scores(seqs, labels)
    assert (got - want).abs().max().item() < 1e-4
    assert torch.allclose(got.sum(-1), torch.ones(len(seqs)), atol=1e-5)


@pytest.mark.parametrize("preset, shape", [("tiny-hd32", {}), ("tiny-qwen2", {"hidden_size": 128})])
def test_native_attention_norms_and_rotates_qk_itself(tmp_path, monkeypatch, preset, shape):
    """bf16 with the native attention, where it fuses (head dim 32): the kernel norms (Qwen3's
    q/k norms; Qwen2 has none) and rotates q/k from the qkv projection itself, and scores as
    the unfused graph does and as float32 transformers within bf16's distance."""
    from engines.bounded.kernels import native
    from engines.bounded.kernels.native import NativeAttention
    from harness.workload.presets import PRESETS, write_model

    if not native.load(log=lambda _: None):
        pytest.skip(f"native CPU attention unavailable here: {native.status()}")
    model_dir = tmp_path / "model"
    write_model({**PRESETS[preset], **shape, "initializer_range": 0.1}, model_dir)
    rng = random.Random(1)
    seqs = random_seqs(rng, 12, 1, 200)
    labels = [rng.randrange(151936) for _ in range(3)]
    calls = []
    fused_call = NativeAttention.fused
    monkeypatch.setattr(NativeAttention, "fused", lambda self, *a: calls.append(1) or fused_call(self, *a))
    fused = _scores(model_dir, "bfloat16", seqs, labels, "native")
    assert len(calls) == 2  # every layer
    monkeypatch.setattr(NativeAttention, "fuses", staticmethod(lambda *a: False))
    unfused = _scores(model_dir, "bfloat16", seqs, labels, "native")
    want = reference(model_dir).scores(seqs, labels)
    fused_err, unfused_err = ((x - want).abs().max().item() for x in (fused, unfused))
    # one rounding of q/k after norm and RoPE (the eager unfused ops round after each)
    assert fused_err < 2e-2 and fused_err <= 1.5 * unfused_err + 2e-3, (fused_err, unfused_err)


def test_int8_qkv_product_goes_to_the_fused_attention_with_its_row_scales(monkeypatch):
    """A bf16 plan with int8 qkv and the native fused attention (head dim 32, Qwen3: no qkv
    bias): every layer hands the kernel the int8 product and its rows' scales, and the scores
    are bit for bit those of scaling the product in the graph first."""
    from engines.bounded.kernels import native
    from engines.bounded.kernels.native import NativeAttention
    from engines.bounded.model.decoder import DecoderLayer
    from harness.workload.presets import materialise

    if not native.load(log=lambda _: None):
        pytest.skip(f"native CPU attention unavailable here: {native.status()}")
    model_dir = materialise("tiny-hd32", log=lambda s: None)
    policy = PrecisionPolicy("bfloat16", gemm={"qkv": "int8"})
    rng = random.Random(2)
    seqs = random_seqs(rng, 8, 1, 120)
    labels = [rng.randrange(151936) for _ in range(3)]
    scales = []
    fused_call = NativeAttention.fused
    def fused(self, *args, row_scale=None):
        scales.append(row_scale)
        return fused_call(self, *args, row_scale=row_scale)

    monkeypatch.setattr(NativeAttention, "fused", fused)
    folded = _scores(model_dir, "bfloat16", seqs, labels, "native", policy)
    assert len(scales) == 2 and all(s is not None and s.dtype == torch.float32 for s in scales)
    monkeypatch.setattr(DecoderLayer, "quantises_input", lambda self, dtype: False)
    scales.clear()
    in_graph = _scores(model_dir, "bfloat16", seqs, labels, "native", policy)
    assert len(scales) == 2 and all(s is None for s in scales)
    assert torch.equal(folded, in_graph)


@pytest.mark.parametrize("int8_groups", [[], ["qkv", "o", "gate_up", "down"]])
def test_fused_layers_add_and_norm_in_one_native_pass(monkeypatch, int8_groups):
    """The fused layer loop (bf16, native attention; tiny-hd32): every residual add but the
    last goes with the norm after it into csrc/norms.cpp -- quantised there for int8 GEMMs,
    the o GEMM's input quantised natively too -- and the scores are those of the graph's form
    of the same passes to within a rounding."""
    from engines.bounded.kernels import native, norms
    from harness.workload.presets import materialise

    if not native.load(log=lambda _: None):
        pytest.skip(f"native CPU kernels unavailable here: {native.status()}")
    model_dir = materialise("tiny-hd32", log=lambda s: None)
    policy = PrecisionPolicy("bfloat16", gemm={g: "int8" for g in int8_groups})
    rng = random.Random(3)
    seqs = random_seqs(rng, 8, 1, 120)
    labels = [rng.randrange(151936) for _ in range(3)]
    namespace, calls = torch.ops.bounded_native, []

    class Counting:
        def __getattr__(self, name):
            calls.append(name)
            return getattr(namespace, name)

    monkeypatch.setattr(torch.ops, "bounded_native", Counting(), raising=False)
    folded = _scores(model_dir, "bfloat16", seqs, labels, "native", policy)
    layers = 2
    if int8_groups:
        assert calls.count("add_rms_norm_quant_bf16") == 2 * layers - 1 and "add_rms_norm_bf16" not in calls
        assert calls.count("quantise_rows_bf16") == 1 + layers  # the first input norm's, each o input
    else:
        assert calls.count("add_rms_norm_bf16") == 2 * layers - 1 and "quantise_rows_bf16" not in calls
    monkeypatch.setattr(norms, "_native", lambda *a: False)
    graph = _scores(model_dir, "bfloat16", seqs, labels, "native", policy)
    # (bit for bit here; a sum of squares in another order may flip a rounding)
    assert (folded.log() - graph.log()).abs().max().item() < 2e-2
