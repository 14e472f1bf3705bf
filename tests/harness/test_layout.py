"""harness/ laid out by stage: the numeric limits of issue 25, and imports pointing one way
(a stage imports only stages below it), checked on the source with `ast`."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[2] / "harness"
MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_LOCAL_IMPORTS = 350, 45, 15
# top to bottom: a stage may import the stages after it, never those before it
STAGES = ["cli", "serve", "run", "load", "report", "device", "measure", "workload", "scenario", "strict_json"]


def modules(root: Path = HARNESS) -> list[Path]:
    return sorted(root.rglob("*.py"))


def stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "harness" and len(parts) > 1 else None


def long_functions(tree: ast.AST, limit: int) -> list[str]:
    return [f"{n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > limit]


def local_project_imports(tree: ast.AST) -> list[int]:
    """Lines of imports of the project's own modules inside functions (each counted once)."""
    lines = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for n in ast.walk(fn):
                names = [a.name for a in n.names] if isinstance(n, ast.Import) else \
                    [n.module or ""] if isinstance(n, ast.ImportFrom) else []
                if any(m.split(".")[0] in ("harness", "engines") for m in names):
                    lines.add(n.lineno)
    return sorted(lines)


def upward_imports(path: Path, tree: ast.AST) -> list[str]:
    here = stage(".".join(path.relative_to(HARNESS.parent).with_suffix("").parts))
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module:
            there = stage(n.module)
            if here in STAGES and there in STAGES and STAGES.index(there) < STAGES.index(here):
                out.append(f"{here} imports {n.module} (line {n.lineno})")
    return out


def parsed(path: Path) -> ast.AST:
    return ast.parse(path.read_text("utf-8"))


def test_every_module_is_in_a_stage():
    assert [p for p in modules() if stage("harness." + p.relative_to(HARNESS).parts[0].removesuffix(".py"))
            not in STAGES + ["__init__"]] == []


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(HARNESS)))
def test_module_and_function_sizes(path):
    assert len(path.read_text("utf-8").splitlines()) <= MAX_MODULE_LINES
    assert long_functions(parsed(path), MAX_FUNCTION_LINES) == []


def test_few_function_local_imports_of_the_project():
    found = {str(p.relative_to(HARNESS)): local_project_imports(parsed(p)) for p in modules()}
    assert sum(map(len, found.values())) <= MAX_LOCAL_IMPORTS, {k: v for k, v in found.items() if v}


def test_imports_point_one_way():
    assert [u for p in modules() for u in upward_imports(p, parsed(p))] == []


def test_the_checks_can_fail(tmp_path):
    src = "def f():\n    from harness.run import runner\n" + "    x = 1\n" * 50
    tree = ast.parse(src)
    assert long_functions(tree, MAX_FUNCTION_LINES) == ["f (52 lines)"] and local_project_imports(tree) == [2]
    fake = HARNESS / "measure" / "fake.py"  # a path in the measure stage; the file is not written
    assert upward_imports(fake, ast.parse("from harness.run.runner import x\n")) == [
        "measure imports harness.run.runner (line 1)"]
    assert upward_imports(fake, ast.parse("from harness.workload.presets import x\n")) == []
