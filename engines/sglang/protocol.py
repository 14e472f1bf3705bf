"""The SGLang 0.5.23 HTTP bodies for our two tasks, and the mapping of its answers back to
our results. Pure functions: no I/O, so the mapping is tested without a server.

The engine sends token ids (tokenized with the model's tokenizer, as every engine is), so
the server scores exactly the tokens the other engines score.

prefill_only -> POST /v1/score. SGLang scores each `query + item` as its own sequence
(token lists concatenated) and reads the label log-probs at its last position;
`apply_softmax` renormalises over the label tokens. A query request is sent as it is (its
query and items); plain samples go with an empty query, each item exactly one sample. So a
business request is one call. SGLang's radix cache (on unless `--disable-radix-cache`)
computes a shared query prefix once. Its multi-item scoring (`--enable-mis` in 0.5.23,
`--multi-item-scoring-delimiter` before) packs query<d>item1<d>item2<d>... into one
sequence and reads the labels at each delimiter d (token 9999), which is not the
concatenation's last position: different answers, and it needs the flashinfer attention
backend (a GPU); it cannot start on a CPU.
SGLang refuses label ids at or above the tokenizer's base vocabulary (151643 for Qwen:
the special tokens) and duplicate labels, with HTTP 400.

beam_search -> POST /generate with `sampling_params.beam_width`. SGLang returns the beams
in `meta_info.beam_results[]`, best first by `sequence_score` = cumulative log-prob /
length (length_penalty 1; the cumulative log-prob itself is not returned). It refuses
`min_new_tokens` with beams, so a beam may end early on EOS; such a beam is kept as is,
shorter than `decode_steps`. Width 1 is not a beam request to SGLang: it is sent as greedy
decoding, where `min_new_tokens` does work and log-probs are returned.
"""
from __future__ import annotations

from typing import Any, Sequence

from engines.base import Beam, EngineError

def score_body(query: Sequence[int], items: Sequence[Sequence[int]], label_ids: Sequence[int]) -> dict[str, Any]:
    """Sample i is query + items[i]; an empty query scores each item alone."""
    return {"query": list(query), "items": [list(i) for i in items], "label_token_ids": list(label_ids),
            "apply_softmax": True}


def parse_scores(payload: Any, n_items: int, n_labels: int) -> list[list[float]]:
    scores = payload.get("scores") if isinstance(payload, dict) else None
    if not isinstance(scores, list) or len(scores) != n_items:
        got = len(scores) if isinstance(scores, list) else type(scores).__name__
        raise EngineError(f"SGLang /v1/score returned {got} score rows for {n_items} samples")
    for row in scores:
        if not isinstance(row, list) or len(row) != n_labels:
            raise EngineError(f"SGLang /v1/score returned a row {row!r} for {n_labels} labels")
    return [[float(p) for p in row] for row in scores]


def generate_body(prompt: Sequence[int], beam_width: int, decode_steps: int) -> dict[str, Any]:
    body: dict[str, Any] = {"input_ids": list(prompt)}
    if beam_width == 1:  # greedy: SGLang treats beam_width 1 as "no beam search"
        body["sampling_params"] = {"max_new_tokens": decode_steps, "min_new_tokens": decode_steps,
                                   "temperature": 0}
        body["return_logprob"] = True
        return body
    body["sampling_params"] = {"beam_width": beam_width, "n": beam_width,
                               "max_new_tokens": decode_steps, "temperature": 0}
    return body


def parse_beams(payload: Any, beam_width: int) -> list[Beam]:
    if not isinstance(payload, dict) or not isinstance(payload.get("meta_info"), dict):
        raise EngineError(f"SGLang /generate returned no meta_info: {str(payload)[:200]}")
    if beam_width == 1:
        return [_greedy_beam(payload)]
    results = payload["meta_info"].get("beam_results")
    if not isinstance(results, list) or not results:
        raise EngineError("SGLang /generate returned no meta_info.beam_results for a beam request")
    return [_beam(r) for r in results]


def _beam(result: dict[str, Any]) -> Beam:
    ids = [int(t) for t in result.get("output_ids") or []]
    score = (result.get("meta_info") or {}).get("sequence_score")
    if score is None or not ids:
        raise EngineError(f"SGLang beam result without output_ids or sequence_score: {str(result)[:200]}")
    return Beam(token_ids=ids, text=result.get("text", ""), logprob=float(score) * len(ids))


def _greedy_beam(payload: dict[str, Any]) -> Beam:
    ids = [int(t) for t in payload.get("output_ids") or []]
    logprobs = payload["meta_info"].get("output_token_logprobs") or []
    if len(logprobs) != len(ids):
        raise EngineError(f"SGLang returned {len(logprobs)} log-probs for {len(ids)} tokens")
    return Beam(token_ids=ids, text=payload.get("text", ""), logprob=float(sum(lp[0] for lp in logprobs)))
