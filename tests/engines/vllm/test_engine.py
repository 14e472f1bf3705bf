"""The vllm engine without vLLM: its requests and answers over an in-process mock transport,
the launch command and environment it would run, and what it refuses before launching.
(Launching, health waiting and process-group stop are the shared code the sglang engine's
fake server exercises; the real server is tests/engines/test_vllm.py.)"""
import asyncio
import json
from pathlib import Path

import httpx
import pytest

from engines.base import BeamRequest, Bounds, EngineConfig, EngineUnavailable, PrefillRequest, RequestRejected
from engines.registry import engine_class
from engines.vllm import VLLMEngine

METRICS = ('# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n'
           'vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="True",'
           'kv_cache_memory_bytes="2147483648",num_gpu_blocks="100"} 1.0\n')


def mock_engine(model_dir, completions, **options):
    calls = []

    def handler(request: httpx.Request):
        path = request.url.path
        if path == "/version":
            return httpx.Response(200, json={"version": "0.32.0"})
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": str(model_dir), "max_model_len": 4096}]})
        if path == "/metrics":
            return httpx.Response(200, text=METRICS)
        if path == "/health":
            return httpx.Response(200)
        body = json.loads(request.content)
        calls.append(body)
        return completions(body)

    cfg = EngineConfig(model_dir, "float32", bounds=Bounds(max_samples_per_request=8, max_beam_width=8),
                       options={"url": "http://vllm.test", **options})
    engine = VLLMEngine(cfg, transport=httpx.MockTransport(handler))
    engine.start()
    return engine, calls


def label_answer(body):
    """Choice i puts log-prob -(i+1) on the first label and -(i+2) on the others."""
    return httpx.Response(200, json={"choices": [
        {"index": i, "logprobs": {"top_logprobs": [
            {f"token_id:{t}": -(i + 1.0) - (j > 0) for j, t in enumerate(body["logprob_token_ids"])}]}}
        for i in range(len(body["prompt"]))]})


def test_registry_finds_the_engine():
    assert engine_class("vllm") is VLLMEngine


def test_one_completions_call_per_business_request_with_label_strings(tiny_hd32_dir, tokenizer):
    engine, calls = mock_engine(tiny_hd32_dir, label_answer)
    res = asyncio.run(engine.submit(PrefillRequest("r", [" the cat", [5, 6, 7]], [" yes", " no"])))
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    assert [c["prompt"] for c in calls] == [[enc(" the cat"), [5, 6, 7]]]
    assert calls[0]["logprob_token_ids"] == enc(" yes") + enc(" no") and calls[0]["max_tokens"] == 1
    e = 1 / (1 + 1 / 2.718281828459045)  # softmax of (-1, -2) and of (-2, -3) alike
    assert res.scores == [pytest.approx([e, 1 - e])] * 2


def test_a_query_request_sends_the_concatenations(tiny_hd32_dir):
    engine, calls = mock_engine(tiny_hd32_dir, label_answer)
    res = asyncio.run(engine.submit(PrefillRequest.with_query("q", [9, 8], [[1], [2, 3]], [10, 20])))
    assert calls[0]["prompt"] == [[9, 8, 1], [9, 8, 2, 3]] and len(res.scores) == 2


def test_per_sample_sends_one_call_per_sample(tiny_hd32_dir):
    engine, calls = mock_engine(tiny_hd32_dir, label_answer, per_sample=True)
    res = asyncio.run(engine.submit(PrefillRequest("r", [[1], [1, 2], [1, 2, 3]], [10, 20])))
    assert sorted(len(c["prompt"][0]) for c in calls) == [1, 2, 3] and len(res.scores) == 3


def test_beams_go_to_vllm_beam_search(tiny_hd32_dir):
    def beams(body):
        return httpx.Response(200, json={"choices": [
            {"index": j, "text": "", "token_ids": [body["prompt"][-1] + j] * body["max_tokens"],
             "logprobs": {"token_logprobs": [-(j + 1.0)] * body["max_tokens"]}} for j in range(body["n"])]})

    engine, calls = mock_engine(tiny_hd32_dir, beams)
    res = asyncio.run(engine.submit(BeamRequest("b", [1, 2, 40], 3, 2)))
    assert [b.token_ids for b in res.beams] == [[40, 40], [41, 41], [42, 42]]
    assert [b.logprob for b in res.beams] == [-2.0, -4.0, -6.0]
    assert calls[0]["use_beam_search"] and calls[0]["n"] == 3 and calls[0]["ignore_eos"]


def test_describe_reads_version_model_and_cache_settings(tiny_hd32_dir):
    engine, _ = mock_engine(tiny_hd32_dir, label_answer)
    d = engine.describe().to_dict()  # as run.json records it
    assert d["version"] == "0.32.0" and d["mode"] == "connect" and d["launch_command"] is None
    assert d["server_settings"] == {"model": str(tiny_hd32_dir), "max_model_len": 4096, "block_size": "128",
                                    "enable_prefix_caching": "True", "cache_dtype": "auto",
                                    "kv_cache_memory_bytes": "2147483648", "num_gpu_blocks": "100"}


def test_allowed_codes_and_bounds_are_rejected_before_sending(tiny_hd32_dir):
    engine, calls = mock_engine(tiny_hd32_dir, label_answer)
    with pytest.raises(RequestRejected, match="allowed item codes"):
        asyncio.run(engine.submit(BeamRequest("b", [1, 2], 2, 2, allowed=[[3, 4]])))
    with pytest.raises(RequestRejected, match="beam_width: 9 outside"):
        asyncio.run(engine.submit(BeamRequest("b", [1, 2], 9, 2)))
    with pytest.raises(RequestRejected, match="max_samples_per_request"):
        asyncio.run(engine.submit(PrefillRequest("r", [[1]] * 9, [1, 2])))
    assert calls == []


def launch_config(model_dir, device="cpu", **options):
    return EngineConfig(model_dir, "bfloat16", device, bounds=Bounds(max_beam_width=100),
                        options={"python": "/venv/bin/python", **options})


def test_cpu_launch_command_and_environment(tiny_hd32_dir, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {1, 0})
    engine = VLLMEngine(launch_config(tiny_hd32_dir, kv_cache_gib=0.5, server_args="--max-logprobs 300 -O0"))
    assert engine.launch_command(31000) == [
        "/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_hd32_dir),
        "--host", "127.0.0.1", "--port", "31000", "--dtype", "bfloat16", "--max-logprobs", "200",
        "--kv-cache-memory-bytes", str(2**29), "--max-logprobs", "300", "-O0"]
    assert engine.launch_env()["VLLM_CPU_OMP_THREADS_BIND"] == "0,1"
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "1")  # the user's own binding wins
    assert engine.launch_env()["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert VLLMEngine(launch_config(tiny_hd32_dir, cpu_bind="auto")).launch_env()["VLLM_CPU_OMP_THREADS_BIND"] == "auto"


def test_gpu_launch_picks_the_device_and_leaves_memory_to_vllm(tiny_hd32_dir):
    engine = VLLMEngine(launch_config(tiny_hd32_dir, device="cuda:1"))
    assert "--kv-cache-memory-bytes" not in engine.launch_command(31000)
    assert engine.launch_env()["CUDA_VISIBLE_DEVICES"] == "1"


def test_a_head_size_vllm_cpu_cannot_run_is_refused_before_launching(tiny_dir):
    engine = VLLMEngine(launch_config(tiny_dir, python="/nonexistent/python"))
    with pytest.raises(EngineUnavailable, match="head_dim 16.*tiny-hd32"):
        engine.start()  # refused before the interpreter is run


def test_options_are_validated():
    cfg = EngineConfig(Path("."), options={"url": "http://x", "kv_cache_gb": 4})
    with pytest.raises(EngineUnavailable, match="kv_cache_gb.*allowed: url.*kv_cache_gib"):
        VLLMEngine.check_available(cfg)


def test_check_available_without_env(tmp_path):
    with pytest.raises(EngineUnavailable, match="no vLLM environment.*bench vllm setup"):
        VLLMEngine.check_available(EngineConfig(tmp_path, options={"python": str(tmp_path / "nope")}))


def test_a_sweep_resizes_a_launched_server_only_within_its_max_logprobs(tiny_hd32_dir):
    engine = VLLMEngine(launch_config(tiny_hd32_dir))  # launched for 100 beams: --max-logprobs 200
    engine.launch_command(31000)
    engine._tokenizer = None  # not started: the check runs without one
    assert engine.resize(Bounds(max_beam_width=25)) and engine.config.bounds.max_beam_width == 25
    assert engine.resize(Bounds(max_beam_width=100))
    assert not engine.resize(Bounds(max_beam_width=400))  # needs a server launched for it
    assert engine.config.bounds.max_beam_width == 100
