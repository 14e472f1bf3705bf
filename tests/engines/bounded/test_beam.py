"""Bounded beam search (eager runner) against transformers `generate`, and its kernels
against plain reference computations."""
from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F

from engines.bounded import beam
from engines.bounded.beam_runtime import BeamJob
from engines.bounded.constraints import build_trie

from .beam_reference import assert_same_beams, hf_beams, overlap, runner
from .conftest import VOCAB

# (beam width, decode steps, prompt tokens): every width in {1, 4, 37, 100, 400}, every step
# count in {1, 2, 4, 5} and prompts from 1 to 500 tokens, for each model family
CASES = [(1, 5, 1), (4, 1, 500), (4, 4, 2), (37, 4, 100), (100, 2, 500), (100, 5, 12), (400, 2, 33)]


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


@pytest.mark.parametrize("width,steps,prompt_len", CASES)
def test_float32_matches_generate(preset_dir, width, steps, prompt_len):
    prompt = _prompt(width * 1000 + steps * 10 + prompt_len, prompt_len)
    got = runner(preset_dir).run([BeamJob(prompt, width, steps)])[0]
    assert_same_beams(got, hf_beams(preset_dir, prompt, width, steps))


def _codes(seed: int, count: int, length: int, alphabets: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Random codes whose position i takes one of alphabets[i] tokens, so that each step
    offers enough allowed continuations."""
    rng = random.Random(seed)
    pools = [rng.sample(range(VOCAB), a) for a in alphabets]
    return tuple(sorted({tuple(rng.choice(pools[i]) for i in range(length)) for _ in range(count)}))


@pytest.mark.parametrize("width,steps", [(4, 4), (37, 4), (100, 3)])
def test_constrained_matches_prefix_allowed_tokens_fn(preset_dir, width, steps):
    codes = _codes(width, 3000, 4, (150, 12, 12, 12))
    prompt = _prompt(width, 40)
    got = runner(preset_dir).run([BeamJob(prompt, width, steps, build_trie(codes, VOCAB))])[0]
    assert_same_beams(got, hf_beams(preset_dir, prompt, width, steps, allowed=codes))
    prefixes = {c[:steps] for c in codes}
    assert all(tuple(t) in prefixes for t in got.tokens)  # no beam leaves the trie


def test_constraints_allowing_fewer_than_width_return_only_those(tiny_dir):
    codes = _codes(7, 20, 3, (3, 2, 2))  # at most 12 sequences of 3 tokens
    prompt = _prompt(7, 9)
    got = runner(tiny_dir).run([BeamJob(prompt, 16, 3, build_trie(codes, VOCAB))])[0]
    assert len(got.tokens) == len(set(codes)) < 16
    want = hf_beams(tiny_dir, prompt, 16, 3, allowed=codes)
    real = [i for i, s in enumerate(want.scores) if s > -1e8]  # transformers pads with -1e9 beams
    want.tokens, want.scores = [want.tokens[i] for i in real], [want.scores[i] for i in real]
    assert_same_beams(got, want)


def test_batched_requests_equal_each_alone(tiny_dir):
    codes = _codes(3, 2000, 4, (120, 10, 10, 10))
    jobs = [BeamJob(_prompt(1, 300), 37, 4), BeamJob(_prompt(2, 5), 100, 4),
            BeamJob(_prompt(3, 60), 16, 4, build_trie(codes, VOCAB)), BeamJob(_prompt(4, 1), 1, 4)]
    r = runner(tiny_dir)
    together = r.run(jobs)
    for job, got in zip(jobs, together):
        assert_same_beams(got, r.run([job])[0])


def test_bfloat16_top_sets_overlap_transformers(preset_dir):
    shares = []
    for seed, (width, steps, n) in enumerate([(100, 4, 32), (37, 5, 200), (100, 2, 400)]):
        prompt = _prompt(seed, n)
        got = runner(preset_dir, "bfloat16").run([BeamJob(prompt, width, steps)])[0]
        shares.append(overlap(got, hf_beams(preset_dir, prompt, width, steps, dtype=torch.bfloat16)))
    assert sum(shares) / len(shares) >= 0.9, shares


# --- kernels ---------------------------------------------------------------------------


def test_shared_prefix_attention_equals_attention_over_expanded_keys():
    torch.manual_seed(0)
    r, w, h, hkv, d, p, s = 3, 5, 6, 2, 8, 11, 4
    q = torch.randn(r, w, h, d)
    pk, pv = torch.randn(r, hkv, p, d), torch.randn(r, hkv, p, d)
    sk, sv = torch.randn(r * w, s, hkv, d), torch.randn(r * w, s, hkv, d)
    prompt_len = torch.tensor([11, 1, 6])
    valid_slots = torch.tensor([True, True, False, True])  # slot 2 unused, slot 3 the new token
    got = beam.shared_prefix_attention(
        q, pk, pv, beam.key_bias(torch.arange(p)[None, :] < prompt_len[:, None])[:, None, None, :],
        sk, sv, beam.key_bias(valid_slots))
    # reference: every beam gets its own copy of the prompt K/V, one masked SDPA per beam
    for i in range(r * w):
        n = int(prompt_len[i // w])
        keys = torch.cat([pk[i // w, :, :n], sk[i][valid_slots].transpose(0, 1)], dim=1)  # [Hkv, n+S', D]
        vals = torch.cat([pv[i // w, :, :n], sv[i][valid_slots].transpose(0, 1)], dim=1)
        want = F.scaled_dot_product_attention(q.reshape(r * w, h, 1, d)[i], keys, vals, enable_gqa=True)
        assert torch.allclose(got[i], want.reshape(-1), atol=1e-5)


def test_top_continuations_equal_a_full_sort():
    torch.manual_seed(1)
    r, w, v, k = 2, 6, 640, 9
    logp = torch.log_softmax(torch.randn(r, w, v) * 3, -1)
    logp[:, :, 17] = -math.inf  # a banned token
    cum = torch.randn(r, w) - 5
    cum[1, 4:] = -math.inf  # dead rows
    scores, parent, token = beam.top_continuations(logp, cum, k)
    want_scores, want_flat = torch.topk((logp + cum[:, :, None]).view(r, -1), k)
    assert torch.equal(scores, want_scores)
    assert torch.equal(parent * v + token, want_flat)


def test_head_log_probs_match_log_softmax_then_mask():
    torch.manual_seed(2)
    hidden, weight = torch.randn(5, 16), torch.randn(300, 16)
    banned = torch.tensor([3, 299])
    got = beam.head_log_probs(hidden, weight, banned, torch.empty(5, 300))
    want = torch.log_softmax(hidden @ weight.t(), -1)
    want[:, banned] = -math.inf
    assert torch.equal(got, want)
    w16 = weight.bfloat16()
    got16 = beam.head_log_probs(hidden.bfloat16(), w16, banned, torch.empty(5, 300),
                                torch.empty(5, 300, dtype=torch.bfloat16))
    assert torch.allclose(got16[:, :3], want[:, :3], atol=0.2)
    packed = beam.prepack_head(w16, 5)
    if packed is not None:  # oneDNN's prepacked GEMM: the same values
        got_packed = beam.head_log_probs(hidden.bfloat16(), w16, banned, torch.empty(5, 300),
                                         torch.empty(5, 300, dtype=torch.bfloat16), packed)
        assert torch.allclose(got_packed, got16, atol=0.05)


def test_requests_only_fill_the_planned_buffers(tiny_dir):
    from engines.bounded.beam_runtime import BeamPlan

    r = runner(tiny_dir, plan=BeamPlan(2, 64, 3, 40))
    bufs = r.buffers
    planned = [t.data_ptr() for t in (*bufs.prompt_kv, *bufs.suffix_kv[0], *bufs.suffix_kv[1], bufs.logp)]
    size = bufs.nbytes()
    for i in range(3):
        r.run([BeamJob(_prompt(i, 40), 64, 3), BeamJob(_prompt(i + 9, 3), 20, 3)])
    assert [t.data_ptr() for t in (*bufs.prompt_kv, *bufs.suffix_kv[0], *bufs.suffix_kv[1], bufs.logp)] == planned
    assert bufs.nbytes() == size
    with pytest.raises(ValueError, match="planned buffers"):
        r.run([BeamJob(_prompt(0, 41), 8, 3)])
    with pytest.raises(ValueError, match="planned buffers"):
        r.run([BeamJob([1], 65, 3)])
    with pytest.raises(ValueError, match="1..2 jobs"):
        r.run([BeamJob([1], 8, 3)] * 3)
