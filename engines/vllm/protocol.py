"""The vLLM 0.32 HTTP bodies for our two tasks (all on its OpenAI `POST /v1/completions`),
and the mapping of its answers back to our results. Pure functions: no I/O, so the mapping
is tested without a server.

prefill_only -> one completions call per business request: `prompt` is the list of the
samples' token-id lists (a query request's samples are query + item_i: vLLM's prefix cache
shares the query's full KV blocks between them), `max_tokens: 1`, and `logprob_token_ids` = the labels, which makes
vLLM return each label's full-vocabulary log-probability at the sample's last position
(computed in float32 from the raw logits, whatever the token sampled). The client
normalises them over the labels: exactly our label softmax. Why this route and not vLLM's
`/generative_scoring` (PR #34539, same one-token reads underneath, one prompt per item):
that route returns only the first label's probability per item, so a request with more
than two labels would need one call per label; completions gives all labels in one call.
`return_tokens_as_token_ids` keys the log-probs by token id ("token_id:9454"), not by text
(two ids can decode to the same string). Special-token labels are accepted.

beam_search -> `use_beam_search: true`, `n = W` (vLLM's beam width is `n`), `max_tokens = S`,
`temperature: 0`. vLLM's beam search runs in its API server, outside the engine core: at
each step every live beam is sent to the engine as its own one-token request asking for
the top 2W log-probs (so the server needs `--max-logprobs` >= 2W), and the W best
continuations are kept. Its BeamSearchParams carry no `min_tokens`, so `ignore_eos: true`
is what keeps EOS from ending a beam (EOS then stays a candidate like any token, with its
real log-prob: a beam can carry it, where transformers' `min_new_tokens` masks it; rare at
W << vocabulary). Beams are sorted by cumulative log-prob / len(prompt + beam) **
length_penalty; `length_penalty: 0` makes that the cumulative log-prob (every beam has S
tokens anyway). The answer's choices are the W beams best first; `logprobs: 0` puts each
chosen token's log-prob in `token_logprobs`, whose sum is the beam's cumulative log-prob.
vLLM's online beam search drops structured outputs and `allowed_token_ids` (it builds its
own one-token sampling parameters), so item-code constraints cannot be applied with beams.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from engines.base import Beam, EngineError

TOKEN_KEY = "token_id:{}"


def score_body(items: Sequence[Sequence[int]], label_ids: Sequence[int]) -> dict[str, Any]:
    return {"prompt": [list(i) for i in items], "max_tokens": 1, "temperature": 0,
            "logprobs": len(label_ids), "logprob_token_ids": list(label_ids),
            "return_tokens_as_token_ids": True}


def parse_scores(payload: Any, n_items: int, label_ids: Sequence[int]) -> list[list[float]]:
    choices = sorted(_choices(payload, n_items, "samples"), key=lambda c: c.get("index", 0))
    return [_label_softmax(c, i, label_ids) for i, c in enumerate(choices)]


def _label_softmax(choice: dict[str, Any], i: int, label_ids: Sequence[int]) -> list[float]:
    try:
        top = choice["logprobs"]["top_logprobs"][0]
        logprobs = [float(top[TOKEN_KEY.format(t)]) for t in label_ids]
    except (KeyError, IndexError, TypeError) as e:
        raise EngineError(f"vLLM /v1/completions returned no log-prob for label {e} of sample {i}: "
                          f"{str(choice.get('logprobs'))[:200]}") from None
    top_lp = max(logprobs)
    exps = [math.exp(lp - top_lp) for lp in logprobs]
    total = sum(exps)
    return [x / total for x in exps]


def beam_body(prompt: Sequence[int], beam_width: int, decode_steps: int) -> dict[str, Any]:
    return {"prompt": list(prompt), "use_beam_search": True, "n": beam_width, "max_tokens": decode_steps,
            "temperature": 0, "ignore_eos": True, "length_penalty": 0.0, "logprobs": 0,
            "return_token_ids": True, "return_tokens_as_token_ids": True}


def parse_beams(payload: Any, beam_width: int) -> list[Beam]:
    choices = _choices(payload, beam_width, "beams")
    return [_beam(c) for c in sorted(choices, key=lambda c: c.get("index", 0))]


def _beam(choice: dict[str, Any]) -> Beam:
    ids = choice.get("token_ids")
    logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
    if not ids or not isinstance(logprobs, list) or len(logprobs) != len(ids) or None in logprobs:
        raise EngineError(f"vLLM beam without token_ids or their log-probs: {str(choice)[:200]}")
    return Beam(token_ids=[int(t) for t in ids], text=choice.get("text", ""),
                logprob=math.fsum(float(lp) for lp in logprobs))


def _choices(payload: Any, n: int, what: str) -> list[dict[str, Any]]:
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or len(choices) != n or not all(isinstance(c, dict) for c in choices):
        got = len(choices) if isinstance(choices, list) else type(choices).__name__
        raise EngineError(f"vLLM /v1/completions returned {got} choices for {n} {what}")
    return choices
