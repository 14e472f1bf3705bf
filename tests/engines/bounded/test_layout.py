"""The engine's layout stays readable (issue 11): no module of engines/bounded over
MAX_MODULE_LINES, no function over MAX_FUNCTION_LINES, and engine.py keeps no per-kind
pairs (the tasks hold what differs by kind)."""
from __future__ import annotations

import ast
from pathlib import Path

import engines.bounded

PACKAGE = Path(engines.bounded.__file__).parent
MAX_MODULE_LINES = 260  # ~250, with a little room for a docstring line
MAX_FUNCTION_LINES = 45  # ~40
KIND_WORDS = ("prefill", "beam", "score")


def oversized(source: str, where: str) -> list[str]:
    """What in `source` is over the limits, one line each (empty when nothing is)."""
    found = []
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES:
        found.append(f"{where}: {lines} lines > {MAX_MODULE_LINES}")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1  # from the def line (decorators not counted)
            if n > MAX_FUNCTION_LINES:
                found.append(f"{where}:{node.lineno} {node.name}: {n} lines > {MAX_FUNCTION_LINES}")
    return found


def kind_pairs(source: str) -> list[str]:
    """Attributes set on `self` and methods whose names carry a task kind."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.value, ast.Name) and node.value.id == "self":
            names.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
    return sorted(n for n in names if any(w in n.lower() for w in KIND_WORDS))


def test_the_checks_catch_what_they_look_for():
    long_fn = "def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES
    assert oversized(long_fn, "m.py") == [f"m.py:1 f: {MAX_FUNCTION_LINES + 1} lines > {MAX_FUNCTION_LINES}"]
    assert oversized("def f():\n" + "    x = 1\n" * (MAX_FUNCTION_LINES - 1), "m.py") == []
    long_module = "x = 1\n" * (MAX_MODULE_LINES + 1)
    assert oversized(long_module, "m.py") == [f"m.py: {MAX_MODULE_LINES + 1} lines > {MAX_MODULE_LINES}"]
    nested = "class A:\n    def g(self):\n        def h():\n" + "            y = 2\n" * MAX_FUNCTION_LINES
    assert [s.split(":")[1].split()[1] for s in oversized(nested, "m.py")] == ["g", "h"]
    paired = "class E:\n    def __init__(self):\n        self.runtime = 1\n        self.beam_runtime = 2\n" \
             "    def _prefill_dag(self):\n        pass\n"
    assert kind_pairs(paired) == ["_prefill_dag", "beam_runtime"]


def test_no_module_or_function_of_the_bounded_engine_is_oversized():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 20  # the walk found the package
    found = [f for p in files for f in oversized(p.read_text(), str(p.relative_to(PACKAGE)))]
    assert not found, "split along the stage lines:\n" + "\n".join(found)


def test_engine_keeps_no_per_kind_pairs():
    assert kind_pairs((PACKAGE / "engine.py").read_text()) == []
