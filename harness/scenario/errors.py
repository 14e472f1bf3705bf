"""Pydantic's errors as one line per field ("field load.rate: ..."), for scenario files,
command-line overrides and HTTP bodies alike."""
from __future__ import annotations

import re
from typing import Any
from pydantic import BaseModel, ValidationError

from harness.scenario.fields import TokenDist


class ScenarioError(ValueError):
    """A scenario file is unreadable or invalid; the message names the file and the field."""


_TAGS = {"closed", "poisson", "prefill_only", "beam_search", "int", "float", "str", "list[int]", "TokenDist",
         "constrained-int", "constrained-float"}


_NUMBER_TEXT = re.compile(r"^[-+]?\d+[eE][-+]?\d+$")  # 1e-9: a float in JSON, text in YAML 1.1


_FIELD_FIRST = re.compile(r"^(?:Value error, )?([a-z_0-9][\w.]*): (.*)$", re.S)


def _where(loc: tuple[Any, ...]) -> str:
    # drop pydantic's union-branch tags (e.g. 'closed', 'function-after[...]') from the path
    parts = [str(p) for p in loc if not (isinstance(p, str) and ("[" in p or p in _TAGS))]
    return ".".join(parts) or "(top level)"


def field_errors(e: ValidationError, yaml_hints: bool = True) -> list[tuple[str, str]]:
    """(field path, message) per error; a validator's "x.y: message" extends the path; a
    union's branches that all refuse a value's type are one message. `yaml_hints`: say how
    YAML misread a value (not for JSON, where `true` and `1e-9` mean what they say)."""
    out: dict[str, list[tuple[bool, str]]] = {}
    hints: dict[str, str] = {}
    for err in e.errors():
        where, msg, is_type = _where(err["loc"]), err["msg"], err["type"].endswith("_type")
        m = _FIELD_FIRST.match(msg) if err["type"] == "value_error" else None
        if m:
            where = m.group(1) if where == "(top level)" else f"{where}.{m.group(1)}"
            msg = m.group(2)
        elif err["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
        misread = yaml_hints and is_type
        if misread and isinstance(err.get("input"), bool):
            hints[where] = " (YAML reads unquoted true/false/yes/no/on/off as booleans: quote it)"
        elif misread and isinstance(err.get("input"), str) and _NUMBER_TEXT.match(err["input"]):
            hints[where] = (f" (YAML reads {err['input']} as text: write the digits out, e.g. 1000000)"
                            if err["type"].startswith("int") else
                            f" (YAML reads {err['input']} as text: write it with a dot, e.g. 1.0e-9)")
        msgs = out.setdefault(where, [])
        if (is_type, msg) not in msgs:
            msgs.append((is_type, msg))
    # where another branch of a union got further into the value, its errors tell more
    deeper = {w for w, msgs in out.items() if all(t for t, _ in msgs) and any(x.startswith(w + ".") for x in out)}
    return [(w, _one_message(msgs) + hints.get(w, "")) for w, msgs in out.items() if w not in deeper]


def _one_message(msgs: list[tuple[bool, str]]) -> str:
    """The errors of a union's branches at one place: the branch that took the value's type
    tells why; if none did, say which types would do."""
    told = [m for is_type, m in msgs if not is_type]
    if told:
        return "; ".join(told)
    types = [m for _, m in msgs]
    return " or ".join([types[0]] + [m.removeprefix("Input should be ") for m in types[1:]])


def revalidated(model: BaseModel, updates: dict[str, Any], names: dict[str, str], source: str,
                prefix: str = "") -> Any:
    """`model` with `updates`, checked again as the file was (`model_copy` would skip the
    checks); an error names the field as `names` calls it (e.g. "--requests")."""
    try:
        return type(model).model_validate({**model.model_dump(), **updates})
    except ValidationError as e:
        lines = [f"{source}: invalid settings"]
        for where, msg in field_errors(e):
            top = where.split(".")[0]
            lines.append(f"  {names.get(top, 'field ' + prefix + where)}: {msg}")
        raise ScenarioError("\n".join(lines)) from None
