"""SGLang baseline: an HTTP client of a real SGLang server (`engine.py`, on the shared base in
engines/server/), the HTTP mapping (`protocol.py`) and the separate Python environment SGLang
runs in (`env.py`, built by `env.VENV.setup()`, engines/server/venv.py)."""
from engines.sglang.engine import ServerDied, SGLangEngine, SGLangOptions

__all__ = ["SGLangEngine", "SGLangOptions", "ServerDied"]
