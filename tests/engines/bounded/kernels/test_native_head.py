"""The native fused beam head (csrc/beam_head.cpp) against torch: its logits against torch's
bf16 GEMM and float32, its top-k continuations against log_softmax + ban + top-k over the same
logits, and the choice of beams (select.next_beams) through HiddenRows against LogitRows."""
from __future__ import annotations

import math

import pytest
import torch

from engines.bounded.kernels import head, native, select


@pytest.fixture(scope="module")
def ops():
    if not native.load(log=lambda _: None):
        pytest.skip(f"native CPU kernels unavailable here: {native.status()}")
    return torch.ops.bounded_native


def _case(seed: int, rows: int, hidden: int, vocab: int):
    g = torch.Generator().manual_seed(seed)
    weight = (torch.randn(vocab, hidden, generator=g) * 0.3).bfloat16()
    x = torch.randn(rows, hidden, generator=g).bfloat16()
    return x, weight


@pytest.mark.parametrize("rows,hidden,vocab", [(1, 64, 1000), (13, 64, 777), (100, 96, 4099), (7, 896, 1536)])
def test_native_logits_are_the_bf16_gemm(ops, rows, hidden, vocab):
    x, weight = _case(rows + vocab, rows, hidden, vocab)
    got = ops.head_logits_bf16(x, ops.pack_head_bf16(weight), vocab)
    exact = x.double() @ weight.double().t()
    assert got.dtype == torch.bfloat16 and got.shape == (rows, vocab)
    # float32 sums rounded once to bf16: within one bf16 rounding of the exact product
    assert ((got.double() - exact).abs() <= exact.abs() * 2 ** -8 + 1e-3).all()
    mm = torch.mm(x, weight.t())
    assert (got != mm).float().mean() < 0.01  # torch's GEMM sums in another order, rarely another rounding


def _reference_top(logits: torch.Tensor, banned: list[int], cum: torch.Tensor, k: int):
    """cum + log_softmax(logits) with the banned ids -inf after it, the best k per request."""
    r, w = cum.shape
    logp = torch.log_softmax(logits.float(), -1)
    logp[:, banned] = -math.inf
    return (cum.reshape(-1, 1) + logp).view(r, -1).topk(k, -1)


@pytest.mark.parametrize("r,w,hidden,vocab,k", [(1, 100, 64, 5000, 100), (3, 7, 64, 1281, 7), (2, 1, 96, 700, 40),
                                                 (1, 4, 32, 129, 4)])
def test_native_top_k_is_the_exact_top_k_of_the_log_probabilities(ops, r, w, hidden, vocab, k):
    x, weight = _case(r * w + k, r * w, hidden, vocab)
    packed = ops.pack_head_bf16(weight)
    banned = [3, vocab - 1]
    cum = torch.randn(r, w, generator=torch.Generator().manual_seed(9)) * 2 - 5
    if w > 2:
        cum[0, w - 2:] = -math.inf  # dead beams: never chosen while live continuations remain
    scores, parents, tokens = native.beam_head_top(x, packed, vocab, torch.tensor(banned), cum, k)
    logits = ops.head_logits_bf16(x, packed, vocab)
    want, _ = _reference_top(logits, banned, cum, k)
    assert scores.shape == parents.shape == tokens.shape == (r, k)
    torch.testing.assert_close(scores, want, rtol=0, atol=2e-5)  # the same values, best first
    assert (scores[:, :-1] >= scores[:, 1:]).all()
    # each pick is the continuation its score says (ties may pick either of equal values)
    logp = torch.log_softmax(logits.float(), -1).view(r, w, vocab)
    again = cum.gather(1, parents) + logp[torch.arange(r)[:, None], parents, tokens]
    torch.testing.assert_close(scores, again, rtol=0, atol=2e-5)
    assert not torch.isin(tokens, torch.tensor(banned)).any()
    for q in range(r):  # distinct continuations within a request
        flat = (parents[q] * vocab + tokens[q]).tolist()
        assert len(set(flat)) == k


@pytest.mark.parametrize("rows,hidden,vocab,banned,late", [(100, 64, 5000, [0, 127, 128, 4999], 1),
                                                             (13, 96, 1203, [64], 40), (7, 896, 700, [], 1),
                                                             (1, 32, 129, [128], 40), (130, 64, 1000, [63, 64], 40)])
@pytest.mark.parametrize("form", ["bf16", "f32"])
def test_native_summary_is_the_log_sum_exp_and_block_maxima_of_the_logits(request, form, rows, hidden, vocab, banned,
                                                                          late):
    """Both heads' summaries (the float32 one group by group where its library is built for
    AVX-512, chunk by chunk on AVX2): two blocks of rows (130), banned ids at a group's edges,
    later columns far above the first ones (late = 40: the running reference moves)."""
    ops = request.getfixturevalue("ops" if form == "bf16" else "ops32")
    x, weight = _case(rows * 7 + vocab, rows, hidden, vocab) if form == "bf16" else _case32(rows * 7 + vocab, rows,
                                                                                               hidden, vocab)
    weight[vocab // 2:] *= late
    packed = getattr(ops, f"pack_head_{form}")(weight)
    lse, block_max = getattr(ops, f"head_gemm_summary_{form}")(x, packed, vocab, torch.tensor(banned, dtype=torch.int64))
    logits = getattr(ops, f"head_logits_{form}")(x, packed, vocab).double()  # the values the summary sees
    want = logits.logsumexp(-1)
    # float32 rounding of numbers the size of the lse (exp's own error: < 2e-7)
    torch.testing.assert_close(lse.double(), want, rtol=0, atol=1e-6 * max(1.0, want.abs().max().item()))
    kept = logits.clone()
    kept[:, banned] = -math.inf  # the log-softmax normalises over them; the choice never takes them
    blocks = -(-vocab // 128)
    want = torch.nn.functional.pad(kept, (0, blocks * 128 - vocab), value=-math.inf).view(rows, blocks, 128).amax(-1)
    assert torch.equal(block_max.double(), want)


@pytest.mark.parametrize("rows,hidden,vocab", [(100, 64, 40_000), (9, 96, 5_000), (3, 64, 700)])
def test_native_summary_is_the_same_on_one_thread_or_two(ops, rows, hidden, vocab):
    """The summary's partial sums are fixed slabs of the vocabulary's chunks (more chunks than
    slabs, fewer, one), merged in order, whichever thread took a slab: bit for bit the same
    log-sum-exp on any number of threads (a beam's score must not depend on how busy the
    host was)."""
    x, weight = _case(rows + vocab, rows, hidden, vocab)
    packed, banned = ops.pack_head_bf16(weight), torch.tensor([1, vocab - 2])
    threads = torch.get_num_threads()
    try:
        got = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            got.append(ops.head_gemm_summary_bf16(x, packed, vocab, banned))
    finally:
        torch.set_num_threads(threads)
    for lse, block_max in got[1:]:
        assert torch.equal(lse, got[0][0]) and torch.equal(block_max, got[0][1])


def test_native_top_k_of_only_dead_rows_is_minus_infinity(ops):
    x, weight = _case(1, 4, 64, 600)
    cum = torch.full((1, 4), -math.inf)
    scores, _, _ = native.beam_head_top(x, ops.pack_head_bf16(weight), 600, torch.tensor([0]), cum, 4)
    assert torch.isneginf(scores).all()


def test_native_head_refuses_what_it_cannot_compute(ops):
    x, weight = _case(2, 4, 64, 600)
    packed = ops.pack_head_bf16(weight)
    with pytest.raises(RuntimeError, match="packed weight does not match"):
        ops.head_logits_bf16(x[:, :32].contiguous(), packed, 600)
    with pytest.raises(RuntimeError, match="contiguous bf16"):
        ops.head_logits_bf16(x.float(), packed, 600)
    with pytest.raises(RuntimeError, match="cum must be float32"):
        native.beam_head_top(x, packed, 600, torch.tensor([0]), torch.zeros(1, 3), 2)
    with pytest.raises(RuntimeError, match="k must lie in"):
        native.beam_head_top(x, packed, 600, torch.tensor([0]), torch.zeros(1, 4), 600)


class _Fused:
    """The two calls HiddenRows makes of its head (runtime/beam_head.BeamHead), on the ops."""

    def __init__(self, ops, weight, banned):
        self.ops, self.packed, self.vocab, self.banned = ops, ops.pack_head_bf16(weight), weight.shape[0], banned

    def top(self, hidden, cum, k):
        return native.beam_head_top(hidden.contiguous(), self.packed, self.vocab, self.banned, cum, k)

    def logit_rows(self, hidden):
        x = self.ops.head_logits_bf16(hidden.contiguous(), self.packed, self.vocab)
        lse, block_max = head.logit_summary(x, head.ban_logits(x, self.banned), head.block_size(self.vocab))
        return head.LogitRows(x[:, None], lse[:, None], block_max[:, None], head.block_size(self.vocab))


def test_the_choice_of_beams_through_hidden_rows_is_the_one_through_logits(ops):
    r, w, hidden, vocab = 3, 6, 64, 1024
    x, weight = _case(5, r * w, hidden, vocab)
    banned = torch.tensor([7])
    fused = _Fused(ops, weight, banned)
    rows = head.HiddenRows(x.view(r * w, 1, hidden), vocab, fused).view(r, w)
    assert rows.shape == (r, w, vocab) and rows.requests(slice(0, 2)).shape == (2, w, vocab)
    cum = torch.randn(r, w) - 3
    nodes = torch.zeros(r, w, dtype=torch.int64)
    put = torch.tensor
    free = select.prepare_choice([None] * r, [w] * r, w, put)
    got = select.next_beams(rows, cum, nodes, free)
    want = select.next_beams(rows.materialise(), cum, nodes, free)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=2e-5)
    # a narrower request: its rows past its width are -inf either way
    narrow = select.prepare_choice([None] * r, [w, 2, w], w, put)
    got = select.next_beams(rows, cum, nodes, narrow)
    assert torch.isneginf(got[0][1, 2:]).all() and torch.isfinite(got[0][1, :2]).all()


# --- the float32 head (csrc/beam_head_f32.cpp, AVX2 + FMA) ---------------------------------


@pytest.fixture(scope="module")
def ops32():
    if not native.F32.load(log=lambda _: None):
        pytest.skip(f"native float32 kernels unavailable here: {native.F32.status()}")
    return torch.ops.bounded_native_f32


def _case32(seed: int, rows: int, hidden: int, vocab: int):
    x, weight = _case(seed, rows, hidden, vocab)
    return x.float() + torch.randn(rows, hidden) * 1e-3, weight.float()  # not bf16 values


@pytest.mark.parametrize("rows,hidden,vocab", [(1, 64, 1000), (13, 40, 777), (100, 96, 4099), (7, 896, 1536)])
def test_native_float32_logits_are_the_exact_product(ops32, rows, hidden, vocab):
    x, weight = _case32(rows + vocab, rows, hidden, vocab)
    got = ops32.head_logits_f32(x, ops32.pack_head_f32(weight), vocab)
    exact = x.double() @ weight.double().t()
    assert got.dtype == torch.float32 and got.shape == (rows, vocab)
    scale = x.double().abs() @ weight.double().abs().t()  # float32 sums over K: error ~ eps x this
    assert ((got.double() - exact).abs() <= scale * 1e-5).all()


@pytest.mark.parametrize("r,w,hidden,vocab,k", [(1, 100, 64, 5000, 100), (3, 7, 40, 1281, 7), (2, 1, 96, 700, 40),
                                                 (1, 4, 32, 129, 4)])
def test_native_float32_top_k_is_the_top_k_of_the_exact_log_probabilities(ops32, r, w, hidden, vocab, k):
    """Against cum + log_softmax of the exact (float64) logits, banned ids -inf after it: the
    same scores to float32 rounding, best first, each pick the continuation its score says."""
    x, weight = _case32(r * w + k, r * w, hidden, vocab)
    packed = ops32.pack_head_f32(weight)
    banned = [3, vocab - 1]
    cum = torch.randn(r, w, generator=torch.Generator().manual_seed(9)) * 2 - 5
    if w > 2:
        cum[0, w - 2:] = -math.inf
    scores, parents, tokens = native.beam_head_top(x, packed, vocab, torch.tensor(banned), cum, k)
    exact = x.double() @ weight.double().t()
    logp = torch.log_softmax(exact, -1)
    logp[:, banned] = -math.inf
    want = (cum.double().reshape(-1, 1) + logp).view(r, -1).topk(k, -1).values
    assert scores.dtype == torch.float32 and scores.shape == parents.shape == tokens.shape == (r, k)
    torch.testing.assert_close(scores.double(), want, rtol=0, atol=3e-5)
    again = cum.double().gather(1, parents) + logp.view(r, w, vocab)[torch.arange(r)[:, None], parents, tokens]
    torch.testing.assert_close(scores.double(), again, rtol=0, atol=3e-5)
    assert not torch.isin(tokens, torch.tensor(banned)).any()
    for q in range(r):
        assert len(set((parents[q] * vocab + tokens[q]).tolist())) == k
    # one thread or two: the same answer (each logit is summed over K in one order)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native.beam_head_top(x, packed, vocab, torch.tensor(banned), cum, k)
    finally:
        torch.set_num_threads(threads)
    # and the log-sum-exp too: its partial sums are fixed slabs of the vocabulary, not the threads' shares
    assert torch.equal(one[0], scores) and torch.equal(one[1], parents) and torch.equal(one[2], tokens)


def test_native_float32_head_refuses_what_it_cannot_compute(ops32):
    x, weight = _case32(2, 4, 64, 600)
    packed = ops32.pack_head_f32(weight)
    cum = torch.full((1, 4), -math.inf)
    assert torch.isneginf(native.beam_head_top(x, packed, 600, torch.tensor([0]), cum, 4)[0]).all()
    with pytest.raises(RuntimeError, match="packed weight does not match"):
        ops32.head_logits_f32(x[:, :32].contiguous(), packed, 600)
    with pytest.raises(RuntimeError, match="contiguous float32"):
        ops32.head_logits_f32(x.bfloat16(), packed, 600)
    with pytest.raises(RuntimeError, match="k must lie in"):
        native.beam_head_top(x, packed, 600, torch.tensor([0]), torch.zeros(1, 4), 600)


def test_a_float32_beam_head_fuses_and_its_choice_matches_the_exact_one(ops32):
    """runtime/beam_head.BeamHead on a float32 head: fused; the common choice through
    HiddenRows against the one through the exact log-probabilities (materialise), and a
    narrower request's rows past its width -inf."""
    from engines.bounded.model.precision import PrecisionPolicy
    from engines.bounded.runtime.beam_head import BeamHead

    r, w, hidden, vocab = 3, 6, 64, 1024
    x, weight = _case32(5, r * w, hidden, vocab)

    class Buffers:
        def head_views(self, rows):
            return torch.empty(rows, vocab), None

    bh = BeamHead(weight, torch.tensor([7]), Buffers(), PrecisionPolicy("float32"), r * w, None)
    assert bh.fused
    rows = bh(x).view(r, w)
    assert isinstance(rows, head.HiddenRows)
    exact = rows.materialise()
    assert isinstance(exact, torch.Tensor) and exact.shape == (r, w, vocab)
    want_logp = torch.log_softmax(x @ weight.t(), -1)
    want_logp[:, 7] = -math.inf
    torch.testing.assert_close(exact.view(r * w, vocab), want_logp, rtol=0, atol=1e-5)
    cum = torch.randn(r, w) - 3
    nodes = torch.zeros(r, w, dtype=torch.int64)
    free = select.prepare_choice([None] * r, [w] * r, w, torch.tensor)
    got = select.next_beams(rows, cum, nodes, free)
    want = select.next_beams(exact, cum, nodes, free)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=2e-5)
    narrow = select.prepare_choice([None] * r, [w, 2, w], w, torch.tensor)
    got = select.next_beams(rows, cum, nodes, narrow)
    assert torch.isneginf(got[0][1, 2:]).all() and torch.isfinite(got[0][1, :2]).all()
