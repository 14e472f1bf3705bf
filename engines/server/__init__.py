"""What the engines that are HTTP clients of a real inference server share: the managed
environment a server runs in (`venv.py`), launching and stopping its process group
(`process.py`), and the client base with connect-or-launch, pooled HTTP and the mapping of
failures (`client.py`). `engines/sglang/` and `engines/vllm/` are subclasses."""
from engines.server.client import ServerDied, ServerEngine, ServerOptions

__all__ = ["ServerDied", "ServerEngine", "ServerOptions"]
