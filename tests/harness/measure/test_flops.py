import pytest
import torch

from harness.measure.flops import ModelShape, beam_flops, prefill_flops
from harness.workload.presets import PRESETS


def test_hand_count_one_config():
    # layers 2, hidden 8, heads 2 x head_dim 4 (q: 8), kv 1 x 4, intermediate 16, vocab 100, no bias/norm
    s = ModelShape(layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=100)
    per_layer = 8 * 8 + 8 * 4 + 8 * 4 + 8 * 8 + 3 * 8 * 16 + 2 * 8  # q, k, v, o, mlp, 2 norms = 592
    assert s.non_embedding_params == 2 * per_layer + 8 == 1192
    # 3 tokens: 2*1192*3 linear + 4*2*2*4*(1+2+3) attention + 2*8*100 head
    assert prefill_flops(s, 3) == 7152 + 384 + 1600
    # beam: prompt 3, W=2, S=3 -> 2 decode passes per beam with contexts 4 and 5
    decode = 2 * (2 * (2384 + 1600) + 64 * (4 + 5))
    assert beam_flops(s, 3, 2, 3) == prefill_flops(s, 3) + decode


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen2", "qwen2.5-0.5b"])
def test_non_embedding_params_match_the_real_model(name):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(PRESETS[name])
    if name == "qwen2.5-0.5b":  # same shape, 2 layers, so the check stays fast
        cfg["num_hidden_layers"] = 2
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    expected = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n and "lm_head" not in n)
    assert ModelShape.from_config(config.to_dict()).non_embedding_params == expected


def test_seed_article_floor():
    """DESIGN.md: qwen2.5-0.5b, W=100, 4 tokens, 32-token prompt: FLOP floor 0.73 s at 440 GFLOP/s."""
    s = ModelShape.from_config(PRESETS["qwen2.5-0.5b"])
    assert beam_flops(s, 32, 100, 4) / 440e9 == pytest.approx(0.73, abs=0.01)
    assert beam_flops(s, 400, 100, 4) / 440e9 == pytest.approx(1.36, abs=0.01)
