"""The bounded engine: packed prefill and shared-prefix beam search for small Qwen models,
planned ahead of time from the declared bounds.

Data path: engine.py (adapter the harness sees) -> batcher.py (cross-request batching) ->
dag.py + scoring.py (static DAG of stages) -> runtime.py + aot.py (buffers, compiled graph)
-> programs.py (graph entry points) -> model.py (assembles layers.py) -> kernels.py.
Beam search: beam_search.py (DAG nodes) -> beam_graphs.py (compiled graphs, BeamRuntime)
-> beam_runtime.py (planned buffers, the fixed-step walk) -> beam_programs.py (graph entry
points) -> beam.py (shared-prefix attention, top-W) and constraints.py (item-code trie).
"""

__version__ = "0.1.0"
