"""SGLang baseline: an HTTP client of a real SGLang server (`engine.py`), the server
process it may launch (`server.py`), the HTTP mapping (`protocol.py`) and the separate
Python environment SGLang runs in (`env.py`, built by `setup_env`)."""
from engines.sglang.engine import ServerDied, SGLangEngine, SGLangOptions

__all__ = ["SGLangEngine", "SGLangOptions", "ServerDied"]
