"""vLLM baseline: an HTTP client of a real vLLM OpenAI-compatible server (`engine.py`, on the
shared base in engines/server/), the HTTP mapping (`protocol.py`) and the separate Python
environment vLLM's CPU build runs in (`env.py`, built by `env.VENV.setup()`, engines/server/venv.py)."""
from engines.server import ServerDied
from engines.vllm.engine import VLLMEngine, VLLMOptions

__all__ = ["ServerDied", "VLLMEngine", "VLLMOptions"]
