"""outputs.jsonl: each engine's answers at the first load point of each sweep cell, one line
per request, in the `bench infer` output format plus the engine's name (and the cell) — what
the report needs to check that engines agree on the same requests, kept on disk so
`bench report` can rebuild it. Request ids differ between cells (each cell sends fresh
requests), so answers to one id are answers to the same request."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engines.base import BeamResult, Result

Answers = dict[str, dict[str, dict[str, Any]]]  # engine -> request id -> answer line


def result_line(result: Result) -> dict[str, Any]:
    """One answer in the `bench infer` output format."""
    if isinstance(result, BeamResult):
        return {"id": result.id, "beams": [{"token_ids": b.token_ids, "text": b.text, "logprob": b.logprob}
                                           for b in result.beams]}
    return {"id": result.id, "scores": result.scores}


def output_lines(result: Any) -> list[dict[str, Any]]:
    lines = []
    for er in result.engines:
        seen = set()
        for p in er.points:
            if p.cell.index in seen:
                continue
            seen.add(p.cell.index)
            cell = {"cell": p.cell.label} if p.cell.label else {}
            for rec in sorted(p.point.records, key=lambda r: r.index):
                if rec.result is not None:
                    lines.append({"engine": er.name, **cell, **result_line(rec.result), "id": rec.item.request.id})
    return lines


def write_outputs_jsonl(result: Any, out_dir: Path, context: dict) -> Path:
    path = out_dir / "outputs.jsonl"
    with open(path, "w") as f:
        for line in output_lines(result):
            f.write(json.dumps(line, separators=(",", ":")) + "\n")
    return path


def read_outputs(path: Path) -> Answers:
    """Answers by engine and request id; empty when the run has no outputs.jsonl."""
    answers: Answers = {}
    if not path.exists():
        return answers
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not an outputs line (not JSON: {e.msg})") from None
            why = _not_an_answer(obj)
            if why:
                raise ValueError(f"{path}:{n}: not an outputs line ({why})")
            answers.setdefault(obj.pop("engine"), {})[str(obj["id"])] = obj
    return answers


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _not_an_answer(obj: Any) -> str:
    """Why a parsed line is not an answer the agreement check can read ("" when it is)."""
    if not isinstance(obj, dict):
        return "not an object"
    if not isinstance(obj.get("engine"), str) or "id" not in obj:
        return "field engine (a string) and id are needed"
    scores, beams = obj.get("scores"), obj.get("beams")
    if scores is not None and not (isinstance(scores, list) and all(
            isinstance(row, list) and all(_number(p) for p in row) for row in scores)):
        return "field scores: a list of lists of probabilities expected"
    if beams is not None and not (isinstance(beams, list) and all(
            isinstance(b, dict) and isinstance(b.get("token_ids"), list) and _number(b.get("logprob"))
            for b in beams)):
        return "field beams: a list of {token_ids, text, logprob} expected"
    return ""
