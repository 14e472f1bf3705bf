"""Tokenizing and bounds shared by engines: label strings to single token ids, samples to
ids, and the declared bounds applied to a request (reject or truncate)."""
from __future__ import annotations

from typing import Any, Sequence

from engines.base import Bounds, Label, RequestRejected, Sample


def label_ids(tokenizer: Any, labels: Sequence[Label]) -> list[int]:
    """Each label is a token id or a string that must encode to exactly one token."""
    ids = []
    for lab in labels:
        if isinstance(lab, int):
            ids.append(lab)
            continue
        enc = tokenizer.encode(lab, add_special_tokens=False)
        if len(enc) != 1:
            raise RequestRejected(f"label {lab!r} is {len(enc)} tokens {enc}; each label must be one token")
        ids.append(enc[0])
    return ids


def encode(tokenizer: Any, sample: Sample) -> list[int]:
    if isinstance(sample, str):
        return tokenizer.encode(sample, add_special_tokens=False)
    return [int(t) for t in sample]


def apply_bounds(bounds: Bounds, seqs: list[list[int]], what: str = "sample") -> list[list[int]]:
    """Check (or truncate) a request's token sequences against the bounds."""
    truncate = bounds.on_violation == "truncate"
    if not seqs:
        raise RequestRejected(f"request has no {what}s")
    if len(seqs) > bounds.max_samples_per_request:
        if not truncate:
            raise RequestRejected(f"{len(seqs)} {what}s > max_samples_per_request {bounds.max_samples_per_request}")
        seqs = seqs[: bounds.max_samples_per_request]
    out = []
    for i, s in enumerate(seqs):
        if not s:
            raise RequestRejected(f"{what} {i} is empty")
        if len(s) > bounds.max_prompt_tokens:
            if not truncate:
                raise RequestRejected(f"{what} {i} has {len(s)} tokens > max_prompt_tokens {bounds.max_prompt_tokens}")
            s = s[-bounds.max_prompt_tokens:]  # keep the end: the scored position stays
        out.append(s)
    return out


def check_beam(bounds: Bounds, beam_width: int, decode_steps: int) -> None:
    if not 0 < beam_width <= bounds.max_beam_width:
        raise RequestRejected(f"beam_width {beam_width} outside 1..{bounds.max_beam_width}")
    if not 0 < decode_steps <= bounds.max_decode_steps:
        raise RequestRejected(f"decode_steps {decode_steps} outside 1..{bounds.max_decode_steps}")


def eos_ids(model_dir: Any) -> list[int]:
    """EOS token ids from generation_config.json (else config.json)."""
    import json
    from pathlib import Path

    for name in ("generation_config.json", "config.json"):
        p = Path(model_dir) / name
        if p.exists():
            eos = json.loads(p.read_text()).get("eos_token_id")
            if eos is not None:
                return [eos] if isinstance(eos, int) else list(eos)
    return []
