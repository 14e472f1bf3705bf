"""Model families: config.json -> ModelConfig by model_type, both rope spellings, and the
message for a model type the engine does not know."""
from __future__ import annotations

import json

import pytest

from engines.bounded.model.decoder import load_model
from engines.bounded.model.families import UnknownModelFamily, UnsupportedModelConfig, read_model_config
from engines.bounded.model.precision import PrecisionPolicy


def test_config_reads_both_rope_spellings(preset_dir, tmp_path):
    cfg = json.loads((preset_dir / "config.json").read_text())
    theta = cfg.pop("rope_parameters")["rope_theta"]
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "rope_theta": theta}))
    assert read_model_config(tmp_path).rope_theta == read_model_config(preset_dir).rope_theta == theta


def test_unknown_family_lists_known_ones(tiny_dir_copy):
    cfg = json.loads((tiny_dir_copy / "config.json").read_text())
    (tiny_dir_copy / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    with pytest.raises(UnknownModelFamily, match="known model types: qwen2, qwen3"):
        load_model(tiny_dir_copy, PrecisionPolicy("float32"))


def test_unknown_model_type_names_it_the_directory_and_the_known_ones(tiny_dir_copy):
    cfg = json.loads((tiny_dir_copy / "config.json").read_text())
    (tiny_dir_copy / "config.json").write_text(json.dumps({**cfg, "model_type": "mistral"}))
    with pytest.raises(UnknownModelFamily) as e:
        read_model_config(tiny_dir_copy)
    msg = str(e.value)
    assert "model_type 'mistral'" in msg and str(tiny_dir_copy) in msg
    assert msg.endswith("known model types: qwen2, qwen3")


def test_unsupported_configs_say_what(tiny_dir_copy):
    cfg = json.loads((tiny_dir_copy / "config.json").read_text())
    for change, what in (({"use_sliding_window": True}, "sliding-window"),
                         ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}}, "rope_type 'yarn'")):
        (tiny_dir_copy / "config.json").write_text(json.dumps({**cfg, **change}))
        with pytest.raises(UnsupportedModelConfig, match=what):
            read_model_config(tiny_dir_copy)


@pytest.fixture
def tiny_dir_copy(tmp_path):
    from harness.workload.presets import materialise

    src = materialise("tiny", log=lambda s: None)
    dst = tmp_path / "m"
    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    (dst / "model.safetensors").symlink_to(src / "model.safetensors")
    return dst
