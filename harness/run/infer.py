"""`bench infer`: requests from a JSONL file through one engine, answers to a JSONL file, one
output line per input line, in order.

Each line is judged alone: a line that is not a request, or that the shared request check
(`engines.validate`) refuses under hard caps (the model's positions, the largest widths an
engine can plan for), becomes `{"id", "line", "error"}`; the engine's bounds are sized from
the lines that pass (a query request's query and items by their own bounds, max_query_tokens
and max_item_tokens), so one absurd line cannot size the engine's buffers; every good line is
answered as if it were alone.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from engines.base import Bounds, EngineConfig, Request
from engines.registry import create_engine, engine_class
from engines.validate import (MAX_BEAM_WIDTH, MAX_DECODE_STEPS, MAX_SAMPLES, CheckedBeam, CheckedPrefill, Limits,
                              RequestChecker)
from harness.report.outputs import result_line
from harness.workload.presets import resolve_model
from harness.scenario.fields import MAX_PROMPT_TOKENS, MAX_REQUEST_TOKENS
from harness.workload.requests import LineError, read_lines
from harness.run.preflight import model_facts
from harness.workload.requests import load_tokenizer


class InferInputError(ValueError):
    """The input as a whole is unusable (no lines, a bad flag or option): nothing ran."""


@dataclass
class Line:
    number: int
    id: Any  # as given in the file (None when the line has none that can be read)
    request: Request | None = None
    error: str = ""
    answer: dict[str, Any] | None = None

    def output(self) -> dict[str, Any]:
        if self.error:
            return {"id": self.id, "line": self.number, "error": self.error}
        return {"id": self.id, **(self.answer or {})}


def read_input(path: Path) -> list[Line]:
    try:
        lines = [Line(n, rid, None if isinstance(req, LineError) else req,
                      f"line {n}: {req.reason}" if isinstance(req, LineError) else "")
                 for n, rid, req in read_lines(path)]
    except OSError as e:
        raise InferInputError(f"{path}: cannot read ({e.strerror})") from None
    if not lines:
        raise InferInputError(f"{path}: no requests (every line is blank)")
    return lines


def caps_checker(model_dir: str, tokenizer: Any) -> RequestChecker:
    """The shared check under the hard caps a line must meet before it may size the bounds."""
    facts = Limits.for_model(model_dir, Bounds())
    positions = facts.max_positions or MAX_PROMPT_TOKENS
    caps = Bounds(max_samples_per_request=MAX_SAMPLES, max_prompt_tokens=positions, max_beam_width=MAX_BEAM_WIDTH,
                  max_decode_steps=MAX_DECODE_STEPS, max_query_tokens=positions, max_item_tokens=positions)
    return RequestChecker(Limits(caps, facts.vocab, facts.max_positions, facts.eos), tokenizer)


def screen(lines: list[Line], checker: RequestChecker) -> Bounds:
    """Mark the lines the caps refuse; -> bounds sized from the lines that pass."""
    samples, tokens, width, steps, query, item = 1, 1, 1, 1, 1, 1
    for line in lines:
        if line.request is None:
            continue
        try:
            checked = checker.check(line.request)
        except Exception as e:  # RequestRejected, or a tokenizer that chokes on the text
            line.error = f"line {line.number}: {e}"
            continue
        seqs = checked.seqs if isinstance(checked, CheckedPrefill) else [checked.prompt]
        if sum(map(len, seqs)) > MAX_REQUEST_TOKENS:
            line.error = f"line {line.number}: {sum(map(len, seqs)):,} tokens in one request > {MAX_REQUEST_TOKENS:,}"
            continue
        samples = max(samples, len(seqs))
        if isinstance(checked, CheckedBeam):
            width, steps = max(width, checked.beam_width), max(steps, checked.decode_steps)
        if isinstance(checked, CheckedPrefill) and checked.query_len:
            query, item = max(query, checked.query_len), max(item, max(map(len, checked.items)))
        tokens = max(tokens, max(map(len, seqs)))  # a query request's samples: its concatenations
    return Bounds(max_samples_per_request=samples, max_prompt_tokens=tokens, max_beam_width=width,
                  max_decode_steps=steps, max_query_tokens=query, max_item_tokens=item)


def infer_file(engine_name: str, model: str, input: Path, output: Path, *, dtype: str = "float32",
               device: str = "cpu", options: dict | None = None, log: Callable[[str], None] = print) -> tuple[int, int]:
    """-> (lines written, lines that are errors). Raises InferInputError when nothing can run."""

    options = options or {}
    try:
        engine_class(engine_name).check_options(options)
    except (TypeError, ValueError) as e:
        raise InferInputError(f"--option: {e}") from None
    lines = read_input(input)
    if Path(output).exists() and Path(input).exists() and Path(output).samefile(input):  # links too
        raise InferInputError(f"--output {output} is the input file: its requests would be overwritten")
    try:  # before any work: an answer that cannot be written is lost
        Path(output).open("a").close()
    except OSError as e:
        raise InferInputError(f"--output {output}: cannot write ({e.strerror})") from None
    facts = model_facts(model, "--model")  # a typo'd preset is an error, not a hub download
    model_dir = resolve_model(model, log)
    bounds = screen(lines, caps_checker(model_dir, facts.tokenizer or load_tokenizer(model_dir)))
    todo = [line for line in lines if not line.error]
    if todo:
        kinds = {line.request.kind for line in todo}
        cfg = EngineConfig(Path(model_dir), dtype, device, bounds, kinds.pop() if len(kinds) == 1 else None, options)
        engine = create_engine(engine_name, cfg)
        engine.start()
        try:
            asyncio.run(_answer_all(engine, todo))
        finally:
            engine.stop()
    with open(output, "w") as f:
        for line in lines:
            f.write(json.dumps(line.output()) + "\n")
    return len(lines), sum(bool(line.error) for line in lines)


async def _answer_all(engine, lines: list[Line]) -> None:
    for line in lines:  # one at a time: each answered as if alone
        try:
            line.answer = result_line(await engine.submit(line.request))
            line.answer.pop("id")
        except Exception as e:  # a bad request gets an error line; the rest still run
            line.error = f"line {line.number}: {type(e).__name__}: {e}"
