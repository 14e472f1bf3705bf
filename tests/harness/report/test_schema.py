"""`bench report` reads a run folder strictly: a hand-edited or corrupted file gets one
message naming the file and the field (or row and column), exit 2, never a traceback, a
silent misread or a figure that cannot be drawn."""
import json
import shutil

import pytest
from typer.testing import CliRunner

from harness.cli import app


def _edit_json(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _edit_csv(path, column, value, row=0):
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    assert column in header, header
    cells = lines[1 + row].split(",")
    assert len(cells) == len(header)  # no quoted commas in the rows edited here
    cells[header.index(column)] = value
    lines[1 + row] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")


def _set(key, value):
    return lambda d: d.__setitem__(key, value)


CASES = [
    # run.json: objects replaced by strings were an AttributeError traceback
    ("run.json", _set("peak", "fast"), "run.json: field peak: an object expected, got a string"),
    ("run.json", _set("slo", "tight"), "run.json: field slo: an object expected, got a string"),
    # a string of warnings was shown letter by letter, as four warnings
    ("run.json", _set("warnings", "oops"), "run.json: field warnings: a list expected, got a string"),
    ("run.json", lambda d: d["engines"][0].__setitem__("describe", ["x"]),
     "run.json: field engines.0.describe: an object expected, got a list"),
    ("run.json", lambda d: d["peak"].__setitem__("tflops", 1e308), "run.json: field peak.tflops: 1e+308 is outside"),
    ("run.json", lambda d: d["scenario"]["content"].__setitem__("load", "closed"),
     "run.json: field scenario.content.load: an object expected, got a string"),
    ("run.json", lambda d: d.__setitem__("engines", {"hf": {}}), "run.json: field engines: a list expected, got an object"),
]
CSV_CASES = [
    # latencies of 1e308 stopped the figure code ("arange: cannot compute length"), naming nothing
    ("results.csv", "mean_ms", "1e308", "results.csv: row 2, column mean_ms: 1e+308 is outside 0.."),
    ("results.csv", "p99_ms", "inf", "results.csv: row 2, column p99_ms: inf is outside"),
    ("results.csv", "qps", "banana", "results.csv: row 2, column qps: 'banana' is not a number"),
    ("results.csv", "ok", "", "results.csv: row 2, column ok: blank"),
    ("results.csv", "mean_ms", "-5", "results.csv: row 2, column mean_ms: -5 is outside"),
    ("results.csv", "engine", "", "results.csv: row 2, column engine: blank"),
    ("requests.csv", "latency_ms", "1e308", "requests.csv: row 2, column latency_ms: 1e+308 is outside"),
    ("requests.csv", "load_value", "x", "requests.csv: row 2, column load_value: 'x' is not a number"),
    ("requests.csv", "stages", "{bad", "requests.csv: row 2, column stages: not a JSON object of milliseconds"),
]


def _report(folder, tmp_path):
    return CliRunner().invoke(app, ["report", str(folder), "--out", str(tmp_path / "x.html")])


@pytest.mark.parametrize("name, change, message", CASES)
def test_a_corrupted_run_json_names_the_file_and_field(prefill_run, tmp_path, name, change, message):
    broken = tmp_path / "run"
    shutil.copytree(prefill_run, broken)
    _edit_json(broken / name, change)
    res = _report(broken, tmp_path)
    assert res.exit_code == 2, res.output  # a traceback exits 1
    said = " ".join(res.output.split())
    assert message in said and str(broken) in said, said
    assert said.count("error:") == 1 and "Traceback" not in said


@pytest.mark.parametrize("name, column, value, message", CSV_CASES)
def test_a_corrupted_table_names_the_file_row_and_column(prefill_run, tmp_path, name, column, value, message):
    broken = tmp_path / "run"
    shutil.copytree(prefill_run, broken)
    _edit_csv(broken / name, column, value)
    res = _report(broken, tmp_path)
    assert res.exit_code == 2, res.output
    said = " ".join(res.output.split())
    assert message in said, said
    assert not (tmp_path / "x.html").exists()


@pytest.mark.parametrize("line, message", [
    ("1", "outputs.jsonl:1: not an outputs line (not an object)"),
    ('{"engine": "hf", "id": "a", "scores": "high"}', "outputs.jsonl:1: not an outputs line (field scores"),
    ('{"engine": "hf", "id": "a", "beams": [{"token_ids": [1]}]}', "outputs.jsonl:1: not an outputs line (field beams"),
    ('{"id": "a", "scores": [[0.5, 0.5]]}', "outputs.jsonl:1: not an outputs line (field engine"),
])
def test_a_corrupted_outputs_line_names_the_file_and_line(prefill_run, tmp_path, line, message):
    broken = tmp_path / "run"
    shutil.copytree(prefill_run, broken)
    (broken / "outputs.jsonl").write_text(line + "\n")
    res = _report(broken, tmp_path)
    assert res.exit_code == 2, res.output
    assert "".join(message.split()) in "".join(res.output.split()), res.output  # rich wraps long paths


def test_the_untouched_run_folder_still_reads(prefill_run, tmp_path):
    """The checks refuse the edits above, not what `bench run` writes."""
    res = _report(prefill_run, tmp_path)
    assert res.exit_code == 0, res.output
