"""JSON as bad input demands, for JSONL lines and HTTP bodies alike: UTF-8 only, no `NaN` or
`Infinity` (not JSON numbers), no key given twice (the last would silently win), nesting
that cannot exhaust the parser. `BadJson` says which."""
from __future__ import annotations

import json
from typing import Any


class BadJson(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"field {k!r} appears twice")
        out[k] = v
    return out


def loads(raw: bytes) -> Any:
    """The value of one JSON document, or BadJson with the reason."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadJson(f"not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})") from None
    try:
        return json.loads(text, parse_constant=_no_constant, object_pairs_hook=_no_repeats)
    except RecursionError:
        raise BadJson("not valid JSON: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError included
        if "integer string conversion" in str(e):  # Python's cap on digits: its advice is not the user's
            raise BadJson("not valid JSON here: a number has more than 4300 digits") from None
        raise BadJson(f"not valid JSON: {getattr(e, 'msg', e)}") from None
