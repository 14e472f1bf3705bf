"""A corpus of bad scenario files and flags: each is refused by the loader or the preflight
with one message naming the file and the field (`bench run` exits 2, no traceback, no engine
started); the shipped scenarios pass."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.run.preflight import check_scenario
from harness.run.runner import Overrides
from harness.scenario.errors import ScenarioError
from harness.scenario.files import load_scenario

SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios"
PREFILL = yaml.safe_load((SCENARIOS / "smoke_prefill.yaml").read_text())
BEAM = yaml.safe_load((SCENARIOS / "smoke_beam.yaml").read_text())


def _set(base: dict, path: str, value):
    data = copy.deepcopy(base)
    *head, last = path.split(".")
    cur = data
    for k in head:
        cur = cur[k]
    if value is KeyError:
        del cur[last]
    else:
        cur[last] = value
    return data


# (scenario data, field path to change, new value, expected text of the message)
FILE_CASES = [
    (PREFILL, "load.requests", 10**21, "field load.requests: Input should be less than or equal to 1000000"),
    (PREFILL, "load.requests", True, "field load.requests: Input should be a valid integer"),
    (PREFILL, "load.requests", 4.0, "field load.requests: Input should be a valid integer"),
    (PREFILL, "load.warmup_requests", 999_999, "field load.requests: requests + warmup_requests"),
    (PREFILL, "load.concurrency", [0], "field load.concurrency: every concurrency must be > 0"),
    (PREFILL, "load.concurrency", [1, 1], "field load.concurrency: a concurrency is listed twice"),
    (PREFILL, "load.concurrency", [True], "field load.concurrency.0: Input should be a valid integer"),
    (PREFILL, "load.concurrency", 4, "field load.concurrency: Input should be a valid list"),
    (PREFILL, "load", {"mode": "poisson", "rate": [1e5], "duration_s": 3600},
     "field load.rate: the fastest rate over warmup_s + duration_s sends ~360,000,000 requests"),
    (PREFILL, "load", {"mode": "poisson", "rate": [float("inf")], "duration_s": 1}, "field load.rate.0: Input should be a finite number"),
    (PREFILL, "load", {"mode": "poisson", "rate": [float("nan")], "duration_s": 1}, "field load.rate.0: Input should be a finite number"),
    (PREFILL, "load", {"mode": "poisson", "rate": [10]}, "field load.duration_s: give duration_s or requests"),
    (PREFILL, "load", {"mode": "poisson", "rate": [10], "duration_s": 1e12}, "field load.duration_s: Input should be less than"),
    (PREFILL, "load.mode", "burst", "field load: Input tag 'burst' found using 'mode' does not match"),
    (PREFILL, "load.timeout_s", 0, "field load.timeout_s: Input should be greater than 0"),
    (PREFILL, "cpu", {"concurrency": [0]}, "field cpu.concurrency: every concurrency must be > 0"),
    (PREFILL, "cpu", {"requests": -1}, "field cpu.requests: Input should be greater than 0"),
    (PREFILL, "workload.prompt_tokens.max", 10**21, "field workload.prompt_tokens.max: Input should be less than or equal"),
    (PREFILL, "workload.prompt_tokens", {"mean": 24, "min": 8, "max": 200},
     "field workload.prompt_tokens: up to 200 tokens > bounds.max_prompt_tokens 128"),
    (PREFILL, "workload.prompt_tokens", 0, "field workload.prompt_tokens: Input should be greater than or equal to 1"),
    (PREFILL, "workload.samples_per_request", 17, "field workload.samples_per_request: 17 > bounds.max_samples_per_request 16"),
    (PREFILL, "workload.samples_per_request", 10**9, "field workload.samples_per_request: Input should be less than"),
    (PREFILL, "workload.dataset", "x.jsonl", "field workload: give exactly one of prompt_tokens"),
    (PREFILL, "bounds.max_prompt_tokens", 10**12, "field bounds.max_prompt_tokens: Input should be less than or equal"),
    (PREFILL, "bounds", {"max_samples_per_request": 4096, "max_prompt_tokens": 4096},
     "field bounds.max_prompt_tokens: max_samples_per_request x max_prompt_tokens = 16,777,216 tokens"),
    (PREFILL, "bounds.on_violation", "ignore", "field bounds.on_violation: Input should be 'reject' or 'truncate'"),
    (PREFILL, "device", "quantum", "field device: String should match pattern"),
    (PREFILL, "dtype", "int3", "field dtype: Input should be 'bfloat16', 'float32' or 'float16'"),
    (PREFILL, "model", "", "field model: String should have at least 1 character"),
    (PREFILL, "name", 5, "field name: Input should be a valid string"),
    (PREFILL, "task.labels", [" yes", " yes"], "field task.labels: label 1 (' yes') is listed twice"),
    (PREFILL, "task.labels", [True, False], "field task.labels.0: Input should be a valid string or a valid integer "
                                            "(YAML reads unquoted true/false/yes/no/on/off as booleans: quote it)"),
    (PREFILL, "task.labels", [" yes"], "field task.labels: List should have at least 2 items"),
    (PREFILL, "task.kind", "chat", "field task: Input tag 'chat' found using 'kind'"),
    (PREFILL, "engines", ["hf", "hf"], "field engines.1: engine 'hf' is listed twice"),
    (PREFILL, "engines", ["hff"], "field engines.0.name: unknown engine 'hff'; known engines:"),
    (PREFILL, "engines", [], "field engines: List should have at least 1 item"),
    (PREFILL, "slo", {"mean_ms": -1}, "field slo.mean_ms: Input should be greater than 0"),
    (PREFILL, "colour", "blue", "field colour: Extra inputs are not permitted"),
    (BEAM, "task.beam_width", 10**6, "field task.beam_width: Input should be less than or equal to 4096"),
    (BEAM, "task.beam_width", 4.9, "field task.beam_width: Input should be a valid integer"),
    (BEAM, "task.decode_steps", 0, "field task.decode_steps: Input should be greater than 0"),
    (BEAM, "task.item_codes", {"count": 5, "length": 3}, "field task.item_codes.count: 5 < beam_width 8"),
    (BEAM, "task.item_codes", {"count": 50, "length": 2}, "field task.item_codes.length: 2 must equal decode_steps 3"),
    (BEAM, "workload.samples_per_request", 4, "field workload.samples_per_request: a beam_search request has one prompt"),
    # found by a hostile pass after the corpus above was written
    (PREFILL, "name", "../../../tmp/escape", "field name: String should match pattern"),
    (PREFILL, "workload.prompt_tokens", {"mean": 24, "min": 8, "max": 48, "std": 1e308},
     "field workload.prompt_tokens.std: Input should be less than or equal to 1048576"),
    (PREFILL, "load", {"mode": "poisson", "rate": [1e-9], "duration_s": 1}, "field load.rate: 1e-09/s over duration_s 1 "
                                                                          "expects no request at all"),
    (PREFILL, "load", {"mode": "poisson", "rate": [1e-9], "requests": 2}, "field load.rate: 2 requests at 1e-09/s take"),
    (PREFILL, "cpu", {"rate": [5.0]}, "field cpu.rate: a closed load has no rate"),
    (PREFILL, "engines", [{"name": "hf", "unconstrained": True}], "field engines.0.unconstrained: only for beam "
                                                                  "search"),  # was accepted and meant nothing
    # YAML 1.1 reads 1e30 as text: an integer field's hint must not say "with a dot"
    (PREFILL, "workload.seed", "1e30", "field workload.seed: Input should be a valid integer (YAML reads 1e30 as "
                                       "text: write the digits out, e.g. 1000000)"),
    (PREFILL, "slo", {"mean_ms": "1e3"}, "field slo.mean_ms: Input should be a valid number (YAML reads 1e3 as "
                                         "text: write it with a dot, e.g. 1.0e-9)"),
]


@pytest.mark.parametrize("base, path, value, message", FILE_CASES,
                         ids=[f"{c[1]}={str(c[2])[:20]}" for c in FILE_CASES])
def test_bad_scenario_files_name_file_and_field(tmp_path, base, path, value, message):
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(_set(base, path, value)))
    with pytest.raises(ScenarioError) as e:
        load_scenario(p)
    assert str(e.value).startswith(f"{p}: ")
    assert message in str(e.value)


RAW_CASES = [
    ("utf16", "name: x\n".encode("utf-16"), "is not UTF-8 text (byte 0xff at offset 0)"),
    ("latin1", "name: caf\xe9\n".encode("latin-1"), "is not UTF-8 text (byte 0xe9 at offset 9)"),
    ("alias bomb", b"a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n", "aliases (*name) are not allowed"),
    ("repeated key", b"name: a\nname: b\n", "key 'name' appears twice"),
    ("python tag", b"name: !!python/object/apply:os.system [ls]\n", "not valid YAML"),
    ("not a mapping", b"- a\n- b\n", "the file must hold a mapping of fields, got list"),
    ("empty", b"", "the file is empty (or only comments)"),
    ("only comments", b"# name: x\n", "the file is empty (or only comments)"),
    ("unclosed", b"name: [unclosed", "not valid YAML"),
    ("huge", b"#" * (1 << 20 + 1), "is over 1,048,576 bytes"),
]


@pytest.mark.parametrize("name, raw, message", RAW_CASES, ids=[c[0] for c in RAW_CASES])
def test_unreadable_scenario_files(tmp_path, name, raw, message):
    p = tmp_path / "bad.yaml"
    p.write_bytes(raw)
    with pytest.raises(ScenarioError, match="bad.yaml: ") as e:
        load_scenario(p)
    assert message in str(e.value)


def test_a_bom_is_fine(tmp_path):
    p = tmp_path / "bom.yaml"
    p.write_bytes(b"\xef\xbb\xbf" + (SCENARIOS / "smoke_prefill.yaml").read_bytes())
    assert load_scenario(p).name == "smoke_prefill"


def _write(tmp_path, data, name="s.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


# checks that need the model, the tokenizer, the dataset or the engines (tiny preset)
PREFLIGHT_CASES = [
    (PREFILL, "model", "tiny-qwen3", "field model: 'tiny-qwen3' is not a preset (qwen3-0.6b, qwen2.5-0.5b, tiny"),
    (PREFILL, "model", "./models/none", "field model: './models/none' is not a preset"),
    (PREFILL, "task.labels", [" yes", " two words"], "field task.labels.1: label ' two words' is 2 tokens"),
    (PREFILL, "task.labels", [" yes", 9834], "field task.labels.1: same token 9834 as task.labels.0"),
    (PREFILL, "task.labels", [" yes", 10**6], "field task.labels.1: label id 1000000 outside [0, 151936)"),
    (PREFILL, "task.labels", [" yes", -1], "field task.labels.1: label id -1 outside"),
    (PREFILL, "bounds.max_prompt_tokens", 8192, "field bounds.max_prompt_tokens: 8192 > the model's 4096 positions"),
    (BEAM, "bounds.max_prompt_tokens", 4094, "field bounds.max_prompt_tokens: 4094 + 3 decode steps > the model's 4096"),
    (_set(PREFILL, "bounds.on_violation", "truncate"), "workload.prompt_tokens", 5000,
     "field workload.prompt_tokens: up to 5000 tokens > the model's 4096 positions"),
    (BEAM, "task", {"kind": "beam_search", "beam_width": 8, "decode_steps": 1, "item_codes": {"count": 10**6, "length": 1}},
     "field task.item_codes.count: 1,000,000 > the"),
    (PREFILL, "engines", [{"name": "hf", "colour": "blue"}], "field engines.0 (hf): unknown option(s) colour: "
                                                             "engine 'hf' takes no options"),
    (PREFILL, "engines", [{"name": "noop", "x": 1}], "field engines.0 (noop): unknown option(s) x"),
    (PREFILL, "engines", [{"name": "sglang", "url": "http://127.0.0.1:1", "colour": 1}],
     "field engines.0 (sglang): sglang options: colour: Extra inputs are not permitted"),
    (PREFILL, "engines", [{"name": "sglang", "port": 70000}], "field engines.0 (sglang): sglang options: port"),
    (PREFILL, "device", "cuda:7", "field device: cuda:7 asked for, but"),
]


@pytest.mark.parametrize("base, path, value, message", PREFLIGHT_CASES,
                         ids=[f"{c[1]}={str(c[2])[:20]}" for c in PREFLIGHT_CASES])
def test_preflight_names_file_and_field(tmp_path, tiny_dir, base, path, value, message):
    p = _write(tmp_path, _set(base, path, value))
    with pytest.raises(ScenarioError) as e:
        check_scenario(load_scenario(p), p)
    assert str(e.value).startswith(f"{p}: ")
    assert message in str(e.value)


def _dataset(tmp_path, lines: list[str], base=PREFILL) -> Path:
    (tmp_path / "data.jsonl").write_text("\n".join(lines) + "\n")
    data = _set(base, "workload", {"dataset": "data.jsonl"})
    return _write(tmp_path, data)


GOOD_LINE = json.dumps({"id": "a", "kind": "prefill_only", "samples": [" hi", [1, 2]], "labels": [" yes", " no"]})
DATASET_CASES = [
    ([GOOD_LINE, "{oops"], "line 2: not valid JSON"),
    ([GOOD_LINE, '{"kind": "beam_search", "prompt": [1], "beam_width": 2, "decode_steps": 2}'],
     "line 2: a beam_search request in a prefill_only scenario"),
    ([GOOD_LINE, '{"kind": "prefill_only", "samples": [[1]], "labels": [" yes", " no"], "lables": 1}'],
     "line 2: unknown field 'lables'"),
    ([GOOD_LINE, json.dumps({"kind": "prefill_only", "samples": [[1] * 129], "labels": [" yes", " no"]})],
     "line 2: samples.0: 129 tokens > max_prompt_tokens 128"),
    ([GOOD_LINE, '{"kind": "prefill_only", "samples": [[1, 2.0]], "labels": [" yes", " no"]}'],
     "line 2: samples.0.1: token ids are integers, got 2.0"),
    ([GOOD_LINE, '{"kind": "prefill_only", "samples": "hello", "labels": [" yes", " no"]}'],
     "line 2: samples: expected a list of samples"),
    ([GOOD_LINE] + ['{"kind": "chat"}'] * 7, "7 bad line(s)"),
    ([""], "holds no requests"),
]


@pytest.mark.parametrize("lines, message", DATASET_CASES, ids=[c[1][:30] for c in DATASET_CASES])
def test_bad_datasets_are_refused_at_load(tmp_path, tiny_dir, lines, message):
    p = _dataset(tmp_path, lines)
    with pytest.raises(ScenarioError) as e:
        check_scenario(load_scenario(p), p)
    assert str(e.value).startswith(f"{p}: field workload.dataset: ")
    assert message in str(e.value)


def test_missing_dataset_names_the_absolute_path(tmp_path, tiny_dir):
    p = _write(tmp_path, _set(PREFILL, "workload", {"dataset": "nope.jsonl"}))
    with pytest.raises(ScenarioError, match=f"field workload.dataset: no file {tmp_path / 'nope.jsonl'}"):
        check_scenario(load_scenario(p), p)


def test_beam_dataset_beyond_the_task_width_is_refused(tmp_path, tiny_dir):
    line = json.dumps({"kind": "beam_search", "prompt": [1, 2], "beam_width": 9, "decode_steps": 3})
    p = _dataset(tmp_path, [line], BEAM)
    with pytest.raises(ScenarioError, match="line 1: beam_width: 9 outside 1..8"):
        check_scenario(load_scenario(p), p)


OVERRIDE_CASES = [
    (Overrides(requests=0), "--requests: Input should be greater than 0"),
    (Overrides(requests=-3), "--requests: Input should be greater than 0"),
    (Overrides(requests=10**7), "--requests: Input should be less than or equal to 1000000"),
    (Overrides(concurrency=[0]), "--concurrency: every concurrency must be > 0"),
    (Overrides(concurrency=[2, 2]), "--concurrency: a concurrency is listed twice"),
    (Overrides(engines=["hff"]), "--engine hff: unknown engine"),
    (Overrides(engines=["hf", "hf"]), "--engine hf: given twice"),
    (Overrides(peak_tflops=0.0), "--peak-tflops 0.0: give a positive number"),
    (Overrides(peak_tflops=float("nan")), "--peak-tflops nan: give a positive number"),
]


@pytest.mark.parametrize("ov, message", OVERRIDE_CASES, ids=[c[1][:30] for c in OVERRIDE_CASES])
def test_command_line_overrides_are_checked_again(tiny_dir, ov, message):
    path = SCENARIOS / "smoke_prefill.yaml"
    with pytest.raises(ScenarioError) as e:
        check_scenario(load_scenario(path), path, engines=ov.engines or None, overrides=ov)
    assert message in str(e.value)


def test_poisson_overrides_are_checked_again(tiny_dir):
    path = SCENARIOS / "noop_ceiling.yaml"
    for ov, message in [(Overrides(rate=[-1.0]), "--rate: every rate must be > 0"),
                        (Overrides(duration_s=float("inf")), "--duration: Input should be a finite number"),
                        (Overrides(rate=[1e6], duration_s=100.0), "--rate: the fastest rate")]:
        with pytest.raises(ScenarioError) as e:
            check_scenario(load_scenario(path), path, overrides=ov)
        assert message in str(e.value)


def test_a_run_too_big_to_make_up_front_is_refused(tmp_path, tiny_dir):
    data = _set(PREFILL, "load", {"mode": "closed", "concurrency": [1, 2, 4, 8], "requests": 10**6,
                                  "warmup_requests": 0})
    p = _write(tmp_path, _set(data, "workload", {"samples_per_request": 16, "prompt_tokens": 128}))
    with pytest.raises(ScenarioError, match="the run would make 4,000,000 requests of up to 2,048 tokens up front"):
        check_scenario(load_scenario(p), p, overrides=Overrides())
    check_scenario(load_scenario(p), p, overrides=Overrides(requests=1000))  # fine with fewer


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_scenarios_pass_the_preflight(path, tiny_dir):
    check_scenario(load_scenario(path), path, overrides=Overrides())


@pytest.mark.parametrize("args, message", [
    (["--requests", "0"], "--requests: Input should be greater than 0"),
    (["--requests", "-3"], "--requests: Input should be greater than 0"),
    (["--concurrency", "0"], "--concurrency: every concurrency must be > 0"),
    (["--device", "quantum"], "--device quantum: not a device"),
    (["--engine", "hff"], "--engine hff: unknown engine"),
    (["--baseline", "sglang"], "--baseline 'sglang' is not an engine of this run"),
    (["--out", "/proc/no-such-run"], "--out /proc/no-such-run: cannot write there"),
])
def test_bench_run_bad_flags_exit_2_before_any_engine(tmp_path, tiny_dir, args, message):
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", str(SCENARIOS / "smoke_prefill.yaml"), "--engine", "noop",
                                   "--peak-tflops", "1", "--out", str(out), *args])  # the last --out wins
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output
    assert not out.exists() and "[noop] starting" not in res.output  # nothing ran
