"""The static DAG: order fixed at construction from what each node needs, per-node times,
unmet inputs refused."""
from __future__ import annotations

import pytest

from engines.bounded.tasks.dag import Dag, DagError, Node


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
