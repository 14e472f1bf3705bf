"""The beam task's walk (eager: prefill, step 1..S, format -- what the engine serves) against
transformers `generate`."""
from __future__ import annotations

import random

import pytest
import torch

from engines.bounded.kernels.constraints import build_trie
from engines.bounded.runtime.beam_batch import BeamJob

from ..beam_reference import assert_same_beams, hf_beams, overlap, runner
from ..conftest import VOCAB

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


def test_bfloat16_batched_with_a_trie_overlaps_each_alone(tiny_dir):
    """bf16 with the fused head: a batch holding a constrained request takes the logits (the
    same kernel's values), each free request alone takes the fused top-k: the same beams, but
    for picks among equal bf16 scores."""
    codes = _codes(5, 2000, 3, (120, 10, 10))
    jobs = [BeamJob(_prompt(5, 40), 100, 3), BeamJob(_prompt(6, 9), 16, 3, build_trie(codes, VOCAB)),
            BeamJob(_prompt(7, 3), 37, 3)]
    r = runner(tiny_dir, "bfloat16")
    together = r.run(jobs)
    for job, got in zip(jobs, together):
        alone = r.run([job])[0]
        assert overlap(got, alone) >= 0.95
        assert abs(got.scores[0] - alone.scores[0]) < 1e-3


def test_bfloat16_top_sets_overlap_transformers(preset_dir):
    from engines.bounded.kernels import native
    # the fused native head (head + log-softmax + top-k in one pass) wherever it loads
    status = runner(preset_dir, "bfloat16").runtime.status  # the runtime loads the native kernels
    assert status["head_tail"] == ("native fused head + top-k" if native.available() else "logit summary")
    shares = []
    for seed, (width, steps, n) in enumerate([(100, 4, 32), (37, 5, 200), (100, 2, 400)]):
        prompt = _prompt(seed, n)
        got = runner(preset_dir, "bfloat16").run([BeamJob(prompt, width, steps)])[0]
        shares.append(overlap(got, hf_beams(preset_dir, prompt, width, steps, dtype=torch.bfloat16)))
    assert sum(shares) / len(shares) >= 0.9, shares
