"""A static DAG of named stages and its executor.

The graph is fixed when a task is built; its topological order is computed once. A node is
a function of the outputs of the nodes it `needs` (or of the scope's inputs), passed in
that order; its own output is known by its name. Nodes have a scope: "request" nodes run
once per business request before batching, "batch" nodes once per merged batch. `run`
walks the precomputed order of one scope and records each node's time in milliseconds.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

SCOPES = ("request", "batch")


@dataclass(frozen=True)
class Node:
    name: str  # also the name of its output
    fn: Callable[..., Any]  # fn(*outputs of `needs`) -> this node's output
    needs: tuple[str, ...]
    scope: str = "batch"


class DagError(ValueError):
    pass


@contextmanager
def timed(stages: dict[str, float], name: str) -> Iterator[None]:
    """Record the block's wall time in milliseconds as `stages[name]`."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        stages[name] = (time.perf_counter() - t0) * 1000.0


class Dag:
    def __init__(self, nodes: list[Node], inputs: dict[str, tuple[str, ...]]):
        """`inputs[scope]`: the names of the values given from outside when that scope starts."""
        self.nodes = {n.name: n for n in nodes}
        if len(self.nodes) != len(nodes):
            raise DagError("duplicate node names")
        for n in nodes:
            if n.scope not in SCOPES:
                raise DagError(f"node {n.name}: scope {n.scope!r}; scopes are {', '.join(SCOPES)}")
        self.order = {scope: self._order([n for n in nodes if n.scope == scope], inputs.get(scope, ()))
                      for scope in SCOPES}

    @staticmethod
    def _order(nodes: list[Node], inputs: tuple[str, ...]) -> tuple[Node, ...]:
        available = set(inputs)
        pending, order = list(nodes), []
        while pending:
            ready = [n for n in pending if set(n.needs) <= available]
            if not ready:
                missing = {n.name: sorted(set(n.needs) - available) for n in pending}
                raise DagError(f"DAG cannot run: unmet inputs {missing}")
            for n in ready:
                order.append(n)
                available.add(n.name)
                pending.remove(n)
        return tuple(order)

    def names(self, scope: str) -> list[str]:
        return [n.name for n in self.order[scope]]

    def run(self, scope: str, values: dict[str, Any], stages: dict[str, float]) -> dict[str, Any]:
        """values: the scope's inputs by name -> also every node's output by node name."""
        for node in self.order[scope]:
            with timed(stages, node.name):
                values[node.name] = node.fn(*(values[n] for n in node.needs))
        return values
