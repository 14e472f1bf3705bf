"""The bounded engine: packed prefill and shared-prefix beam search for small Qwen models,
planned ahead of time from the declared bounds.

The folder is the stage, the task kind is the file name. Data path, top down (imports point
down only):

    engine.py     BoundedEngine: one Task per served kind; options.py, plan.py (every size)
    tasks/        the static DAG of each kind over typed stage data, and the batcher
    runtime/      planned buffers and compiled graphs (compiled.py: the shared base; aot.py)
    programs/     tensor-only graph entry points (what gets exported and compiled)
    model/        the decoder (one layer loop), its layers, config, precision, weights
    kernels/      pure tensor functions: dense, attention, beam attention, head, select, tries
"""

__version__ = "0.1.0"

from engines.bounded.runtime.hugepages import advise_torch_allocations

advise_torch_allocations()  # before the engine's tensors exist: large ones on 2 MB pages
