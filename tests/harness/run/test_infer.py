"""`bench infer` judges each line alone: a corpus of bad lines, each an error line with its
line number and the field; the good lines among them answered exactly as in a file of
their own; the engine's bounds sized only from lines that pass the caps."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from engines.base import Bounds
from harness.cli import app
from harness.run.infer import caps_checker, infer_file, read_input, screen

GOOD = [
    {"id": "p", "kind": "prefill_only", "samples": [" hello there", [5, 6, 7]], "labels": [" yes", " no"]},
    {"id": 2, "kind": "beam_search", "prompt": " the item code is", "beam_width": 3, "decode_steps": 2},
    {"id": "c", "kind": "beam_search", "prompt": [11, 12, 13], "beam_width": 2, "decode_steps": 2,
     "allowed": [[100, 101], [100, 102], [103, 104]]},
]
# (raw line, expected text in its error)
BAD = [
    ('{"id": "x", "kind": "prefill_only", "samples": [" a"]', "not valid JSON"),
    ('{"id": "k", "kind": "chat", "samples": [" a"]}', 'field kind: "chat"; kinds: prefill_only, beam_search'),
    ('{"id": "m", "kind": "beam_search", "prompt": " a", "beam_width": 2}', "missing field 'decode_steps'"),
    ('{"id": "u", "kind": "prefill_only", "samples": [" a"], "labels": [" yes", " no"], "label": 1}',
     "unknown field 'label'"),
    ('{"id": "abc", "kind": "beam_search", "prompt": " a", "beam_width": "abc", "decode_steps": 2}',
     "beam_width: expected an integer, got 'abc'"),
    ('{"id": "nan", "kind": "prefill_only", "samples": [[1, NaN]], "labels": [" yes", " no"]}',
     "not valid JSON: NaN is not a JSON number"),
    ('{"id": "inf", "kind": "beam_search", "prompt": [1], "beam_width": Infinity, "decode_steps": 2}',
     "not valid JSON: Infinity is not a JSON number"),
    ('[1, 2, 3]', "a line must be one JSON object, got list"),
    ('"just a string"', "a line must be one JSON object, got str"),
    ('{"id": "s5", "kind": "prefill_only", "samples": [5], "labels": [" yes", " no"]}',
     "samples.0: expected a list of token ids, got int"),
    ('{"id": "hello", "kind": "prefill_only", "samples": "hello", "labels": [" yes", " no"]}',
     "samples: expected a list of samples"),
    ('{"id": "float", "kind": "prefill_only", "samples": [[1, 2.7]], "labels": [" yes", " no"]}',
     "samples.0.1: token ids are integers, got 2.7"),
    ('{"id": "w49", "kind": "beam_search", "prompt": [1, 2], "beam_width": 4.9, "decode_steps": 2}',
     "beam_width: expected an integer, got 4.9"),
    ('{"id": "wbool", "kind": "beam_search", "prompt": [1, 2], "beam_width": true, "decode_steps": 2}',
     "beam_width: expected an integer, got True"),
    ('{"id": "huge", "kind": "beam_search", "prompt": [1, 2], "beam_width": 1000000, "decode_steps": 2}',
     "beam_width: 1000000 outside 1..4096"),
    ('{"id": "steps", "kind": "beam_search", "prompt": [1, 2], "beam_width": 2, "decode_steps": 1000}',
     "decode_steps: 1000 outside 1..64"),
    ('{"id": "nolabels", "kind": "prefill_only", "samples": [[1]], "labels": []}', "labels: need at least two labels"),
    ('{"id": "neg", "kind": "prefill_only", "samples": [[1]], "labels": [5, -1]}', "labels.1: label id -1 outside"),
    ('{"id": "dup", "kind": "prefill_only", "samples": [[1]], "labels": [" yes", " yes"]}', "labels.1: same token"),
    ('{"id": "multi", "kind": "prefill_only", "samples": [[1]], "labels": [" yes", " two words"]}',
     "labels.1: label ' two words' is 2 tokens"),
    ('{"id": "short", "kind": "beam_search", "prompt": [1], "beam_width": 1, "decode_steps": 3, '
     '"allowed": [[100, 101]]}', "allowed: every item code must be exactly decode_steps = 3 tokens long"),
    ('{"id": "mixed", "kind": "beam_search", "prompt": [1], "beam_width": 1, "decode_steps": 2, '
     '"allowed": [[100, 101], [102]]}', "got lengths [1, 2]"),
    ('{"id": "wide", "kind": "beam_search", "prompt": [1], "beam_width": 3, "decode_steps": 2, '
     '"allowed": [[100, 101], [102, 103]]}', "allowed: beam_width 3 > 2 distinct item codes"),
    ('{"id": "eos", "kind": "beam_search", "prompt": [1], "beam_width": 1, "decode_steps": 2, '
     '"allowed": [[100, 151645]]}', "allowed.0: holds EOS id 151645"),
    ('{"id": "empty", "kind": "prefill_only", "samples": [""], "labels": [" yes", " no"]}', "samples.0: empty sample"),
    ('{"id": "nosamples", "kind": "prefill_only", "samples": [], "labels": [" yes", " no"]}',
     "samples: need at least one sample"),
    ('{"id": "vocab", "kind": "beam_search", "prompt": [151936], "beam_width": 1, "decode_steps": 1}',
     "prompt: token id 151936 outside [0, 151936)"),
    ('{"id": "long", "kind": "beam_search", "prompt": [1], "beam_width": 1, "decode_steps": 1}'.replace(
        "[1]", json.dumps([1] * 4096)), "prompt: 4096 tokens + 1 decode steps > the model's 4096 positions"),
    ('{"id": {"a": 1}, "kind": "prefill_only", "samples": [[1]], "labels": [" yes", " no"]}',
     'field id: a string or an integer, got {"a": 1}'),
    ('{"id": "twice", "id": "again", "kind": "prefill_only", "samples": [[1]], "labels": [" yes", " no"]}',
     "field 'id' appears twice"),
    (b'{"id": "latin", "kind": "prefill_only", "samples": [" caf\xe9"], "labels": [" yes", " no"]}',
     "not UTF-8 text"),
    ("[" * 100000 + "]" * 100000, "nested too deeply"),
    ('{"id": "digits", "kind": "prefill_only", "samples": [[' + "9" * 5000 + ']], "labels": [" yes", " no"]}',
     "a number has more than 4300 digits"),  # was Python's own advice: sys.set_int_max_str_digits()
    # found by a hostile pass after the corpus above was written
    ('{"id": "surrogate", "kind": "prefill_only", "samples": ["\\ud800 x"], "labels": [" yes", " no"]}',
     "samples.0: not valid Unicode text (a lone surrogate at character 0)"),
    ('{"id": "surrogate-label", "kind": "prefill_only", "samples": [[1]], "labels": [" yes", "\\udfff"]}',
     "labels.1: not valid Unicode text"),
]


def _write(path, lines) -> None:
    path.write_bytes(b"\n".join(x if isinstance(x, bytes) else x.encode() for x in lines) + b"\n")


@pytest.fixture(scope="module")
def answers(tmp_path_factory, tiny_dir):
    """A file of good and bad lines interleaved, and the good lines alone, through hf."""
    folder = tmp_path_factory.mktemp("infer")
    mixed = [json.dumps(GOOD[0])] + [b for b, _ in BAD[:16]] + [json.dumps(GOOD[1])] + [b for b, _ in BAD[16:]] \
        + ["", json.dumps(GOOD[2])]
    _write(folder / "mixed.jsonl", mixed)
    _write(folder / "good.jsonl", [json.dumps(g) for g in GOOD])
    n, errors = infer_file("hf", "tiny", folder / "mixed.jsonl", folder / "mixed.out")
    assert (n, errors) == (len(GOOD) + len(BAD), len(BAD))
    infer_file("hf", "tiny", folder / "good.jsonl", folder / "good.out")
    read = lambda name: [json.loads(x) for x in (folder / name).read_text().splitlines()]  # noqa: E731
    return read("mixed.out"), read("good.out")


def test_every_bad_line_is_an_error_with_its_number_and_field(answers):
    mixed, _ = answers
    errors = [line for line in mixed if "error" in line]
    assert len(errors) == len(BAD)
    for line, (_raw, message) in zip(errors, BAD):
        assert line["error"].startswith(f"line {line['line']}: "), line
        assert message in line["error"], (line, message)
        assert set(line) == {"id", "line", "error"}
    assert [e["line"] for e in errors] == sorted(e["line"] for e in errors)
    assert errors[1]["id"] == "k" and errors[0]["id"] is None  # the id is echoed where it can be read


def test_good_lines_are_answered_as_if_alone(answers):
    mixed, alone = answers
    good = [line for line in mixed if "error" not in line]
    assert good == alone  # exactly: same scores, same beams, same order
    assert [line["id"] for line in good] == ["p", 2, "c"]  # ids as given, 2 stays an integer
    assert len(good[1]["beams"]) == 3 and all(len(b["token_ids"]) == 2 for b in good[1]["beams"])
    codes = {tuple(c) for c in GOOD[2]["allowed"]}
    assert {tuple(b["token_ids"]) for b in good[2]["beams"]} <= codes


def test_bounds_are_sized_only_from_lines_that_pass(tmp_path, tiny_dir, tokenizer):
    _write(tmp_path / "in.jsonl", [json.dumps(g) for g in GOOD] + [b for b, _ in BAD])
    lines = read_input(tmp_path / "in.jsonl")
    bounds = screen(lines, caps_checker(str(tiny_dir), tokenizer))
    assert bounds == Bounds(max_samples_per_request=2, max_prompt_tokens=4, max_beam_width=3, max_decode_steps=2,
                          max_query_tokens=1, max_item_tokens=1)


def test_cli_exit_codes(tmp_path, tiny_dir):
    runner = CliRunner()
    good, out = tmp_path / "good.jsonl", tmp_path / "out.jsonl"
    _write(good, [json.dumps(GOOD[0])])
    res = runner.invoke(app, ["infer", "-e", "noop", "--model", "tiny", "-i", str(good), "-o", str(out)])
    assert res.exit_code == 0, res.output
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n")
    for args, code, message in [
        (["-i", str(blank)], 2, "no requests"),
        (["-i", str(tmp_path / "none.jsonl")], 2, "cannot read"),
        (["-i", str(good), "--model", "tiny-qwen9"], 2, "--model: 'tiny-qwen9' is not a preset"),
        (["-i", str(good), "--option", "colour=blue"], 2, "--option: unknown option(s) colour"),
        (["-i", str(good), "--dtype", "int3"], 2, "--dtype int3: choose one of"),
        (["-i", str(good), "--device", "quantum"], 2, "--device quantum: not a device"),
        (["-i", str(good), "-o", str(tmp_path / "no" / "such" / "out.jsonl")], 2, "cannot write"),
        # the input overwritten by its own answers (it used to be)
        (["-i", str(good), "-o", str(tmp_path / "." / "good.jsonl")], 2, "is the input file: its requests would be"),
        (["-i", str(good), "--option", "colour"], 2, "--option 'colour': expected KEY=VALUE"),  # was {"colour": ""}
        (["-i", str(good), "--option", "=3"], 2, "--option '=3': expected KEY=VALUE"),
        (["-i", str(good), "--option", "a=1", "--option", "a=2"], 2, "--option a: given twice"),  # the last won
    ]:
        argv = ["infer", "-e", "noop", "--model", "tiny", "-o", str(out), *args]
        res = runner.invoke(app, argv)
        assert res.exit_code == code and message in " ".join(res.output.split()), (args, res.output)
        assert "Traceback" not in res.output
    assert json.loads(good.read_text()) == GOOD[0]  # the input is intact
