"""CUDA graphs of fixed-shape calls: captured once at start, replayed per request.

A captured call reads only static buffers (the planned buffers of runtime/buffers.py, at
fixed addresses) and writes its outputs to memory the graph owns; a replay re-runs the same
kernels on the same addresses, so the caller fills the input buffers, replays, and reads the
outputs the capture returned. Every graph of a runtime shares one memory pool: they never
run concurrently and each graph's outputs are consumed before the next replay.

`Backend` is what captures: `CudaBackend` on a GPU. Tests on a CPU hand the runtime a
backend whose replay re-runs the captured call into the captured outputs, which keeps the
static-buffer discipline honest where no GPU is at hand.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable, Protocol

import torch
from torch.utils._pytree import tree_leaves

Call = Callable[[], Any]  # a call on static buffers -> a tensor or a tuple of tensors


class Captured(Protocol):
    outputs: Any  # what the call returned at capture (its tensors are rewritten by each replay)

    def replay(self) -> None: ...


class Backend(Protocol):
    def capture(self, call: Call) -> Captured: ...


class CudaCaptured:
    def __init__(self, graph: "torch.cuda.CUDAGraph", outputs: Any):
        self.graph, self.outputs = graph, outputs

    def replay(self) -> None:
        self.graph.replay()


class CudaBackend:
    """torch.cuda.CUDAGraph capture: `warmup` calls on a side stream first (lazy kernel loads,
    AOTInductor's first-run constant folding and cuBLAS workspaces stay out of the graph)."""

    def __init__(self, device: torch.device, warmup: int = 2):
        self.device, self.warmup = device, warmup
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, call: Call) -> CudaCaptured:
        with torch.cuda.device(self.device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(self.warmup):
                    call()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread_local: an unsafe CUDA call of another thread (the text thread) cannot
            # invalidate this capture
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                outputs = call()
            torch.cuda.synchronize(self.device)
        return CudaCaptured(graph, outputs)


class GraphSet:
    """The captured graphs of one runtime, by key (e.g. width bucket, rows bucket, parity)."""

    def __init__(self, backend: Backend):
        self.backend = backend
        self._graphs: dict[Hashable, Captured] = {}

    def capture(self, key: Hashable, call: Call) -> None:
        self._graphs[key] = self.backend.capture(call)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._graphs

    def keys(self) -> list[Hashable]:
        return list(self._graphs)

    def replay(self, key: Hashable) -> Any:
        """Run the graph of `key` on what its static buffers hold now -> its outputs."""
        captured = self._graphs[key]
        captured.replay()
        return captured.outputs

    def nbytes(self) -> int:
        """Bytes of the graphs' outputs (their pool holds at least these)."""
        return sum(t.numel() * t.element_size() for c in self._graphs.values()
                   for t in tree_leaves(c.outputs) if isinstance(t, torch.Tensor))
