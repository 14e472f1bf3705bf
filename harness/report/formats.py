"""How numbers read in the report's table cells (jinja2 filters)."""
from __future__ import annotations

import math
from typing import Any


def finite(v: Any) -> bool:
    try:
        return v is not None and v != "" and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def fmt(v: Any, kind: str = "g") -> str:
    """A number for a table cell: 'ms' one decimal, 'pct' a percentage, 'g' 3-4 significant."""
    if not finite(v):
        return "–"
    v = float(v)
    if kind == "ms":
        return f"{v:.1f}" if abs(v) >= 1 else f"{v:.3f}"
    if kind == "pct":
        return f"{100 * v:.3g}%"
    return f"{v:.4g}"


def fmt_ratio(v: Any) -> str:
    return f"×{float(v):.3g}" if finite(v) else "–"


def fmt_delta(v: Any) -> str:
    return f"{100 * float(v):+.1f}%" if finite(v) else "–"
