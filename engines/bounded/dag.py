"""A static DAG of named stages and its executor.

The graph is fixed when the engine starts (from the task kind); its topological order is
computed once. Each node reads named values from a state dict and writes its own outputs.
Nodes have a scope: "request" nodes run once per business request before batching,
"batch" nodes once per merged batch. `run` walks the precomputed order of one scope and
records each node's time in milliseconds.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

SCOPES = ("request", "batch")


@dataclass(frozen=True)
class Node:
    name: str
    fn: Callable[[dict[str, Any]], dict[str, Any]]  # state -> new values (names in `makes`)
    needs: tuple[str, ...]
    makes: tuple[str, ...]
    scope: str = "batch"


class DagError(ValueError):
    pass


class Dag:
    def __init__(self, nodes: list[Node], inputs: dict[str, tuple[str, ...]]):
        """`inputs[scope]`: the state names given from outside when that scope starts."""
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
                available |= set(n.makes)
                pending.remove(n)
        return tuple(order)

    def names(self, scope: str) -> list[str]:
        return [n.name for n in self.order[scope]]

    def run(self, scope: str, state: dict[str, Any], stages: dict[str, float]) -> dict[str, Any]:
        for node in self.order[scope]:
            t0 = time.perf_counter()
            out = node.fn(state)
            stages[node.name] = (time.perf_counter() - t0) * 1000.0
            state.update(out)
        return state
