"""The static DAG (order fixed at construction, per-node times) and the batcher (merging
under a budget, per-request outcomes)."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from engines.bounded.batcher import Batcher, Budget
from engines.bounded.dag import Dag, DagError, Node


def test_dag_orders_by_dependencies_and_times_nodes():
    calls = []

    def node(name, needs, makes, scope="batch"):
        def fn(st):
            calls.append(name)
            return {m: sum(st[n] for n in needs) + 1 for m in makes}
        return Node(name, fn, needs, makes, scope)

    # declared out of order on purpose
    dag = Dag([node("c", ("b",), ("c",)), node("a", ("x",), ("a",), "request"), node("b", ("x",), ("b",))],
              inputs={"request": ("x",), "batch": ("x",)})
    assert dag.names("batch") == ["b", "c"] and dag.names("request") == ["a"]
    stages = {}
    st = dag.run("batch", {"x": 1}, stages)
    assert calls == ["b", "c"] and st["c"] == 3 and list(stages) == ["b", "c"]


def test_dag_refuses_unmet_inputs():
    with pytest.raises(DagError, match="unmet inputs"):
        Dag([Node("a", lambda st: {}, ("missing",), ("a",))], inputs={"batch": ("x",)})


def _pending_state(n_seqs, length, labels=(1, 2)):
    return {"seqs": [[0] * length] * n_seqs, "label_ids": list(labels)}


def test_batcher_merges_within_budget_and_isolates_outcomes():
    seen = []

    def execute(batch):
        seen.append(len(batch))
        return [ValueError("bad") if p.state.get("bad") else len(p.seqs) for p in batch]

    async def main():
        b = Batcher(execute, ThreadPoolExecutor(1), Budget(max_tokens=40, max_seqs=8, max_labels=3),
                    max_wait_s=0.05)
        states = [_pending_state(2, 10), _pending_state(2, 10), {**_pending_state(1, 5), "bad": True},
                  _pending_state(1, 10, labels=(7, 8))]  # 4th: label union would be 4 > 3
        out = await asyncio.gather(*(b.submit(s, {}) for s in states), return_exceptions=True)
        b.close()
        return out

    out = asyncio.run(main())
    assert out[0] == 2 and out[1] == 2 and isinstance(out[2], ValueError) and out[3] == 1
    # 2x10 + 2x10 = 40 tokens fit; the bad one (5 more) does not
    assert seen == [2, 1, 1]
