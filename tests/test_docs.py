"""The user documentation against the program: every command and flag docs/cli.md names
exists in the CLI and every one the CLI has is documented; the complete scenario example
(scenarios/reference.yaml) validates, and so does each alternative it shows in `#|` lines;
the README stays short, has no internal references, and links only to files that exist."""
import re
from pathlib import Path

import pytest
import typer.main
import yaml

from harness.cli import app
from harness.scenario.files import load_scenario, parse_scenario

ROOT = Path(__file__).resolve().parents[1]
CLI_MD = ROOT / "docs" / "cli.md"
REFERENCE = ROOT / "scenarios" / "reference.yaml"


def cli_commands() -> dict:
    """'run', 'report', ..., 'sglang setup': every leaf command of the app (typer's click
    objects: typer may carry its own copy of click, so they are told apart by what they have)."""
    out = {}

    def walk(cmd, prefix: str) -> None:
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(sub, f"{prefix} {name}".strip())
        else:
            out[prefix] = cmd

    walk(typer.main.get_command(app), "")
    return out


def cli_flags(cmd) -> set[str]:
    return {o for p in cmd.params if p.param_type_name == "option" for o in p.opts + p.secondary_opts} - {"--help"}


def cli_arguments(cmd) -> list[str]:
    return [p.name.upper() for p in cmd.params if p.param_type_name == "argument"]


def doc_sections() -> dict[str, tuple[str, str]]:
    """'run' -> (the heading's usage, e.g. 'bench run SCENARIO', the section's text)."""
    text = CLI_MD.read_text()
    parts = re.split(r"^## `(bench [^`]*)`\s*$", text, flags=re.M)
    out = {}
    for usage, body in zip(parts[1::2], parts[2::2]):
        words = [w for w in usage.split()[1:] if re.fullmatch(r"[a-z][a-z-]*", w)]
        out[" ".join(words)] = (usage, body)
    return out


def doc_flags(body: str) -> set[str]:
    """The flags in the first column of the section's table."""
    flags = set()
    for line in body.splitlines():
        if line.startswith("| `-"):
            first = line.split("|")[1]
            flags |= set(re.findall(r"`(--?[a-z][a-z-]*)`", first))
    return flags


def test_every_command_is_documented_and_every_documented_command_exists():
    assert set(doc_sections()) == set(cli_commands())


@pytest.mark.parametrize("name", sorted(cli_commands()))
def test_every_flag_is_documented_and_every_documented_flag_exists(name):
    cmd = cli_commands()[name]
    usage, body = doc_sections()[name]
    assert doc_flags(body) == cli_flags(cmd), f"bench {name}: docs/cli.md vs the CLI"
    for arg in cli_arguments(cmd):  # SCENARIO, RUN_DIRS..., [FOLDER]
        assert arg in usage, f"bench {name}: argument {arg} not in the heading {usage!r}"


def test_the_flag_parser_sees_a_missing_flag():
    """doc_flags is not vacuous: a table row's flags are read."""
    assert doc_flags("| `--engine`, `-e` NAME | x |\n| `--measure` / `--no-measure` | y |\n") == {
        "--engine", "-e", "--measure", "--no-measure"}


def test_the_reference_scenario_validates_and_has_every_field():
    from harness.scenario.fields import TokenDist
    from harness.scenario.load import ClosedLoad, CpuLimits
    from harness.scenario.schema import EngineSpec, Scenario
    from harness.scenario.task import BoundsSpec as Bounds, ItemCodes

    sc = load_scenario(REFERENCE)
    data = yaml.safe_load(REFERENCE.read_text())
    assert set(data) == set(Scenario.model_fields)
    assert set(data["bounds"]) == set(Bounds.model_fields)
    assert set(data["load"]) == set(ClosedLoad.model_fields)
    assert set(data["cpu"]) == set(CpuLimits.model_fields) - {"duration_s", "rate"}  # the Poisson alternative's
    assert set(data["task"]["item_codes"]) == set(ItemCodes.model_fields)
    assert set(data["workload"]["prompt_tokens"]) == set(TokenDist.model_fields)
    entries = set().union(*(e if isinstance(e, dict) else {"name"} for e in data["engines"]))
    assert set(EngineSpec.model_fields) <= entries
    assert sc.sweep is not None and sc.sweep.sizing == "cell"


def alternatives() -> list[dict]:
    """Each group of consecutive `#|` lines of the reference file: top-level fields that
    replace the file's (null removes one)."""
    groups, current = [], []
    for line in REFERENCE.read_text().splitlines():
        if line.startswith("#|"):
            current.append(line[2:])
        elif current:
            groups.append(yaml.safe_load("\n".join(current)))
            current = []
    return groups


def test_each_alternative_of_the_reference_scenario_validates():
    alts = alternatives()
    assert len(alts) >= 4  # scoring, query + items, dataset, Poisson
    base = yaml.safe_load(REFERENCE.read_text())
    for alt in alts:
        data = {k: v for k, v in {**base, **alt}.items() if v is not None}
        parse_scenario(data, f"reference.yaml with {sorted(alt)}")
    kinds = {(a.get("task") or base["task"])["kind"] for a in alts} | {(a.get("load") or {}).get("mode") for a in alts}
    assert {"prefill_only", "poisson"} <= kinds
    assert any("dataset" in (a.get("workload") or {}) for a in alts)
    assert any("query_tokens" in (a.get("workload") or {}) for a in alts)


def test_the_empty_file_message_names_the_reference(tmp_path):
    from harness.scenario.errors import ScenarioError

    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n")
    with pytest.raises(ScenarioError, match="see scenarios/reference.yaml"):
        load_scenario(empty)


README = ROOT / "README.md"


def test_readme_is_short_and_has_no_internal_references():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    for bad in ("../shared", "DESIGN.md", "/work/", "issue ", "#1", "heavy bench"):
        assert bad not in text, bad


def test_readme_and_docs_links_point_to_files_that_exist():
    pages = [README, *sorted((ROOT / "docs").rglob("*.md"))]
    assert len(list((ROOT / "docs").glob("*.md"))) >= 6
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not re.match(r"[a-z]+://", target):
                assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links to a missing {target}"


def test_readme_test_command_is_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    install = next(line for line in ci.splitlines() if line.startswith("python3 -m venv"))
    text = README.read_text()
    assert "python -m pytest -q" in ci and "python -m pytest -q" in text
    assert install.replace(" -q", "") in text  # the install line, as CI runs it (CI adds -q)
