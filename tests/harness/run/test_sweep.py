"""Sweep expansion: cells, their order, offsets and bounds; values from the scenario, its cpu
block and --sweep."""
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.load.modes import load_mode
from harness.scenario.errors import ScenarioError
from harness.scenario.files import parse_scenario
from harness.run.sweep import parse_sweep_option, plan_cells

SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios"


def _beam(**extra) -> dict:
    data = yaml.safe_load((SCENARIOS / "smoke_beam.yaml").read_text())  # W=8, S=3, closed [1, 2]
    data.update(extra)
    return data


def test_cells_are_the_cross_product_with_fresh_requests_for_each():
    sc = parse_scenario(_beam(sweep={"beam_width": [2, 8], "decode_steps": [1, 3]}))
    plan = plan_cells(sc, sc.load, "cuda")
    assert [c.params for c in plan.cells] == [{"beam_width": 2, "decode_steps": 1}, {"beam_width": 2, "decode_steps": 3},
                                              {"beam_width": 8, "decode_steps": 1}, {"beam_width": 8, "decode_steps": 3}]
    assert plan.cells[1].label == "beam_width=2, decode_steps=3"
    assert [(c.scenario.task.beam_width, c.scenario.task.decode_steps) for c in plan.cells] == [(2, 1), (2, 3), (8, 1),
                                                                                                (8, 3)]
    per_cell = 2 * (1 + 10)  # two load points of 1 warm-up + 10 requests
    assert [c.offset for c in plan.cells] == [0, per_cell, 2 * per_cell, 3 * per_cell]
    probes = [c.probe_offset for c in plan.cells]  # past every cell's requests, apart from each other
    assert probes[0] >= 4 * per_cell and len(set(probes)) == 4
    assert sum(load_mode(sc.load).size(sc.load, v, 0) for v in sc.load.concurrency) == per_cell


def test_bounds_per_cell_or_for_the_largest_capped_by_the_scenario():
    sweep = {"beam_width": [2, 8, 16], "decode_steps": [1, 3]}
    sc = parse_scenario(_beam(sweep=sweep, bounds={"max_prompt_tokens": 64, "max_beam_width": 10}))
    cells = plan_cells(sc, sc.load, "cuda").cells
    got = [(c.bounds.max_beam_width, c.bounds.max_decode_steps) for c in cells]
    assert got == [(2, 1), (2, 3), (8, 1), (8, 3), (10, 1), (10, 3)]  # W=16 past the bound: sized at 10
    assert all(c.bounds.max_prompt_tokens == 64 and c.bounds.max_samples_per_request == 16 for c in cells)
    largest = parse_scenario(_beam(sweep={**sweep, "sizing": "largest"}, bounds={"max_prompt_tokens": 64}))
    plan = plan_cells(largest, largest.load, "cuda")
    assert plan.sizing == "largest" and {(c.bounds.max_beam_width, c.bounds.max_decode_steps) for c in plan.cells} == {
        (16, 3)}


def test_unswept_bounds_keep_the_scenario_and_the_task():
    sc = parse_scenario(_beam(bounds={"max_prompt_tokens": 64}))
    (cell,) = plan_cells(sc, sc.load, "cpu").cells
    assert cell.params == {} and cell.label == "" and cell.offset == 0
    assert (cell.bounds.max_beam_width, cell.bounds.max_decode_steps, cell.bounds.max_prompt_tokens) == (8, 3, 64)


def test_swept_samples_and_prompt_lengths_size_their_bounds():
    data = yaml.safe_load((SCENARIOS / "smoke_prefill.yaml").read_text())
    data["sweep"] = {"samples_per_request": [2, 40], "prompt_tokens": [16, {"mean": 30, "min": 20, "max": 48}]}
    sc = parse_scenario(data)
    cells = plan_cells(sc, sc.load, "cpu").cells
    assert [(c.bounds.max_samples_per_request, c.bounds.max_prompt_tokens) for c in cells] == [
        (2, 16), (2, 48), (16, 16), (16, 48)]  # 40 samples past the scenario's bound of 16
    assert cells[1].values() == {"samples_per_request": 2.0, "prompt_tokens": 30.0}
    assert cells[1].label == 'samples_per_request=2, prompt_tokens={"mean":30,"min":20,"max":48}'
    assert cells[3].scenario.workload.samples_per_request == 40


def test_cpu_sweep_on_a_cpu_and_the_command_line_over_both():
    sc = parse_scenario(_beam(sweep={"beam_width": [2, 4, 8]}, cpu={"sweep": {"beam_width": [2, 8]}}))
    notes = []
    assert [c.params["beam_width"] for c in plan_cells(sc, sc.load, "cpu", log=notes.append).cells] == [2, 8]
    assert "cpu.sweep" in notes[0]
    assert [c.params["beam_width"] for c in plan_cells(sc, sc.load, "cuda").cells] == [2, 4, 8]
    over = plan_cells(sc, sc.load, "cpu", parse_sweep_option(["beam_width=3,5", "decode_steps=2"]))
    assert [c.params for c in over.cells] == [{"beam_width": 3, "decode_steps": 2}, {"beam_width": 5, "decode_steps": 2}]
    # --sweep on a scenario without a sweep
    plain = parse_scenario(_beam())
    assert [c.label for c in plan_cells(plain, plain.load, "cpu", {"beam_width": [1, 2]}).cells] == [
        "beam_width=1", "beam_width=2"]


@pytest.mark.parametrize("texts, message", [
    (["beam_width"], "expected NAME=V1,V2"),
    (["beam_width=25,,4"], "--sweep 'beam_width=25,,4': cannot read the values"),
    (["beam_width=4", "beam_width=8"], "--sweep beam_width: given twice"),  # the last one won silently
    (["beam_width=0"], "beam_width[0] = 0: Input should be greater than 0"),
    (["beam=2"], "unknown sweep parameter 'beam'; parameters: beam_width"),
    (["samples_per_request=2,4"], "a beam_search request has one prompt"),
])
def test_bad_sweep_options_say_what_is_wrong(texts, message):
    sc = parse_scenario(_beam())
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        plan_cells(sc, sc.load, "cpu", parse_sweep_option(texts))


def test_sweep_option_takes_a_distribution_as_one_value():
    """A cell label prints a distribution as {"mean":..}; the same text is one value of --sweep
    (it used to be split at its commas)."""
    got = parse_sweep_option(['prompt_tokens={"mean": 8, "min": 4, "max": 12},{mean: 16, min: 8, max: 24},32'])
    assert got == {"prompt_tokens": [{"mean": 8, "min": 4, "max": 12}, {"mean": 16, "min": 8, "max": 24}, 32]}
    assert parse_sweep_option(["beam_width=25, 100,400"]) == {"beam_width": [25, 100, 400]}


@pytest.mark.parametrize("sweep, message", [
    ({"beam_width": [2, 0]}, "beam_width[1] = 0"),
    ({"beam_width": 4}, "give a non-empty list"),
    ({"beam_width": []}, "give a non-empty list"),
    ({"beam_width": [2, 2]}, "a value is given twice"),
    ({"beam_width": [2, True]}, "not a boolean"),
    ({"widths": [2]}, "unknown sweep parameter 'widths'"),
    ({}, "name at least one parameter"),
    ({"beam_width": [2], "sizing": "huge"}, "sweep.sizing"),
])
def test_bad_sweeps_in_the_file_name_the_field(sweep, message):
    with pytest.raises(ScenarioError, match="sweep") as e:
        parse_scenario(_beam(sweep=sweep))
    assert message in str(e.value)


def test_a_prefill_task_cannot_sweep_beams_and_cpu_sweep_must_be_swept():
    data = yaml.safe_load((SCENARIOS / "smoke_prefill.yaml").read_text())
    with pytest.raises(ScenarioError, match="a prefill_only task has no beam_width"):
        parse_scenario({**data, "sweep": {"beam_width": [2]}})
    with pytest.raises(ScenarioError, match="cpu.sweep: decode_steps not swept"):
        parse_scenario(_beam(sweep={"beam_width": [2]}, cpu={"sweep": {"decode_steps": [1]}}))


def test_bench_run_rejects_a_bad_sweep_with_exit_2(tmp_path):
    res = CliRunner().invoke(app, ["run", str(SCENARIOS / "smoke_beam.yaml"), "--sweep", "beam_width=0,4",
                                   "--out", str(tmp_path / "run")])
    assert res.exit_code == 2 and "beam_width[0] = 0" in res.output
    assert not (tmp_path / "run").exists()


def test_query_workloads_sweep_items_and_lengths():
    data = yaml.safe_load((SCENARIOS / "smoke_relevance.yaml").read_text())
    data["bounds"] = {"max_samples_per_request": 16, "max_prompt_tokens": 128, "max_item_tokens": 40}
    data["sweep"] = {"items_per_request": [2, {"mean": 20, "min": 10, "max": 30}], "item_tokens": [8, 64]}
    sc = parse_scenario(data)
    cells = plan_cells(sc, sc.load, "cpu").cells
    assert [(c.bounds.max_samples_per_request, c.bounds.max_item_tokens) for c in cells] == [
        (2, 8), (2, 40), (16, 8), (16, 40)]  # capped at 16 items and 40 item tokens
    assert all(c.bounds.max_query_tokens == 128 for c in cells)  # not swept: the scenario's (max_prompt_tokens)
    assert cells[3].scenario.workload.item_tokens == 64 and cells[2].values()["items_per_request"] == 20.0
    with pytest.raises(ScenarioError, match="samples_per_request is for samples"):
        parse_scenario({**data, "sweep": {"samples_per_request": [2, 4]}})


def test_preflight_checks_every_cell_against_the_model(tmp_path):
    from harness.run.preflight import check_scenario
    from harness.run.runner import Overrides

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(_beam(bounds={"max_prompt_tokens": 64})))
    sc = parse_scenario(yaml.safe_load(path.read_text()))
    check_scenario(sc, path, overrides=Overrides(sweep={"prompt_tokens": [16, 4000]}))  # 4000 + 3 steps fit
    with pytest.raises(ScenarioError, match=r"4096 positions .*\(sweep cell prompt_tokens=5000\)"):
        check_scenario(sc, path, overrides=Overrides(sweep={"prompt_tokens": [16, 5000]}))
    with pytest.raises(ScenarioError, match=r"--sweep: beam_width\[0\] = 0"):
        check_scenario(sc, path, overrides=Overrides(sweep={"beam_width": [0]}))
