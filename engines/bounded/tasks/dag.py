"""A static DAG of named stages and its executor.

The graph is fixed when a task is built; its topological order is computed once. A node is
a function of the outputs of the nodes it `needs` (or of the scope's inputs), passed in
that order; its own output is known by its name. Nodes have a scope: "request" nodes run
once per business request before batching, "batch" nodes once per merged batch. `run`
walks the precomputed order of one scope and records each node's time in milliseconds on
a clock: the host's (`HostClock`), or a device's (`EventClock`: an event recorded after
each node on the device's stream, read once at the end, when the result has been read
anyway -- so a GPU's time lands in the node that queued the work, and timing adds no wait).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

SCOPES = ("request", "batch")


@dataclass(frozen=True)
class Node:
    name: str  # also the name of its output
    fn: Callable[..., Any]  # fn(*outputs of `needs`) -> this node's output
    needs: tuple[str, ...]
    scope: str = "batch"


class DagError(ValueError):
    pass


class HostClock:
    """Stage times on the host: each node's wall time."""

    def __init__(self) -> None:
        self._last = time.perf_counter()

    def lap(self, stages: dict[str, float], name: str) -> None:
        now = time.perf_counter()
        stages[name], self._last = (now - self._last) * 1000.0, now

    def finish(self, stages: dict[str, float]) -> None:
        pass


class Event(Protocol):
    def record(self) -> None: ...

    def synchronize(self) -> None: ...

    def elapsed_time(self, end: "Event") -> float: ...  # milliseconds


class EventClock:
    """Stage times on a device's clock: `make_event()` (e.g. a timing torch.cuda.Event)
    recorded after each node; node i's time is the device time between the events before
    and after it, which is the longer of the host's and the device's time for it."""

    def __init__(self, make_event: Callable[[], Event]):
        self.make_event = make_event
        self._marks: list[tuple[str, Event]] = [("", self._record())]

    def _record(self) -> Event:
        event = self.make_event()
        event.record()
        return event

    def lap(self, stages: dict[str, float], name: str) -> None:
        self._marks.append((name, self._record()))

    def finish(self, stages: dict[str, float]) -> None:
        self._marks[-1][1].synchronize()
        for (_, start), (name, end) in zip(self._marks, self._marks[1:]):
            stages[name] = start.elapsed_time(end)


Clock = HostClock | EventClock


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

    def run(self, scope: str, values: dict[str, Any], stages: dict[str, float],
            clock: Optional[Clock] = None) -> dict[str, Any]:
        """values: the scope's inputs by name -> also every node's output by node name; each
        node's time into `stages` (clock: the host's by default)."""
        clock = HostClock() if clock is None else clock
        for node in self.order[scope]:
            values[node.name] = node.fn(*(values[n] for n in node.needs))
            clock.lap(stages, node.name)
        clock.finish(stages)
        return values
