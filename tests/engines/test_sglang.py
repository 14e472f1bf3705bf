"""End to end: a real SGLang 0.5.23 server on this CPU, launched from its own environment
(built here from nothing when absent: minutes, ~11 GB), serving the `tiny` preset in
float32, against transformers on the same weights.

The server is launched once for the module. The last test kills it on purpose.
Set BOUNDED_BENCH_SKIP_SGLANG=1 to skip when the environment is not built yet.
"""
import asyncio
import os
import signal

import pytest
import torch
from transformers import AutoModelForCausalLM

from engines.base import BeamRequest, EngineConfig, EngineError, PrefillRequest, RequestRejected
from engines.sglang import ServerDied, SGLangEngine
from engines.sglang.env import VENV

PAD = 151643


@pytest.fixture(scope="module")
def sglang_python():
    if VENV.read_marker(VENV.default_dir()) is None and os.environ.get("BOUNDED_BENCH_SKIP_SGLANG") == "1":
        pytest.skip(f"no SGLang environment at {VENV.default_dir()} and BOUNDED_BENCH_SKIP_SGLANG=1 "
                    f"(build it with `bench sglang setup`)")
    return VENV.setup(log=print)


@pytest.fixture(scope="module")
def server(sglang_python, tiny_dir):
    engine = SGLangEngine(EngineConfig(tiny_dir, "float32", options={"python": str(sglang_python)}))
    engine.start()
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def ref(tiny_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()


def connect(server, tiny_dir, **options):
    engine = SGLangEngine(EngineConfig(tiny_dir, "float32", options={"url": server.url, **options}))
    engine.start()
    return engine


SAMPLES = [" the cat sat on the mat", [11, 22, 33, 44], " x",
           " a much longer sample of text that has quite a few words in it, and then some more"]
LABELS = [" yes", " no", 1000]


def reference_scores(ref, tokenizer, samples, labels):
    ids = [tokenizer.encode(lab, add_special_tokens=False)[0] if isinstance(lab, str) else lab for lab in labels]
    rows = []
    for s in samples:
        toks = tokenizer.encode(s, add_special_tokens=False) if isinstance(s, str) else s
        with torch.no_grad():
            rows.append(ref(torch.tensor([toks])).logits[0, -1, ids].softmax(-1).tolist())
    return rows


def test_describe_reports_the_server(server):
    d = server.describe().to_dict()  # as run.json records it
    assert d["version"] == "0.5.23" and d["mode"] == "launch"
    assert d["server_settings"]["device"] == "cpu" and d["server_settings"]["dtype"] == "float32"
    assert d["server_settings"]["attention_backend"] == "torch_native"


def test_scores_match_transformers(server, ref, tokenizer):
    res = asyncio.run(server.submit(PrefillRequest("p", SAMPLES, LABELS)))
    want = reference_scores(ref, tokenizer, SAMPLES, LABELS)
    for got, exp in zip(res.scores, want, strict=True):
        assert got == pytest.approx(exp, abs=2e-2)
        assert sum(got) == pytest.approx(1.0, abs=1e-6)


def test_per_sample_mode_gives_the_same_scores(server, tiny_dir):
    batched = asyncio.run(server.submit(PrefillRequest("p", SAMPLES, LABELS))).scores
    split = connect(server, tiny_dir, per_sample=True)
    try:
        res = asyncio.run(split.submit(PrefillRequest("p", SAMPLES, LABELS)))
    finally:
        split.stop()
    for got, exp in zip(res.scores, batched, strict=True):
        assert got == pytest.approx(exp, abs=1e-5)


def test_query_and_items_score_like_the_concatenations(server, ref, tokenizer):
    query, items = " is this relevant to cats and", [" dogs", " the stock market today", [11, 22], " kittens"]
    text_items = [i for i in items if isinstance(i, str)]
    res = asyncio.run(server.submit(PrefillRequest.with_query("q", query, text_items, LABELS)))
    want = reference_scores(ref, tokenizer, [query + i for i in text_items], LABELS)
    for got, exp in zip(res.scores, want, strict=True):
        assert got == pytest.approx(exp, abs=2e-2)
    ids = tokenizer.encode(query, add_special_tokens=False)
    res = asyncio.run(server.submit(PrefillRequest.with_query("i", ids, [[11, 22], [33]], LABELS)))
    want = reference_scores(ref, tokenizer, [ids + [11, 22], ids + [33]], LABELS)
    for got, exp in zip(res.scores, want, strict=True):
        assert got == pytest.approx(exp, abs=2e-2)
    assert server.describe().details["radix_cache"] == "on" and server.describe().details["multi_item_scoring"] == "off"


def hf_beams(ref, prompt, width, steps):
    out = ref.generate(torch.tensor([prompt]), num_beams=width, num_return_sequences=width,
                       max_new_tokens=steps, min_new_tokens=steps, do_sample=False, length_penalty=0.0,
                       output_scores=True, return_dict_in_generate=True, pad_token_id=PAD)
    return out.sequences[:, len(prompt):].tolist(), out.sequences_scores.tolist()


def test_beams_overlap_transformers(server, ref):
    width, steps = 8, 3
    prompts = [[100, 200, 300, 400, 500], [7, 8, 9], [151, 1500, 15000, 150000, 42, 4242, 424], [31337]]

    async def run_all():  # concurrently, as a load generator would send them
        return await asyncio.gather(*(server.submit(BeamRequest(f"b{i}", p, width, steps))
                                      for i, p in enumerate(prompts)))

    results = asyncio.run(run_all())
    overlaps = []
    for prompt, res in zip(prompts, results):
        want, want_scores = hf_beams(ref, prompt, width, steps)
        got = [b.token_ids for b in res.beams]
        assert len(got) == width
        overlaps.append(len({tuple(g) for g in got} & {tuple(w) for w in want}) / width)
        # best first, and the cumulative log-prob of a shared beam agrees
        assert [b.logprob for b in res.beams] == sorted((b.logprob for b in res.beams), reverse=True)
        assert got[0] == want[0] and res.beams[0].logprob == pytest.approx(want_scores[0], abs=1e-3)
    assert sum(overlaps) / len(overlaps) >= 0.9, overlaps


def test_greedy_width_one(server, ref):
    prompt = [100, 200, 300]
    (beam,) = asyncio.run(server.submit(BeamRequest("g", prompt, 1, 4))).beams
    want = ref.generate(torch.tensor([prompt]), num_beams=1, max_new_tokens=4, min_new_tokens=4,
                        do_sample=False, pad_token_id=PAD)[0, len(prompt):].tolist()
    assert beam.token_ids == want
    with torch.no_grad():
        logprobs = ref(torch.tensor([prompt + want])).logits[0, len(prompt) - 1:-1].log_softmax(-1)
    assert beam.logprob == pytest.approx(logprobs[range(4), want].sum().item(), abs=1e-3)


def test_what_sglang_cannot_do_is_rejected_and_the_server_keeps_serving(server):
    with pytest.raises(RequestRejected, match="allowed item codes"):
        asyncio.run(server.submit(BeamRequest("c", [1, 2, 3], 4, 3, allowed=[[7, 8, 9]])))
    with pytest.raises(RequestRejected, match="out of vocabulary"):  # SGLang refuses special-token labels
        asyncio.run(server.submit(PrefillRequest("e", [[1, 2]], [151645, 9454])))
    assert asyncio.run(server.submit(PrefillRequest("ok", [[1, 2]], [9454, 2152]))).scores


def test_zz_a_server_that_dies_ends_requests_with_server_died(server, tiny_dir):
    """Runs last (by name and position): it kills the module's server."""
    watcher = connect(server, tiny_dir)
    assert asyncio.run(watcher.submit(PrefillRequest("ok", [[1, 2]], [9454, 2152]))).scores
    os.killpg(server._server.pid, signal.SIGKILL)
    with pytest.raises(ServerDied, match="exited with code"):
        asyncio.run(server.submit(PrefillRequest("p", [[1, 2]], [9454, 2152])))
    with pytest.raises(EngineError):  # a client that only knows the url sees it too
        asyncio.run(watcher.submit(PrefillRequest("p", [[1, 2]], [9454, 2152])))
    watcher.stop()
