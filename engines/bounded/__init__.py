"""The bounded engine: packed prefill and (later) shared-prefix beam search for small Qwen
models, planned ahead of time from the declared bounds.

Data path: engine.py (adapter the harness sees) -> batcher.py (cross-request batching) ->
dag.py + scoring.py (static DAG of stages) -> runtime.py + aot.py (buffers, compiled graph)
-> programs.py (graph entry points) -> model.py (assembles layers.py) -> kernels.py.
"""

__version__ = "0.1.0"
