from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.scenario.load import ClosedLoad, PoissonLoad
from harness.scenario.errors import ScenarioError
from harness.scenario.files import load_scenario

SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios"


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_scenarios_are_valid(path):
    sc = load_scenario(path)
    assert sc.name == path.stem


def _write(tmp_path, data) -> Path:
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _good() -> dict:
    return yaml.safe_load((SCENARIOS / "smoke_prefill.yaml").read_text())


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d["task"].update(kind="chat"), "task"),
    (lambda d: d["load"].update(concurrency=[0]), "load.concurrency"),
    (lambda d: d["workload"].update(prompt_tokens={"mean": 10, "min": 20, "max": 30}), "workload.prompt_tokens"),
    (lambda d: d.update(colour="blue"), "colour"),
    (lambda d: d.pop("model"), "model"),
    (lambda d: d.update(dtype="int3"), "dtype"),
    (lambda d: d["load"].update(mode="poisson", rate=[10]), "load"),
])
def test_errors_name_file_and_field(tmp_path, mutate, field):
    data = _good()
    mutate(data)
    with pytest.raises(ScenarioError) as e:
        load_scenario(_write(tmp_path, data))
    msg = str(e.value)
    assert "bad.yaml" in msg
    assert f"field {field}" in msg


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ScenarioError, match="nope.yaml: cannot read"):
        load_scenario(tmp_path / "nope.yaml")
    p = tmp_path / "broken.yaml"
    p.write_text("name: [unclosed")
    with pytest.raises(ScenarioError, match="broken.yaml: not valid YAML"):
        load_scenario(p)


def test_cli_bad_scenario_exit_2_without_traceback(tmp_path):
    data = _good()
    data["load"]["requests"] = -5
    res = CliRunner().invoke(app, ["run", str(_write(tmp_path, data))])
    assert res.exit_code == 2
    assert "field load.requests" in res.output
    assert "Traceback" not in res.output


def test_load_modes_parse():
    data = _good()
    assert isinstance(load_scenario(SCENARIOS / "smoke_prefill.yaml").load, ClosedLoad)
    assert isinstance(load_scenario(SCENARIOS / "noop_ceiling.yaml").load, PoissonLoad)
    assert data["engines"]


def _query_good() -> dict:
    return yaml.safe_load((SCENARIOS / "smoke_relevance.yaml").read_text())


@pytest.mark.parametrize("mutate, msg", [
    (lambda d: d["workload"].pop("item_tokens"), "needs item_tokens too"),
    (lambda d: d["workload"].update(prompt_tokens=10), "give exactly one of"),
    (lambda d: d["workload"].update(samples_per_request=3), "samples_per_request is for samples"),
    (lambda d: d["workload"].update(items_per_request={"mean": 5, "min": 6, "max": 9}), "min <= mean <= max"),
    (lambda d: d.update(task={"kind": "beam_search", "beam_width": 4, "decode_steps": 2}), "needs task kind prefill_only"),
    (lambda d: d["bounds"].update(max_query_tokens=0), "field bounds.max_query_tokens"),
    (lambda d: d["bounds"].update(max_prompt_tokens=40), "each concatenation is a sample"),
])
def test_query_workload_errors(tmp_path, mutate, msg):
    data = _query_good()
    mutate(data)
    with pytest.raises(ScenarioError, match=msg):
        load_scenario(_write(tmp_path, data))


def test_one_engine_twice_needs_labels(tmp_path):
    data = _good()
    data["engines"] = ["hf", {"name": "hf", "dtype_note": 1}]
    with pytest.raises(ScenarioError, match="'hf' is listed twice"):
        load_scenario(_write(tmp_path, data))
    data["engines"] = ["hf", {"name": "hf", "label": "hf-2", "x": 1}]
    sc = load_scenario(_write(tmp_path, data))
    assert [e.title for e in sc.engines] == ["hf", "hf-2"] and sc.engines[1].options == {"x": 1}


def test_engine_flag_takes_every_entry_of_that_name_or_label(tmp_path):
    from harness.scenario.engines import select_engines as chosen_specs

    data = _good()
    data["engines"] = ["bounded", {"name": "bounded", "label": "bounded-noshare", "share_query": False}, "hf"]
    sc = load_scenario(_write(tmp_path, data))
    assert [s.title for s in chosen_specs(sc, [])] == ["bounded", "bounded-noshare", "hf"]
    assert [s.title for s in chosen_specs(sc, ["hf", "bounded"])] == ["hf", "bounded", "bounded-noshare"]
    assert [s.title for s in chosen_specs(sc, ["bounded-noshare", "noop"])] == ["bounded-noshare", "noop"]
