"""Query + items requests through the bounded engine: the query prefilled once and shared by
its items must answer exactly like transformers scoring each concatenation query + item_i
(float32, both families; bf16 within the bf16 bound), batched across requests, mixed with
plain requests, with sharing on and off, and the query bounds enforced per request."""
from __future__ import annotations

import asyncio
import dataclasses
import random

import pytest
import torch

from engines.base import Bounds, PrefillRequest, RequestRejected

from .conftest import VOCAB, reference
from .test_engine import start

BOUNDS = Bounds(max_samples_per_request=32, max_prompt_tokens=500, max_query_tokens=300, max_item_tokens=200)


def query_requests(rng: random.Random, n: int) -> list[PrefillRequest]:
    """Queries of 1-300 tokens with 1-32 items of 1-200 tokens (the extremes included)."""
    shapes = [(1, [1]), (300, [200] * 2), (1, [200, 1, 7]), (300, [1] * 32)]
    shapes += [(rng.randint(1, 300), [rng.randint(1, 200) for _ in range(rng.randint(1, 32))])
               for _ in range(n - len(shapes))]
    ids = lambda k: [rng.randrange(VOCAB) for _ in range(k)]  # noqa: E731
    return [PrefillRequest.with_query(f"q{i}", ids(q), [ids(m) for m in items], rng.sample(range(VOCAB), 2))
            for i, (q, items) in enumerate(shapes)]


def compare(model_dir, requests, results, dtype=torch.float32):
    """-> per-sample max abs error, top-label agreement vs transformers on the concatenations."""
    ref = reference(model_dir, dtype)
    errs, agree = [], []
    for req, res in zip(requests, results, strict=True):
        assert not isinstance(res, BaseException), res
        seqs = [list(req.query) + list(item) for item in req.items] if req.has_query else req.samples
        got, want = torch.tensor(res.scores), ref.scores(seqs, req.labels)
        assert got.shape == want.shape
        errs.append((got - want).abs().max(-1).values)
        agree.append(got.argmax(-1) == want.argmax(-1))
    return torch.cat(errs), torch.cat(agree).float()


def run_concurrently(engine, requests):
    async def main():
        return await asyncio.gather(*(engine.submit(r) for r in requests), return_exceptions=True)

    return asyncio.run(main())


@pytest.mark.parametrize("share", [True, False], ids=["shared", "unshared"])
def test_float32_matches_transformers_on_the_concatenations(preset_dir, share):
    engine = start(preset_dir, bounds=BOUNDS, max_wait_ms=1000, share_query=share)  # waves surely merge
    try:
        requests = query_requests(random.Random(11), 12)
        results = run_concurrently(engine, requests)
        stats, described = dict(engine.stats), engine.describe().details["prefill_only"]
    finally:
        engine.stop()
    errs, agree = compare(preset_dir, requests, results)
    assert len(errs) == sum(len(r.items) for r in requests)
    assert errs.max().item() < 1e-4
    assert agree.min().item() == 1.0
    assert stats["batches"] < len(requests) and stats["largest_batch"] > 1, stats
    assert described["share_query"] is share


def test_query_and_plain_requests_share_a_batch(tiny_dir):
    engine = start(tiny_dir, bounds=BOUNDS, max_wait_ms=1000)
    rng = random.Random(12)
    plain = [PrefillRequest(f"p{i}", [[rng.randrange(VOCAB) for _ in range(rng.randint(1, 90))]
                                      for _ in range(rng.randint(1, 5))], [5, 6]) for i in range(3)]
    requests = query_requests(rng, 5) + plain
    try:
        results = run_concurrently(engine, requests)
        stats = dict(engine.stats)
    finally:
        engine.stop()
    errs, agree = compare(tiny_dir, requests, results)
    assert errs.max().item() < 1e-4 and agree.min().item() == 1.0
    assert stats["largest_batch"] >= 3, stats


def test_bfloat16_matches_float32_transformers_within_2e2(calm_dir):
    engine = start(calm_dir, "bfloat16", bounds=BOUNDS, max_wait_ms=50)
    try:
        requests = query_requests(random.Random(13), 10)
        results = run_concurrently(engine, requests)
    finally:
        engine.stop()
    errs, agree = compare(calm_dir, requests, results)
    assert errs.max().item() < 2e-2
    assert agree.mean().item() >= 0.99


def test_text_query_is_scored_as_one_string_per_sample(tiny_dir):
    from transformers import AutoTokenizer

    engine = start(tiny_dir, bounds=BOUNDS)
    tok = AutoTokenizer.from_pretrained(str(tiny_dir))
    query, items = " Is this relevant to shoes: hello wor", ["ld", " red running shoes for men", "?"]
    try:
        res = asyncio.run(engine.submit(PrefillRequest.with_query("t", query, items, [" yes", " no"])))
    finally:
        engine.stop()
    seqs = [tok.encode(query + i, add_special_tokens=False) for i in items]  # "wor" + "ld" merge
    labels = [tok.encode(s, add_special_tokens=False)[0] for s in (" yes", " no")]
    assert (torch.tensor(res.scores) - reference(tiny_dir).scores(seqs, labels)).abs().max().item() < 1e-4


def test_query_bounds_reject_or_truncate_per_request(tiny_dir):
    bounds = Bounds(max_samples_per_request=3, max_prompt_tokens=40, max_query_tokens=8, max_item_tokens=6)
    engine = start(tiny_dir, bounds=bounds)
    good = PrefillRequest.with_query("ok", [7] * 8, [[8] * 6, [9]], [1, 2])
    bad = [PrefillRequest.with_query("q", [7] * 9, [[8]], [1, 2]),
           PrefillRequest.with_query("i", [7], [[8] * 7], [1, 2]),
           PrefillRequest.with_query("n", [7], [[8]] * 4, [1, 2]),
           PrefillRequest.with_query("e", [7], [[8], []], [1, 2])]
    try:
        results = run_concurrently(engine, [good] + bad)
    finally:
        engine.stop()
    assert not isinstance(results[0], BaseException)
    assert all(isinstance(r, RequestRejected) for r in results[1:]), results
    assert [m in str(r) for m, r in zip(["max_query_tokens", "max_item_tokens", "max_samples_per_request",
                                         "items.1: empty"], results[1:])] == [True] * 4
    cut = start(tiny_dir, bounds=dataclasses.replace(bounds, on_violation="truncate"))
    try:
        res = asyncio.run(cut.submit(PrefillRequest.with_query("t", list(range(1, 12)), [list(range(20, 30))] * 4,
                                                               [1, 2])))
    finally:
        cut.stop()
    want = reference(tiny_dir).scores([list(range(4, 12)) + list(range(24, 30))] * 3, [1, 2])  # ends kept, 3 items
    assert (torch.tensor(res.scores) - want).abs().max().item() < 1e-4


@pytest.mark.parametrize("share", [True, False], ids=["shared", "unshared"])
def test_padded_attention_shares_the_query_through_its_indices(tiny_dir, share):
    """The GPU's padded attention (run here on the CPU): items gather their query's K/V rows."""
    engine = start(tiny_dir, bounds=BOUNDS, max_wait_ms=1000, prefill_attention="padded", share_query=share)
    try:
        requests = query_requests(random.Random(14), 6)
        results = run_concurrently(engine, requests)
        described, stats = engine.describe().details["prefill_only"], dict(engine.stats)
    finally:
        engine.stop()
    errs, agree = compare(tiny_dir, requests, results)
    assert errs.max().item() < 1e-4 and agree.min().item() == 1.0
    assert described["share_query"] is share and stats["largest_batch"] > 1, stats
