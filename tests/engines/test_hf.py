"""The hf engine against direct, unbatched transformers calls on the same weights."""
import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM

from engines.base import BeamRequest, Bounds, EngineConfig, PrefillRequest, RequestRejected
from engines.hf import HFEngine


@pytest.fixture(scope="module")
def engine(tiny_dir):
    e = HFEngine(EngineConfig(tiny_dir, "float32", bounds=Bounds(max_samples_per_request=8, max_prompt_tokens=64)))
    e.start()
    yield e
    e.stop()


@pytest.fixture(scope="module")
def ref(tiny_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()


def test_scores_match_one_sample_at_a_time(engine, ref, tokenizer):
    samples = [" the cat sat", " a much longer sample of text that has quite a few words in it", [11, 22, 33, 44], " x"]
    labels = [" yes", " no", 1000]
    res = asyncio.run(engine.submit(PrefillRequest("p", samples, labels)))
    ids = [tokenizer.encode(" yes", add_special_tokens=False)[0], tokenizer.encode(" no", add_special_tokens=False)[0], 1000]
    for s, got in zip(samples, res.scores):
        toks = tokenizer.encode(s, add_special_tokens=False) if isinstance(s, str) else s
        with torch.no_grad():
            want = ref(torch.tensor([toks])).logits[0, -1, ids].softmax(-1)
        assert got == pytest.approx(want.tolist(), abs=1e-5)


def test_beams_match_generate(engine, ref):
    prompt = [100, 200, 300, 400, 500]
    res = asyncio.run(engine.submit(BeamRequest("b", prompt, 6, 3)))
    out = ref.generate(torch.tensor([prompt]), num_beams=6, num_return_sequences=6, max_new_tokens=3,
                       min_new_tokens=3, do_sample=False, length_penalty=0.0, output_scores=True,
                       return_dict_in_generate=True, pad_token_id=151643)
    assert [b.token_ids for b in res.beams] == out.sequences[:, 5:].tolist()
    assert [b.logprob for b in res.beams] == pytest.approx(out.sequences_scores.tolist(), abs=1e-4)
    # the cumulative log-probability is the sum of the chosen tokens' log-softmax
    best = res.beams[0]
    seq, total = list(prompt), 0.0
    with torch.no_grad():
        for t in best.token_ids:
            total += ref(torch.tensor([seq])).logits[0, -1].log_softmax(-1)[t].item()
            seq.append(t)
    assert best.logprob == pytest.approx(total, abs=1e-4)


def test_allowed_codes_keep_beams_on_the_trie(engine):
    codes = ((7, 8, 9), (7, 8, 10), (7, 11, 12), (13, 14, 15), (16, 17, 18))
    res = asyncio.run(engine.submit(BeamRequest("c", [1, 2, 3], 4, 3, codes)))
    assert len(res.beams) == 4
    assert all(tuple(b.token_ids) in codes for b in res.beams)


def test_bounds_reject_and_engine_keeps_serving(engine):
    with pytest.raises(RequestRejected, match="max_samples_per_request"):
        asyncio.run(engine.submit(PrefillRequest("x", ["a"] * 9, [" yes", " no"])))
    with pytest.raises(RequestRejected, match="one token"):
        asyncio.run(engine.submit(PrefillRequest("x", ["a"], [" yes", " definitely not"])))
    assert asyncio.run(engine.submit(PrefillRequest("ok", [" fine"], [" yes", " no"]))).scores


def test_query_request_scores_the_concatenations(engine, ref, tokenizer):
    query, items = " is this about animals:", [" the cat sat", " stock prices fell", " a dog"]
    labels = [" yes", " no"]
    res = asyncio.run(engine.submit(PrefillRequest.with_query("q", query, items, labels)))
    ids = [tokenizer.encode(lab, add_special_tokens=False)[0] for lab in labels]
    assert len(res.scores) == len(items)
    for item, got in zip(items, res.scores):
        toks = tokenizer.encode(query + item, add_special_tokens=False)
        with torch.no_grad():
            want = ref(torch.tensor([toks])).logits[0, -1, ids].softmax(-1)
        assert got == pytest.approx(want.tolist(), abs=1e-5)
    ids_res = asyncio.run(engine.submit(PrefillRequest.with_query("t", [5, 6, 7], [[8], [9, 10]], ids)))
    plain = asyncio.run(engine.submit(PrefillRequest("s", [[5, 6, 7, 8], [5, 6, 7, 9, 10]], ids)))
    assert torch.tensor(ids_res.scores).allclose(torch.tensor(plain.scores), atol=1e-6)


def test_query_bounds_reject(engine):
    with pytest.raises(RequestRejected, match="max_samples_per_request"):
        asyncio.run(engine.submit(PrefillRequest.with_query("x", [1], [[2]] * 9, [" yes", " no"])))


def test_one_beam_is_greedy_with_its_cumulative_log_prob(engine, ref):
    """W = 1 (what /generate without beam_width asks): found by a hostile pass, it used to fail
    for want of generate's sequence scores."""
    prompt = [100, 200, 300]
    res = asyncio.run(engine.submit(BeamRequest("g", prompt, 1, 3)))
    seq, total = list(prompt), 0.0
    with torch.no_grad():
        for _ in range(3):
            logp = ref(torch.tensor([seq])).logits[0, -1].log_softmax(-1)
            logp[151645] = -float("inf")  # EOS masked during the steps
            t = int(logp.argmax())
            total += logp[t].item()
            seq.append(t)
    assert len(res.beams) == 1 and res.beams[0].token_ids == seq[3:]
    assert res.beams[0].logprob == pytest.approx(total, abs=1e-4)
