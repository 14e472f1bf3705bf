"""transformers baseline: what a competent engineer writes with transformers alone — a padded
batch per business request, SDPA attention, `logits_to_keep=1` for scoring, and
`generate(num_beams=...)` for beams. It is also the correctness reference: a query request
is scored as its concatenations query + item_i, each a full sample (no sharing)."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from engines.base import (Beam, BeamRequest, BeamResult, Description, Engine, EngineUnavailable, PrefillRequest,
                          PrefillResult, Request, Result)
from engines.tokens import eos_ids
from engines.validate import Limits, RequestChecker


class HFEngine(Engine):
    name = "hf"
    takes_query_requests = True  # the checker gives a query request's concatenations

    @classmethod
    def check_available(cls, config) -> None:
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
        except ImportError as e:
            raise EngineUnavailable(f"transformers/torch not installed: {e}") from e

    def start(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        path = str(self.config.model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(
            path, dtype=getattr(torch, self.config.dtype), attn_implementation="sdpa"
        ).to(self.config.device).eval()
        self.eos = eos_ids(path)
        self.checker = RequestChecker(Limits.for_model(path, self.config.bounds), self.tokenizer)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="hf")  # one model call at a time

    def resize(self, bounds) -> bool:
        """Bounds only check requests here (the model is loaded whatever they are)."""
        self.config = replace(self.config, bounds=bounds)
        self.checker = RequestChecker(Limits.for_model(str(self.config.model_dir), bounds), self.tokenizer)
        return True

    def stop(self) -> None:
        if hasattr(self, "_pool"):
            self._pool.shutdown(wait=True)

    def describe(self) -> Description:
        import torch
        import transformers

        return replace(super().describe(), version=transformers.__version__).with_details(
            torch=torch.__version__, attention="sdpa", batching="padded batch per business request")

    async def submit(self, request: Request) -> Result:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self.run, request)

    def run(self, request: Request) -> Result:
        with self.torch.inference_mode():
            if isinstance(request, PrefillRequest):
                return self._score(request)
            return self._beams(request)

    def _score(self, req: PrefillRequest) -> PrefillResult:
        torch = self.torch
        checked = self.checker.prefill(req)
        seqs, labels = checked.seqs, checked.labels
        width = max(map(len, seqs))
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):  # left padding: every sample's last token is the last column
            ids[i, width - len(s):] = torch.tensor(s)
            mask[i, width - len(s):] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        dev = self.config.device
        out = self.model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev),
                         logits_to_keep=1)
        probs = out.logits[:, -1, labels].float().softmax(-1)
        return PrefillResult(req.id, probs.cpu().tolist())

    def _beams(self, req: BeamRequest) -> BeamResult:
        torch = self.torch
        checked = self.checker.beam(req)
        prompt, width = checked.prompt, checked.beam_width
        n, steps = len(prompt), checked.decode_steps
        ids = torch.tensor([prompt], device=self.config.device)
        kw: dict[str, Any] = {}
        if checked.allowed is not None:
            trie = allowed_trie(checked.allowed)
            kw["prefix_allowed_tokens_fn"] = lambda _b, seq: trie.get(tuple(seq[n:].tolist()), [])
        out = self.model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), num_beams=width,
            num_return_sequences=width, max_new_tokens=steps, min_new_tokens=steps,
            do_sample=False, length_penalty=0.0, early_stopping=False, eos_token_id=self.eos,
            pad_token_id=self.pad_id, output_scores=True, output_logits=width == 1, return_dict_in_generate=True, **kw,
        )
        gen = out.sequences[:, n:].tolist()
        if width == 1:  # greedy keeps no sequence score: as beam search scores it, the chosen tokens'
            # log-softmax of the raw logits (EOS masked after the softmax, not renormalised)
            steps_lp = [step.float().log_softmax(-1)[0, tok] for step, tok in zip(out.logits, gen[0])]
            scores = [float(sum(steps_lp))]
        else:
            scores = out.sequences_scores.float().tolist()
        beams = [Beam(g, self.tokenizer.decode(g), s) for g, s in zip(gen, scores)]
        return BeamResult(req.id, beams)


def allowed_trie(codes) -> dict[tuple[int, ...], list[int]]:
    """prefix -> allowed next tokens, for every proper prefix of every code."""
    trie: dict[tuple[int, ...], set[int]] = {}
    for code in codes:
        code = tuple(code)
        for k in range(len(code)):
            trie.setdefault(code[:k], set()).add(code[k])
    return {k: sorted(v) for k, v in trie.items()}
