"""The batcher: the work-conserving policy (an idle model starts at once, a busy one
coalesces what arrives meanwhile), merging under a task's budget, per-request outcomes, the
request scope run in the model thread, callers that give up, closing, and the beam rule
(requests with different decode steps never share a run)."""
from __future__ import annotations

import asyncio
import threading

import pytest

from engines.base import EngineError
from engines.bounded.plan import BeamPlan, PrefillPlan
from engines.bounded.runtime.beam_batch import BeamJob
from engines.bounded.tasks.batcher import Batcher
from engines.bounded.tasks.beam import BeamUsage
from engines.bounded.tasks.prefill import PrefillUsage, ScoreItem


def _item(n_seqs, length, labels=(1, 2), id="r"):
    return ScoreItem(id, [[0] * length] * n_seqs, list(labels))


def test_batcher_merges_within_budget_and_isolates_outcomes():
    seen = []

    def execute(batch):
        seen.append(len(batch))
        return [ValueError("bad") if p.item.id == "bad" else len(p.item.seqs) for p in batch]

    async def main():
        budget = PrefillPlan(max_tokens=40, max_seqs=8, max_len=40, max_labels=3)
        b = Batcher(execute, lambda: PrefillUsage(budget), max_wait_s=0.05)
        items = [_item(2, 10), _item(2, 10), _item(1, 5, id="bad"),
                 _item(1, 10, labels=(7, 8))]  # 4th: label union would be 4 > 3
        out = await asyncio.gather(*(b.submit(s, {}) for s in items), return_exceptions=True)
        b.close()
        return out

    out = asyncio.run(main())
    assert out[0] == 2 and out[1] == 2 and isinstance(out[2], ValueError) and out[3] == 1
    # 2x10 + 2x10 = 40 tokens fit; the bad one (5 more) does not
    assert seen == [2, 1, 1]


def _gated(seen):
    """An execute that records each batch's ids and waits for `gate` before answering."""
    gate = threading.Event()

    def execute(batch):
        seen.append([p.item.id for p in batch])
        gate.wait(5)
        return [p.item.id for p in batch]
    return execute, gate


def test_a_caller_that_gives_up_while_queued_never_reaches_the_model():
    seen = []
    execute, gate = _gated(seen)

    async def main():
        b = Batcher(execute, lambda: PrefillUsage(PrefillPlan(100, 1, 100, 8)), 0.0)
        first = asyncio.ensure_future(b.submit(_item(1, 5, id="first"), {}))
        await asyncio.sleep(0.05)  # "first" is in the model now; the next two queue
        gone = asyncio.ensure_future(b.submit(_item(1, 5, id="gone"), {}))
        kept = asyncio.ensure_future(b.submit(_item(1, 5, id="kept"), {}))
        await asyncio.sleep(0.01)
        gone.cancel()
        gate.set()
        out = await asyncio.gather(first, kept)
        b.close()
        return out, gone.cancelled()

    (first, kept), cancelled = asyncio.run(main())
    assert (first, kept, cancelled) == ("first", "kept", True)
    assert seen == [["first"], ["kept"]]


def test_a_caller_that_gives_up_during_the_run_leaves_the_others_their_results():
    seen = []
    execute, gate = _gated(seen)

    async def main():
        b = Batcher(execute, lambda: PrefillUsage(PrefillPlan(100, 8, 100, 8)), 0.02)
        futs = [asyncio.ensure_future(b.submit(_item(1, 5, id=i), {})) for i in "abc"]
        await asyncio.sleep(0.1)  # all three in one run, which waits for the gate
        futs[1].cancel()
        gate.set()
        out = await asyncio.gather(*futs, return_exceptions=True)
        b.close()
        return out

    a, b_, c = asyncio.run(main())
    assert seen == [["a", "b", "c"]] and (a, c) == ("a", "c") and isinstance(b_, asyncio.CancelledError)


def test_close_fails_what_it_holds_and_refuses_more():
    seen = []
    execute, gate = _gated(seen)

    async def main():
        b = Batcher(execute, lambda: PrefillUsage(PrefillPlan(100, 1, 100, 8)), 0.0)
        running = asyncio.ensure_future(b.submit(_item(1, 5, id="running"), {}))
        await asyncio.sleep(0.05)
        queued = asyncio.ensure_future(b.submit(_item(1, 5, id="queued"), {}))
        await asyncio.sleep(0.01)
        b.close()
        out = await asyncio.wait_for(asyncio.gather(running, queued, return_exceptions=True), 2)
        gate.set()
        with pytest.raises(EngineError, match="stopping"):
            await b.submit(_item(1, 5, id="late"), {})
        return out

    running, queued = asyncio.run(main())
    assert all(isinstance(o, EngineError) and "stopped before answering" in str(o) for o in (running, queued))
    assert seen == [["running"]]  # the queued one never reached the model


def test_beams_with_different_decode_steps_never_share_a_run():
    seen = []

    def execute(batch):
        seen.append([(p.item.id, p.item.steps) for p in batch])
        return [p.item.id for p in batch]

    async def main():
        b = Batcher(execute, lambda: BeamUsage(BeamPlan(2, 8, 4, 16)), 0.05)
        jobs = [BeamJob([1], 8, steps, id=f"r{i}") for i, steps in enumerate((2, 2, 2, 3, 2))]
        out = await asyncio.gather(*(b.submit(j, {}) for j in jobs))
        b.close()
        return out

    assert asyncio.run(main()) == ["r0", "r1", "r2", "r3", "r4"]
    # at most 2 requests per run (the plan), equal steps within a run, arrival order kept
    assert seen == [[("r0", 2), ("r1", 2)], [("r2", 2)], [("r3", 3)], [("r4", 2)]]


def _started_gate(seen):
    """An execute that records each batch's ids, says when a run started, and waits for `gate`."""
    started, gate = threading.Event(), threading.Event()

    def execute(batch):
        seen.append([p.item.id for p in batch])
        started.set()
        gate.wait(5)
        return [p.item.id for p in batch]
    return execute, started, gate


def test_an_idle_model_starts_at_once_and_a_busy_one_coalesces():
    seen = []
    execute, started, gate = _started_gate(seen)

    async def main():
        b = Batcher(execute, lambda: PrefillUsage(PrefillPlan(100, 8, 100, 8)))  # max_wait 0: the default
        first = asyncio.ensure_future(b.submit(_item(1, 5, id="a"), {}))
        # "a" reaches the model alone, with nobody else queued: nothing holds it for company
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 5)
        later = [asyncio.ensure_future(b.submit(_item(1, 5, id=i), {})) for i in "bcd"]
        await asyncio.sleep(0.05)  # b, c, d queue while "a" runs
        gate.set()
        out = await asyncio.gather(first, *later)
        b.close()
        return out

    assert asyncio.run(main()) == ["a", "b", "c", "d"]
    assert seen == [["a"], ["b", "c", "d"]]


def test_a_lone_requests_small_call_may_split_while_a_busy_hosts_stays_on_one_thread():
    """runtime/compiled.threads_for inside the batcher's calls: a call of SERIAL_FLOPS splits
    across the team for a lone request, and stays on one thread for requests merged while
    another ran (the callers' side is busy then)."""
    import torch

    from engines.bounded.runtime.compiled import SERIAL_FLOPS, SERIAL_FLOPS_BUSY, threads_for

    before = torch.get_num_threads()
    if before < 2:
        pytest.skip("one thread here: nothing to tell apart")
    threads, started, gate = [], threading.Event(), threading.Event()

    def execute(batch):
        with threads_for(torch.device("cpu"), SERIAL_FLOPS):
            small = torch.get_num_threads()
        with threads_for(torch.device("cpu"), SERIAL_FLOPS_BUSY):
            big = torch.get_num_threads()
        threads.append((len(batch), small, big))
        started.set()
        gate.wait(5)
        return [p.item.id for p in batch]

    async def main():
        b = Batcher(execute, lambda: PrefillUsage(PrefillPlan(100, 8, 100, 8)))
        first = asyncio.ensure_future(b.submit(_item(1, 5, id="a"), {}))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 5)
        later = [asyncio.ensure_future(b.submit(_item(1, 5, id=i), {})) for i in "bc"]
        await asyncio.sleep(0.05)  # b and c queue while "a" runs
        gate.set()
        await asyncio.gather(first, *later)
        b.close()

    asyncio.run(main())
    assert threads == [(1, before, before), (2, 1, before)]
    assert torch.get_num_threads() == before


def test_max_wait_is_an_upper_bound_a_full_batch_leaves_at_once():
    seen = []

    def execute(batch):
        seen.append([p.item.id for p in batch])
        return [p.item.id for p in batch]

    async def main():
        # room for two requests of 10 tokens; an hour's wait would hold a batch with room
        b = Batcher(execute, lambda: PrefillUsage(PrefillPlan(20, 8, 20, 8)), max_wait_s=3600.0)
        out = await asyncio.wait_for(asyncio.gather(*(b.submit(_item(1, 10, id=i), {}) for i in "ab")), 30)
        b.close()
        return out

    assert asyncio.run(main()) == ["a", "b"] and seen == [["a", "b"]]


def test_the_request_scope_runs_in_the_model_thread_and_a_bad_request_fails_alone():
    seen, threads = [], set()

    def prepare(request, stages):
        threads.add(threading.current_thread().name)
        if request == "bad":
            raise ValueError("bad request")
        stages["tokenize"] = 0.0
        return _item(1, 5, id=request)

    def execute(batch):
        threads.add(threading.current_thread().name)
        seen.append([p.item.id for p in batch])
        return [p.item.id for p in batch]

    async def main():
        b = Batcher(execute, lambda: PrefillUsage(PrefillPlan(100, 8, 100, 8)), prepare=prepare, name="model-x")
        out = await asyncio.gather(*(b.submit(r, {}) for r in ("a", "bad", "c")), return_exceptions=True)
        b.close()
        return out

    a, bad, c = asyncio.run(main())
    assert (a, c) == ("a", "c") and isinstance(bad, ValueError)
    assert threads == {"model-x"} and sorted(i for ids in seen for i in ids) == ["a", "c"]


def test_setup_runs_on_the_model_thread_before_any_call():
    """The task's start runs where its calls will (one OpenMP master per engine, batcher.py)."""
    where, order = [], []

    def setup():
        where.append(threading.get_ident())
        order.append("setup")

    def execute(batch):
        where.append(threading.get_ident())
        order.append("call")
        return [p.item.id for p in batch]

    async def main():
        b = Batcher(execute, lambda: PrefillUsage(PrefillPlan(100, 8, 100, 8)), setup=setup)
        b.ready(5)
        out = await b.submit(_item(1, 5, id="a"), {})
        b.close()
        return out

    assert asyncio.run(main()) == "a"
    assert order == ["setup", "call"] and len(set(where)) == 1 and where[0] != threading.get_ident()


def test_a_failed_setup_reaches_the_starter_and_nothing_is_served():
    def setup():
        raise RuntimeError("no package")

    async def main():
        b = Batcher(lambda batch: [1] * len(batch), lambda: PrefillUsage(PrefillPlan(100, 8, 100, 8)), setup=setup)
        with pytest.raises(RuntimeError, match="no package"):
            b.ready(5)
        with pytest.raises(EngineError, match="stopping"):
            await b.submit(_item(1, 5), {})
        b.join(5)

    asyncio.run(main())
