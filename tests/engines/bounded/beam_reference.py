"""Helpers of the beam tests: the beam task (eager) for a model directory -- the same walk
the engine serves, from prepared jobs to results --, transformers `generate` as the
reference, and the comparison of two beam lists."""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from engines.base import Bounds
from engines.bounded.model.precision import PrecisionPolicy
from engines.bounded.plan import BeamPlan
from engines.bounded.runtime.beam import BeamRuntime
from engines.bounded.runtime.beam_batch import BeamJob, BeamOutput
from engines.bounded.tasks.beam import BeamTask
from engines.hf import allowed_trie
from engines.tokens import eos_ids

PAD_ID = 151643
_tasks: dict = {}
_refs: dict = {}


class Walker:
    """The beam task of one model, dtype and plan, started eagerly; `run(jobs)` is its batch
    scope (prefill, step 1..S, format), the beams as BeamOutput."""

    def __init__(self, model_dir, dtype: str, plan: BeamPlan, compile_mode: str = "eager", device: str = "cpu",
                 **runtime_options):
        from harness.workload.requests import load_tokenizer

        runtime = BeamRuntime(model_dir, PrecisionPolicy(dtype), device, plan, eos_ids(model_dir), compile_mode,
                              lambda s: None, **runtime_options)
        self.runtime = runtime
        bounds = Bounds(1, plan.max_prompt, plan.max_width, plan.max_steps)
        self.task = BeamTask(runtime, bounds, plan)
        self.task.start(load_tokenizer(str(model_dir)))
        self.buffers = runtime.buffers

    def run(self, jobs: Sequence[BeamJob]) -> list[BeamOutput]:
        results = self.task.run(list(jobs), {})
        return [BeamOutput([b.token_ids for b in r.beams], [b.logprob for b in r.beams]) for r in results]


def runner(model_dir, dtype: str = "float32", plan: BeamPlan = BeamPlan(4, 400, 5, 512),
           compile_mode: str = "eager", device: str = "cpu", **runtime_options) -> Walker:
    """The started walk of a model, dtype, plan, device and BeamRuntime options (cached)."""
    key = (str(model_dir), dtype, plan, compile_mode, device, tuple(sorted(runtime_options.items())))
    if key not in _tasks:
        _tasks[key] = Walker(model_dir, dtype, plan, compile_mode, device, **runtime_options)
    return _tasks[key]


def hf_model(model_dir, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    key = (str(model_dir), dtype)
    if key not in _refs:
        _refs[key] = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    return _refs[key]


@torch.no_grad()
def hf_beams(model_dir, prompt: Sequence[int], width: int, steps: int,
             allowed: Optional[Sequence[Sequence[int]]] = None, dtype=torch.float32) -> BeamOutput:
    """transformers generate, called as engines/hf.py calls it (width 1 is greedy there:
    its score is summed from the log-softmax of the raw logits)."""
    ids = torch.tensor([list(prompt)])
    kw = {}
    if allowed is not None:
        trie = allowed_trie(allowed)
        n = len(prompt)
        kw["prefix_allowed_tokens_fn"] = lambda _b, seq: trie.get(tuple(seq[n:].tolist()), [])
    out = hf_model(model_dir, dtype).generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), num_beams=width, num_return_sequences=width,
        max_new_tokens=steps, min_new_tokens=steps, do_sample=False, length_penalty=0.0,
        early_stopping=False, eos_token_id=eos_ids(model_dir), pad_token_id=PAD_ID,
        output_scores=True, output_logits=True, return_dict_in_generate=True, **kw)
    tokens = out.sequences[:, len(prompt):].tolist()
    if width > 1:
        return BeamOutput(tokens, out.sequences_scores.float().tolist())
    score = sum(torch.log_softmax(lg[0].float(), -1)[t].item() for lg, t in zip(out.logits, tokens[0]))
    return BeamOutput(tokens, [score])


# Transformers' float32 log_softmax over the presets' 151,936 logits is itself off by up to
# ~2.5e-5 a step (tiny preset, step 0: -1.589310 against the float64 -1.589332; its float32
# logsumexp is within 1e-7): the fused float32 head (csrc/beam_head_f32.cpp, within ~4e-6 of
# float64) therefore sits ~1.3e-4 from the reference after 5 steps, the aten path ~0. SCORE_TOL
# covers 5 steps of that bias; a wrong token or a real error still fails.
SCORE_TOL = 2e-4


def assert_same_beams(got: BeamOutput, want: BeamOutput, tol: float = SCORE_TOL) -> int:
    """Equal token for token and in order, scores within `tol`; two beams whose reference
    scores are within `tol` of each other (a float tie) may trade places, or, at the end of
    the list, the last one may be the other beam of the tie. Returns how many rows traded."""
    assert len(got.tokens) == len(want.tokens), (len(got.tokens), len(want.tokens))
    for i, (g, w) in enumerate(zip(got.scores, want.scores)):
        assert abs(g - w) < tol, f"beam {i}: score {g} vs reference {w}"
    where = {tuple(t): i for i, t in enumerate(want.tokens)}
    traded = 0
    for i, toks in enumerate(got.tokens):
        if toks == want.tokens[i]:
            continue
        traded += 1
        j = where.get(tuple(toks))
        ref_score = want.scores[j] if j is not None else got.scores[i]
        assert abs(ref_score - want.scores[i]) < tol and (j is not None or i >= len(want.tokens) - 2), \
            f"beam {i}: {toks} ({got.scores[i]}) vs reference {want.tokens[i]} ({want.scores[i]})"
    assert traded <= max(2, len(got.tokens) // 50), f"{traded} beams out of order"
    return traded


def overlap(got: BeamOutput, want: BeamOutput) -> float:
    """Share of the reference's beams (as token sequences) that `got` also returns."""
    ours = {tuple(t) for t in got.tokens}
    return sum(tuple(t) in ours for t in want.tokens) / len(want.tokens)
