"""The static DAG: order fixed at construction from what each node needs, per-node times
(host clock, or device events read once at the end), unmet inputs refused."""
from __future__ import annotations

import pytest

from engines.bounded.tasks.dag import Dag, DagError, EventClock, Node


def test_dag_orders_by_dependencies_and_times_nodes():
    calls = []

    def node(name, needs, scope="batch"):
        def fn(*values):
            calls.append(name)
            return sum(values) + 1
        return Node(name, fn, needs, scope)

    # declared out of order on purpose
    dag = Dag([node("c", ("b",)), node("a", ("x",), "request"), node("b", ("x",))],
              inputs={"request": ("x",), "batch": ("x",)})
    assert dag.names("batch") == ["b", "c"] and dag.names("request") == ["a"]
    stages = {}
    st = dag.run("batch", {"x": 1}, stages)
    assert calls == ["b", "c"] and st["c"] == 3 and list(stages) == ["b", "c"]


def test_dag_refuses_unmet_inputs():
    with pytest.raises(DagError, match="unmet inputs"):
        Dag([Node("a", lambda st: {}, ("missing",))], inputs={"batch": ("x",)})


def test_dag_passes_needs_in_order_and_refuses_bad_graphs():
    dag = Dag([Node("pair", lambda a, b: (a, b), ("y", "x"))], inputs={"batch": ("x", "y")})
    assert dag.run("batch", {"x": 1, "y": 2}, {})["pair"] == (2, 1)
    with pytest.raises(DagError, match="duplicate"):
        Dag([Node("a", lambda x: x, ("x",)), Node("a", lambda x: x, ("x",))], inputs={"batch": ("x",)})
    with pytest.raises(DagError, match="scopes are request, batch"):
        Dag([Node("a", lambda x: x, ("x",), scope="step")], inputs={"batch": ("x",)})


class FakeEvent:
    """A device event stand-in on a hand-set clock: records when told, waits for nothing."""

    now = 0.0

    def __init__(self):
        self.at, self.waited = None, False

    def record(self):
        self.at = FakeEvent.now

    def synchronize(self):
        self.waited = True

    def elapsed_time(self, end):
        return end.at - self.at


def test_event_clock_times_each_node_on_the_device_clock_and_waits_once():
    made = []

    def event():
        made.append(FakeEvent())
        return made[-1]

    def node(name, device_ms):
        def fn(*_):
            FakeEvent.now += device_ms  # the device finishes this node's work device_ms later
        return Node(name, fn, ())

    dag = Dag([node("a", 2.0), node("b", 0.5), node("c", 7.0)], inputs={})
    stages = {}
    dag.run("batch", {}, stages, EventClock(event))
    assert stages == {"a": 2.0, "b": 0.5, "c": 7.0}
    assert [e.waited for e in made] == [False, False, False, True]  # only the last event is waited on
