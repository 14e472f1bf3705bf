"""`bench infer`: requests from a JSONL file through one engine, answers to a JSONL file.
The engine's bounds are sized from the input (a query request's query and items by their
own bounds, max_query_tokens and max_item_tokens)."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Callable

from engines.base import (BeamRequest, BeamResult, Bounds, EngineConfig, PrefillRequest, Request,
                          RequestRejected, Result)
from engines.registry import create_engine
from engines.tokens import encode
from engines.validate import split_query
from harness.presets import resolve_model
from harness.workload import load_tokenizer, read_jsonl


def bounds_for(requests: list[Request], tokenizer: Any) -> Bounds:
    scoring = [r for r in requests if isinstance(r, PrefillRequest)]
    beams = [r for r in requests if isinstance(r, BeamRequest)]
    prompts = [s for r in scoring if not r.has_query for s in r.samples] + [r.prompt for r in beams]
    splits = []
    for r in scoring:
        if r.has_query:
            try:
                splits.append(split_query(tokenizer, r.query, r.items))
            except (RequestRejected, TypeError, ValueError):
                pass  # malformed: the engine answers this one with its error
    return Bounds(
        max_samples_per_request=max([r.num_samples for r in scoring], default=1),
        max_prompt_tokens=max([len(encode(tokenizer, s)) for s in prompts], default=1),
        max_beam_width=max([r.beam_width for r in beams], default=1),
        max_decode_steps=max([r.decode_steps for r in beams], default=1),
        max_query_tokens=max([len(q) for q, _ in splits], default=1),
        max_item_tokens=max([len(i) for _, items in splits for i in items], default=1),
    )


def result_line(result: Result) -> dict[str, Any]:
    if isinstance(result, BeamResult):
        return {"id": result.id, "beams": [{"token_ids": b.token_ids, "text": b.text, "logprob": b.logprob}
                                           for b in result.beams]}
    return {"id": result.id, "scores": result.scores}


def infer_file(engine_name: str, model: str, input: Path, output: Path, *, dtype: str = "float32",
               device: str = "cpu", options: dict | None = None, log: Callable[[str], None] = print) -> tuple[int, int]:
    requests = read_jsonl(input)
    if not requests:
        raise ValueError(f"{input}: no requests")
    model_dir = resolve_model(model, log)
    kinds = {r.kind for r in requests}
    cfg = EngineConfig(Path(model_dir), dtype, device, bounds_for(requests, load_tokenizer(model_dir)),
                       kinds.pop() if len(kinds) == 1 else None, options or {})
    engine = create_engine(engine_name, cfg)
    engine.start()
    errors = 0
    try:
        lines = asyncio.run(_answer_all(engine, requests))
    finally:
        engine.stop()
    with open(output, "w") as f:
        for line in lines:
            errors += "error" in line
            f.write(json.dumps(line) + "\n")
    return len(lines), errors


async def _answer_all(engine, requests: list[Request]) -> list[dict[str, Any]]:
    lines = []
    for req in requests:
        try:
            lines.append(result_line(await engine.submit(req)))
        except Exception as e:  # a bad request gets an error line; the rest still run
            lines.append({"id": req.id, "error": f"{type(e).__name__}: {e}"})
    return lines
