"""The packed attention kernels against one SDPA per sequence (and per concatenation for a
query's items), and their side effects on the process: the varlen attention's
single-threaded workers must not make threads started later single-threaded too."""
from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engines.bounded.kernels import attention as kernels
from engines.bounded.kernels import native
from engines.bounded.runtime.buffers import pack


def test_varlen_workers_leave_other_threads_their_thread_count():
    before = torch.get_num_threads()
    q, k, v = torch.randn(40, 4, 8), torch.randn(40, 2, 8), torch.randn(40, 2, 8)
    spans = [(0, 20), (20, 33), (33, 40)]  # several sequences: shared out to the workers
    kernels.varlen_attention_cpu(q, k, v, spans)
    later = []
    t = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
    t.start()
    t.join()
    assert later == [before] and torch.get_num_threads() == before
    if before > 1:  # the workers themselves stay single-threaded
        assert set(kernels._workers(min(before, len(spans))).map(lambda _: torch.get_num_threads(), range(4))) == {1}


def test_packed_attention_kernels_agree():
    torch.manual_seed(0)
    lengths = [5, 1, 17, 9]
    t = sum(lengths)
    q, k, v = torch.randn(t, 4, 8), torch.randn(t, 2, 8), torch.randn(t, 2, 8)
    b = pack([[0] * n for n in lengths])
    padded = kernels.packed_attention_padded(q, k, v, b.pad_index, b.unpad_index)
    loop = packed_attention_loop(q, k, v, list(b.spans))
    varlen = kernels.varlen_attention(q, k, v, b.cu_seqlens)
    for kind in set(kernels.ATTENTIONS) - {"native"}:  # what the programs call, by kind (padded: the GPU's)
        attend = kernels.packed_attention(kind, b.cu_seqlens, b.pad_index, b.unpad_index)
        assert torch.allclose(attend(q, k, v), loop, atol=1e-5), kind
    assert torch.allclose(padded, loop, atol=1e-5)
    assert torch.allclose(varlen, loop, atol=1e-5)
    with pytest.raises(ValueError, match="choose one of per_sequence, padded, dense, native"):
        kernels.packed_attention("flash", b.cu_seqlens, b.pad_index, b.unpad_index)
    # each sequence alone: attention never crosses a sequence boundary
    s, e = b.spans[2]
    alone = packed_attention_loop(q[s:e], k[s:e], v[s:e], [(0, e - s)])
    assert torch.allclose(padded[s:e], alone, atol=1e-5)


def packed_attention_loop(q, k, v, spans):
    """The reference: one causal SDPA per sequence of the packed rows, spans = [(start, end)]."""
    out = torch.empty(q.shape[0], q.shape[1] * q.shape[2], dtype=q.dtype, device=q.device)
    for start, end in spans:
        qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))  # [H, n, D]
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
        out[start:end] = o.transpose(0, 1).reshape(end - start, -1)
    return out


def concatenation_reference(q, k, v, spans, prefix):
    """Each sequence by one causal SDPA in float64 over its prefix's rows then its own: what
    scoring the concatenation query + item computes for the item's rows."""
    out = torch.empty(q.shape[0], q.shape[1], q.shape[2], dtype=torch.float64)
    for i, (s, e) in enumerate(spans):
        rows = torch.arange(s, e)
        if prefix[i] >= 0:
            rows = torch.cat([torch.arange(*spans[prefix[i]]), rows])
        qs, ks, vs = (t[rows].transpose(0, 1).double() for t in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True).transpose(0, 1)
        out[s:e] = o[len(rows) - (e - s):]
    return out.reshape(q.shape[0], -1)


def random_batch(rng, hq, hkv, d, dtype):
    """Plain sequences and queries (1-300 tokens) with 1-32 items (1-200 tokens), mixed."""
    lengths, prefix = [], []
    for _ in range(rng.randint(1, 3)):
        query = len(lengths)
        lengths.append(rng.randint(1, 300))
        prefix.append(-1)
        if rng.random() < 0.25:
            continue  # a plain sequence
        for _ in range(rng.randint(1, 32)):
            lengths.append(rng.randint(1, 200))
            prefix.append(query)
    b = pack([[0] * n for n in lengths], prefix=prefix)
    t = b.num_tokens
    q, k = (torch.randn(t, h, d).mul(2).to(dtype) for h in (hq, hkv))
    return b, q, k, torch.randn(t, hkv, d).to(dtype)


@pytest.mark.parametrize("hq, hkv, d", [(4, 2, 16), (14, 2, 64), (16, 8, 128)])
def test_items_attend_to_their_query_as_their_concatenation_would(hq, hkv, d):
    rng = random.Random(hq)
    torch.manual_seed(hq)
    for _ in range(3):
        b, q, k, v = random_batch(rng, hq, hkv, d, torch.float32)
        want = concatenation_reference(q, k, v, b.spans, b.prefix.tolist())
        got = kernels.varlen_attention(q, k, v, b.cu_seqlens, b.prefix)
        plain = kernels.varlen_attention(q, k, v, b.cu_seqlens)  # float32 rounding, no prefix
        plain_err = (plain.double() - concatenation_reference(q, k, v, b.spans, [-1] * b.num_seqs)).abs().max()
        # within float32 rounding of the exact answer, like the plain op
        assert (got.double() - want).abs().max() < max(2e-5, 4 * plain_err)


@pytest.mark.parametrize("hq, hkv, d", [(4, 2, 16), (14, 2, 64)])
def test_padded_view_of_items_is_their_concatenation(hq, hkv, d):
    """The padded (GPU) attention shares a query through the packer's indices alone."""
    rng = random.Random(hq + 1)
    torch.manual_seed(hq)
    for _ in range(3):
        b, q, k, v = random_batch(rng, hq, hkv, d, torch.float32)
        want = concatenation_reference(q, k, v, b.spans, b.prefix.tolist())
        got = kernels.packed_attention_padded(q, k, v, b.pad_index, b.unpad_index)
        assert (got.double() - want).abs().max() < 2e-5
        dense = kernels.packed_attention_dense(q, k, v, b.pad_index, b.unpad_index)
        assert (dense.double() - want).abs().max() < 2e-5


def test_bfloat16_items_stay_close_and_no_prefix_is_the_plain_op():
    rng = random.Random(7)
    b, q, k, v = random_batch(rng, 4, 2, 16, torch.bfloat16)
    want = concatenation_reference(q, k, v, b.spans, b.prefix.tolist())
    assert (kernels.varlen_attention(q, k, v, b.cu_seqlens, b.prefix).double() - want).abs().max() < 5e-2
    none = torch.full_like(b.prefix, -1)
    assert torch.equal(kernels.varlen_attention(q, k, v, b.cu_seqlens, none),
                       kernels.varlen_attention(q, k, v, b.cu_seqlens))


@pytest.mark.parametrize("prefix, msg", [([-1, 0, -1, 0], "must follow it back to back"),
                                         ([1, -1, -1, -1], "must be an earlier sequence"),
                                         ([-1, 0, 1, -1], "must be an earlier sequence without a prefix")])
def test_malformed_prefixes_are_refused(prefix, msg):
    b = pack([[0] * 3] * 4)
    q, k, v = torch.randn(12, 4, 8), torch.randn(12, 2, 8), torch.randn(12, 2, 8)
    with pytest.raises(ValueError, match=msg):
        kernels.varlen_attention_cpu(q, k, v, list(b.spans), prefix)


def test_one_querys_items_are_shared_out_to_the_workers():
    from engines.bounded.kernels.query_attention import attention_units

    spans = [(0, 30)] + [(30 + 10 * i, 40 + 10 * i) for i in range(7)] + [(100, 120)]
    units = attention_units(spans, [-1] + [0] * 7 + [-1], parts=2)
    own = [u for u in units if u.own]
    runs = [u.items for u in units if u.items]
    assert [u.span for u in own] == [(0, 30), (100, 120)] and all(not u.items for u in own)
    assert len(runs) == 2 and [s for run in runs for s in run] == spans[1:8]  # every item once, in order
    assert abs(len(runs[0]) - len(runs[1])) <= 1


def test_auto_attention_by_device_and_batch():
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert kernels.attention_for(cpu) == "per_sequence"  # scoring: many samples of unequal lengths
    assert kernels.attention_for(cpu, kernels.FEW_SEQUENCES) == "padded"  # a beam batch's prompts
    assert kernels.attention_for(cpu, kernels.FEW_SEQUENCES + 1) == "per_sequence"
    assert kernels.attention_for(cpu, None, kernels.SHORT_SEQUENCES) == "dense"  # many short samples
    assert kernels.attention_for(cpu, 1, kernels.SHORT_SEQUENCES) == "dense"
    assert kernels.attention_for(cpu, None, kernels.SHORT_SEQUENCES + 1) == "per_sequence"
    assert kernels.attention_for(gpu) == kernels.attention_for(gpu, 1) == "padded"
    # where the native kernel serves, it on every batch shape; a GPU stays padded
    assert kernels.attention_for(cpu, 1, kernels.SHORT_SEQUENCES, native=True) == "native"
    assert kernels.attention_for(cpu, None, None, native=True) == "native"
    assert kernels.attention_for(gpu, native=True) == "padded"


@pytest.fixture(scope="module")
def native_kernel():
    if not native.load(log=lambda _: None):
        pytest.skip(f"native CPU attention unavailable here: {native.status()}")
    return torch.ops.bounded_native.varlen_attention_bf16


@pytest.mark.parametrize("hq, hkv, d", [(4, 2, 32), (14, 2, 64), (16, 8, 128), (2, 2, 16)])
def test_native_bf16_attention_is_as_close_as_the_python_one(native_kernel, hq, hkv, d):
    """The native body against the exact (float64) concatenations: within the bf16 Python
    body's own distance, on random batches of plain sequences and queries with items
    (1-300 tokens, blocks of 64 rows cut mid-sequence)."""
    rng = random.Random(d + hq)
    torch.manual_seed(d)
    for _ in range(3):
        b, q, k, v = random_batch(rng, hq, hkv, d, torch.bfloat16)
        want = concatenation_reference(q, k, v, b.spans, b.prefix.tolist())
        got = native_kernel(q, k, v, b.cu_seqlens, b.prefix)
        python = kernels.varlen_attention_cpu(q, k, v, list(b.spans), b.prefix.tolist())
        err, python_err = ((x.double() - want).abs() for x in (got, python))
        assert got.dtype == torch.bfloat16 and got.shape == python.shape
        assert err.max() <= 2 * python_err.max() and err.mean() <= 1.5 * python_err.mean()


def test_native_attention_is_the_ops_body_and_independent_of_threads(native_kernel):
    rng = random.Random(3)
    b, q, k, v = random_batch(rng, 16, 8, 128, torch.bfloat16)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernels.varlen_attention(q, k, v, b.cu_seqlens, b.prefix)
        torch.set_num_threads(2)
        two = native_kernel(q, k, v, b.cu_seqlens, b.prefix)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)  # each block is one thread's, whichever
    # no prefix: the plain causal attention of each sequence
    plain = native_kernel(q, k, v, b.cu_seqlens, None)
    want = packed_attention_loop(q.double(), k.double(), v.double(), list(b.spans))
    assert (plain.double() - want).abs().max() < 5e-2
    # float32: the float32 kernel where it is loaded, else the Python body
    q32, k32, v32 = q.float(), k.float(), v.float()
    body = (torch.ops.bounded_native_f32.varlen_attention_f32(q32, k32, v32, b.cu_seqlens, b.prefix)
            if native.F32.available() else kernels.varlen_attention_cpu(q32, k32, v32, list(b.spans), b.prefix.tolist()))
    assert torch.equal(kernels.varlen_attention(q32, k32, v32, b.cu_seqlens, b.prefix), body)


AMX_DOTS = """
import sys, torch
from engines.bounded.kernels import native
native.load(log=lambda _: None)
x = torch.load(sys.argv[1])
assert not torch.ops.bounded_native.attention_uses_amx(x["q"].shape[-1]), "BOUNDED_ATTENTION_AMX=0 ignored"
torch.save(torch.ops.bounded_native.varlen_attention_bf16(x["q"], x["k"], x["v"], x["cu"], x["prefix"]), sys.argv[2])
"""


def test_native_attention_on_amx_tiles_is_the_dot_products_up_to_summation_order(native_kernel, tmp_path):
    """Where the CPU has AMX the attention's products run on tiles; a process told
    BOUNDED_ATTENTION_AMX=0 runs the AVX512-BF16 dot products. The same outputs, but for the
    few that a float32 sum in another order rounds the other way."""
    if not torch.ops.bounded_native.attention_uses_amx(128):
        pytest.skip("the attention runs on no AMX tiles on this CPU")
    rng = random.Random(5)
    b, q, k, v = random_batch(rng, 16, 8, 128, torch.bfloat16)
    torch.save({"q": q, "k": k, "v": v, "cu": b.cu_seqlens, "prefix": b.prefix}, tmp_path / "in.pt")
    root = Path(__file__).resolve().parents[4]
    subprocess.run([sys.executable, "-c", AMX_DOTS, str(tmp_path / "in.pt"), str(tmp_path / "out.pt")], cwd=root,
                   env={**os.environ, "BOUNDED_ATTENTION_AMX": "0"}, check=True, timeout=300)
    dots, tiles = torch.load(tmp_path / "out.pt"), native_kernel(q, k, v, b.cu_seqlens, b.prefix)
    # a score summed in another order may round its probability the other way: an output then
    # moves by about a bf16 step of itself, or of the values it sums (~0.5 here) where it is small
    assert torch.allclose(tiles.float(), dots.float(), rtol=2.0 ** -7, atol=2.0 ** -8)
    assert (tiles != dots).float().mean().item() < 0.01


@pytest.fixture(scope="module")
def f32_kernel():
    if not native.F32.load(log=lambda _: None):
        pytest.skip(f"native float32 attention unavailable here: {native.F32.status()}")
    return torch.ops.bounded_native_f32.varlen_attention_f32


@pytest.mark.parametrize("hq, hkv, d", [(4, 2, 32), (14, 2, 64), (16, 8, 128), (2, 2, 16), (3, 1, 24), (6, 2, 48),
                                       (2, 1, 80)])
def test_native_float32_attention_is_the_exact_one_to_float32_rounding(f32_kernel, hq, hkv, d):
    """The float32 kernel (AVX2 + FMA; 32-column GEMM panels on AVX-512) against the exact
    (float64) concatenations, on random batches of plain sequences and queries with items
    (1-300 tokens, blocks cut mid-sequence; head dims that are not multiples of 16 included,
    and 48 and 80, whose rows end in a 16-column panel after the 32-column ones), and as
    the op's body."""
    rng = random.Random(d + hq + 1)
    torch.manual_seed(d + 1)
    for _ in range(3):
        b, q, k, v = random_batch(rng, hq, hkv, d, torch.float32)
        want = concatenation_reference(q, k, v, b.spans, b.prefix.tolist())
        got = f32_kernel(q, k, v, b.cu_seqlens, b.prefix)
        python = kernels.varlen_attention_cpu(q, k, v, list(b.spans), b.prefix.tolist())
        assert got.dtype == torch.float32 and got.shape == python.shape
        err, python_err = ((x.double() - want).abs().max().item() for x in (got, python))
        assert err < 5e-5 and err <= 4 * python_err + 1e-6, (err, python_err)
        assert torch.equal(kernels.varlen_attention(q, k, v, b.cu_seqlens, b.prefix), got)
    plain = f32_kernel(q, k, v, b.cu_seqlens, None)  # no prefix: each sequence's own causal attention
    ref = packed_attention_loop(q.double(), k.double(), v.double(), list(b.spans))
    assert (plain.double() - ref).abs().max() < 5e-5
    with pytest.raises(RuntimeError, match="float32 q/k/v only"):
        f32_kernel(q.bfloat16(), k.bfloat16(), v.bfloat16(), b.cu_seqlens, b.prefix)


@pytest.mark.parametrize("norms", [True, False])  # Qwen3's q/k norms; Qwen2 has none
@pytest.mark.parametrize("hq, hkv, d", [(8, 2, 64), (4, 2, 32), (16, 8, 128), (6, 2, 48)])  # 48: half a row 24 wide
def test_native_float32_attention_norms_and_rotates_the_projection_itself(f32_kernel, norms, hq, hkv, d):
    """The float32 fused entry on a qkv projection against the exact concatenations (float64)
    of q/k normed and rotated in float64 by torch: queries with items included, positions
    continuing each query's."""
    from engines.bounded.kernels import dense

    rng = random.Random(13 + d)
    b, _, _, _ = random_batch(rng, hq, hkv, d, torch.float32)
    t = b.num_tokens
    torch.manual_seed(13)
    qkv = torch.randn(t, (hq + 2 * hkv) * d)
    qw, kw = ((torch.rand(d) + 0.5) for _ in range(2)) if norms else (None, None)
    cos, sin = dense.rope_tables(dense.rope_inv_freq(d, 1e6), 1024)
    pos = b.positions

    def prep(x, w):
        x = x.double()
        if w is not None:
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
        return x * cos[pos].double()[:, None] + dense.rotate_half(x) * sin[pos].double()[:, None]

    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], -1)
    q, k, v = prep(q.reshape(t, hq, d), qw), prep(k.reshape(t, hkv, d), kw), v.reshape(t, hkv, d).double()
    want = concatenation_reference(q, k, v, b.spans, b.prefix.tolist())
    got = torch.ops.bounded_native_f32.varlen_attention_rope_f32(qkv, hq, hkv, qw, kw, 1e-6, cos, sin, pos,
                                                                 b.cu_seqlens, b.prefix)
    assert got.dtype == torch.float32 and got.shape == (t, hq * d)
    assert (got.double() - want).abs().max().item() < 5e-5
    plain = f32_kernel(q.float(), k.float(), v.float(), b.cu_seqlens, b.prefix)  # the same, q/k prepared apart
    assert torch.allclose(got, plain, atol=2e-5, rtol=1e-4)
    with pytest.raises(RuntimeError, match="outside the tables"):
        torch.ops.bounded_native_f32.varlen_attention_rope_f32(qkv, hq, hkv, qw, kw, 1e-6, cos[:10], sin[:10], pos,
                                                               b.cu_seqlens, b.prefix)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        torch.ops.bounded_native_f32.varlen_attention_rope_f32(qkv[:, :(hq + 2 * hkv) * 8], hq, hkv, None, None, 1e-6,
                                                               cos[:, :8], sin[:, :8], pos, b.cu_seqlens, b.prefix)
    with pytest.raises(RuntimeError, match="float32"):
        torch.ops.bounded_native_f32.varlen_attention_rope_f32(qkv.bfloat16(), hq, hkv, None, None, 1e-6, cos, sin, pos,
                                                               b.cu_seqlens, b.prefix)


def test_the_native_kind_calls_the_float32_kernel_and_exports_it(f32_kernel):
    rng = random.Random(8)
    b, q, k, v = random_batch(rng, 4, 2, 32, torch.float32)
    attend = kernels.packed_attention("native", b.cu_seqlens, b.pad_index, b.unpad_index, b.prefix)
    assert torch.equal(attend(q, k, v), f32_kernel(q, k, v, b.cu_seqlens, b.prefix))

    class Attend(torch.nn.Module):
        def forward(self, q, k, v, cu_seqlens, prefix):
            return kernels.packed_attention("native", cu_seqlens, None, None, prefix)(q, k, v)

    graph = torch.export.export(Attend(), (q, k, v, b.cu_seqlens, b.prefix)).graph
    calls = [n.target for n in graph.nodes if n.op == "call_function"]
    assert calls == [torch.ops.bounded_native_f32.varlen_attention_f32.default]


def test_the_native_kind_calls_the_kernel_and_exports_it(native_kernel):
    """attention "native": the programs' attend calls the C++ op itself, which torch.export
    keeps as one node (its fake gives the output's shape)."""
    rng = random.Random(7)
    b, q, k, v = random_batch(rng, 4, 2, 32, torch.bfloat16)
    attend = kernels.packed_attention("native", b.cu_seqlens, b.pad_index, b.unpad_index, b.prefix)
    assert torch.equal(attend(q, k, v), native_kernel(q, k, v, b.cu_seqlens, b.prefix))

    class Attend(torch.nn.Module):
        def forward(self, q, k, v, cu_seqlens, prefix):
            return kernels.packed_attention("native", cu_seqlens, None, None, prefix)(q, k, v)

    graph = torch.export.export(Attend(), (q, k, v, b.cu_seqlens, b.prefix)).graph
    calls = [n.target for n in graph.nodes if n.op == "call_function"]
    assert calls == [torch.ops.bounded_native.varlen_attention_bf16.default]


def test_native_kind_is_refused_where_the_kernel_is_not_loaded(monkeypatch):
    monkeypatch.setattr(native.BF16, "_state", {"error": "this CPU has no AVX512-BF16"})
    monkeypatch.setattr(native.F32, "_state", {"error": "this CPU has no AVX2 and FMA"})
    with pytest.raises(ValueError, match="needs a native CPU kernel \\(this CPU has no AVX512-BF16; this CPU has no AVX2"):
        kernels.packed_attention("native", torch.tensor([0, 4]), None, None)


@pytest.mark.parametrize("norms", [True, False])  # Qwen3's q/k norms; Qwen2 has none
def test_native_attention_norms_and_rotates_the_projection_itself(native_kernel, norms):
    """The fused entry on a qkv projection against q/k normed and rotated in float32 by torch
    and rounded once, then the plain entry: the same up to the rounding of a few q/k elements,
    queries with items included."""
    from engines.bounded.kernels import dense

    rng = random.Random(11)
    hq, hkv, d = 8, 2, 64
    b, _, _, _ = random_batch(rng, hq, hkv, d, torch.bfloat16)
    t = b.num_tokens
    torch.manual_seed(11)
    qkv = torch.randn(t, (hq + 2 * hkv) * d).bfloat16()
    qw, kw = ((torch.rand(d) + 0.5).bfloat16() for _ in range(2)) if norms else (None, None)
    cos, sin = (x.bfloat16() for x in dense.rope_tables(dense.rope_inv_freq(d, 1e6), 1024))
    pos = b.positions

    def prep(x, w):
        xf = x.float()
        if w is not None:
            xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
        return (xf * cos[pos].float()[:, None] + dense.rotate_half(xf) * sin[pos].float()[:, None]).bfloat16()

    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], -1)
    q, k, v = prep(q.reshape(t, hq, d), qw), prep(k.reshape(t, hkv, d), kw), v.reshape(t, hkv, d)
    want = native_kernel(q, k, v, b.cu_seqlens, b.prefix)
    got = torch.ops.bounded_native.varlen_attention_rope_bf16(qkv, hq, hkv, qw, kw, 1e-6, cos, sin, pos,
                                                              b.cu_seqlens, b.prefix)
    # the norm's sum in another order than torch's: a q/k element may round the other way
    differ = (got != want).float().mean().item()
    assert differ < 0.02 and torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2), differ
    with pytest.raises(RuntimeError, match="outside the tables"):
        torch.ops.bounded_native.varlen_attention_rope_bf16(qkv, hq, hkv, qw, kw, 1e-6, cos[:10], sin[:10], pos,
                                                            b.cu_seqlens, b.prefix)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        torch.ops.bounded_native.varlen_attention_rope_bf16(qkv[:, :(hq + 2 * hkv) * 16], hq, hkv, None, None, 1e-6,
                                                            cos[:, :16], sin[:, :16], pos, b.cu_seqlens, b.prefix)


@pytest.mark.parametrize("hq, hkv, d", [(8, 2, 64), (16, 8, 128)])
def test_native_fused_attention_scales_an_int8_products_rows_as_the_graph_did(native_kernel, hq, hkv, d):
    """row_scale: the fused entry on an int8 GEMM's product and its rows' scales gives, bit
    for bit, what it gives on the product scaled and rounded to bf16 first (the graph's pass
    it replaces), queries with items included; a scale of the wrong length is refused."""
    from engines.bounded.kernels import dense

    rng = random.Random(hq + d)
    b, _, _, _ = random_batch(rng, hq, hkv, d, torch.bfloat16)
    t = b.num_tokens
    torch.manual_seed(d)
    product = (torch.randn(t, (hq + 2 * hkv) * d) * 40).bfloat16()
    scale = torch.rand(t, 1) * 0.02 + 1e-3
    qw, kw = ((torch.rand(d) + 0.5).bfloat16() for _ in range(2))
    cos, sin = (x.bfloat16() for x in dense.rope_tables(dense.rope_inv_freq(d, 1e6), 1024))
    op = torch.ops.bounded_native.varlen_attention_rope_bf16
    want = op((product.float() * scale).bfloat16(), hq, hkv, qw, kw, 1e-6, cos, sin, b.positions, b.cu_seqlens,
              b.prefix)
    got = op(product, hq, hkv, qw, kw, 1e-6, cos, sin, b.positions, b.cu_seqlens, b.prefix, scale)
    assert torch.equal(got, want)
    assert not torch.equal(op(product, hq, hkv, qw, kw, 1e-6, cos, sin, b.positions, b.cu_seqlens, b.prefix), want)
    with pytest.raises(RuntimeError, match="one per row"):
        op(product, hq, hkv, qw, kw, 1e-6, cos, sin, b.positions, b.cu_seqlens, b.prefix, scale[1:])


def test_native_attention_reads_views_of_a_fused_projection(native_kernel):
    """q/k/v as the model makes them: column slices of one [T, (Hq + 2 Hkv) D] projection,
    rows further apart than their width."""
    rng = random.Random(5)
    b, q, k, v = random_batch(rng, 8, 2, 64, torch.bfloat16)
    fused = torch.cat([x.reshape(x.shape[0], -1) for x in (q, k, v)], dim=1)
    qv, kv, vv = (t.view(t.shape[0], -1, 64) for t in fused.split([8 * 64, 2 * 64, 2 * 64], dim=1))
    assert not qv.is_contiguous() and qv.stride(0) == fused.shape[1]
    assert torch.equal(native_kernel(qv, kv, vv, b.cu_seqlens, b.prefix), native_kernel(q, k, v, b.cu_seqlens, b.prefix))


def test_native_kernel_refuses_what_it_cannot_serve(native_kernel):
    q, k, v = torch.randn(12, 4, 32).bfloat16(), torch.randn(12, 2, 32).bfloat16(), torch.randn(12, 2, 32).bfloat16()
    with pytest.raises(RuntimeError, match="cu_seqlens must end at T"):
        native_kernel(q, k, v, torch.tensor([0, 5, 11]), None)
    with pytest.raises(RuntimeError, match="must be an earlier sequence without a prefix"):
        native_kernel(q, k, v, torch.tensor([0, 4, 8, 12]), torch.tensor([-1, 0, 1]))
    with pytest.raises(RuntimeError, match="bfloat16"):
        native_kernel(q.float(), k.float(), v.float(), torch.tensor([0, 12]), None)
