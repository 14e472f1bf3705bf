"""End-to-end: `bench run` on the smoke scenarios and `bench infer`, through the real CLI."""
import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app

SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios"


@pytest.mark.parametrize("scenario", ["smoke_prefill.yaml", "smoke_beam.yaml"])
def test_run_writes_three_files_with_real_numbers(tmp_path, scenario):
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", str(SCENARIOS / scenario), "--engine", "hf", "--engine", "noop",
                                   "--requests", "4", "--peak-tflops", "0.5", "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert {r["engine"] for r in rows} == {"hf", "noop"}
    hf = [r for r in rows if r["engine"] == "hf"]
    assert len(hf) == 2  # concurrency 1 and 2
    for r in hf:
        assert r["requests"] == "4" and r["errors"] == "0"
        assert float(r["mean_ms"]) > 0 and float(r["qps"]) > 0 and 0 < float(r["mfu"]) < 1
        assert float(r["peak_tflops"]) == 0.5
    reqs = list(csv.DictReader(open(out / "requests.csv")))
    warmup = {"smoke_prefill.yaml": 2, "smoke_beam.yaml": 1}[scenario]
    assert len(reqs) == 2 * 2 * (warmup + 4)  # engines x load points x requests
    run = json.loads((out / "run.json").read_text())
    assert run["scenario"]["content"]["name"] == scenario[:-5]
    assert run["peak"]["tflops"] == 0.5 and "2*N_nonemb" in run["mfu_formula"]
    assert [e["name"] for e in run["engines"]] == ["hf", "noop"]
    assert run["engines"][0]["describe"]["version"]


def test_unavailable_engine_is_skipped_with_a_reason(tmp_path, monkeypatch):
    import engines.registry as reg

    monkeypatch.setitem(reg.ENGINES, "ghost", "engines.does_not_exist:Ghost")
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", str(SCENARIOS / "smoke_prefill.yaml"), "--engine", "ghost", "--engine",
                                   "noop", "--requests", "2", "--peak-tflops", "1", "--out", str(out)])
    assert res.exit_code == 3, res.output  # the run went on, but not every engine ran
    assert "ghost" in res.output and "skipped" in res.output and "not measured: ghost" in res.output
    assert {r["engine"] for r in csv.DictReader(open(out / "results.csv"))} == {"noop"}


def test_infer_prefill_and_beam(tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text("\n".join(json.dumps(o) for o in [
        {"id": "p", "kind": "prefill_only", "samples": [" hello there", [5, 6, 7]], "labels": [" yes", " no"]},
        {"id": "b", "kind": "beam_search", "prompt": " the item code is", "beam_width": 3, "decode_steps": 2},
        {"id": "bad", "kind": "prefill_only", "samples": [" x"], "labels": [" yes", " two words"]},
    ]))
    outp = tmp_path / "out.jsonl"
    res = CliRunner().invoke(app, ["infer", "--engine", "hf", "--model", "tiny", "--input", str(inp),
                                   "--output", str(outp)])
    assert res.exit_code == 3, res.output  # every line answered; one of them is an error
    lines = [json.loads(line) for line in outp.read_text().splitlines()]
    assert [line["id"] for line in lines] == ["p", "b", "bad"]
    assert len(lines[0]["scores"]) == 2 and abs(sum(lines[0]["scores"][0]) - 1) < 1e-6
    beams = lines[1]["beams"]
    assert len(beams) == 3 and all(len(b["token_ids"]) == 2 for b in beams)
    assert beams[0]["logprob"] >= beams[1]["logprob"] >= beams[2]["logprob"]
    assert "one token" in lines[2]["error"]


def test_infer_query_requests_answer_like_their_concatenations(tmp_path):
    from harness.workload.requests import load_tokenizer
    from harness.workload.presets import materialise

    tok = load_tokenizer(str(materialise("tiny")))
    query, items = " is this about cats:", [" a cat", " the weather today", " kittens"]
    cats = [tok.encode(query + i, add_special_tokens=False) for i in items]
    runner, out = CliRunner(), {}
    for name, line in [("query", {"query": query, "items": items}),
                       ("ids", {"query": cats[0][:5], "items": [c[5:] for c in cats]}),
                       ("samples", {"samples": cats})]:
        inp, outp = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.out.jsonl"
        inp.write_text(json.dumps({"id": name, "kind": "prefill_only", "labels": [" yes", " no"], **line}) + "\n")
        res = runner.invoke(app, ["infer", "--engine", "hf", "--model", "tiny", "--input", str(inp),
                                  "--output", str(outp)])
        assert res.exit_code == 0, res.output
        out[name] = json.loads(outp.read_text())["scores"]
    assert len(out["samples"]) == 3
    for name in ("query", "ids"):
        for got, want in zip(out[name], out["samples"], strict=True):
            assert got == pytest.approx(want, abs=1e-6)


def test_run_query_scenario_counts_the_concatenations(tmp_path):
    import yaml

    data = yaml.safe_load((SCENARIOS / "smoke_relevance.yaml").read_text())
    for e in data["engines"]:  # eager: this test is about the run, not the compiler
        if isinstance(e, dict) and e["name"] == "bounded":
            e["compile"] = "eager"
    data["engines"] = [{"name": "bounded", "compile": "eager"} if e == "bounded" else e for e in data["engines"]]
    path, out = tmp_path / "smoke_relevance.yaml", tmp_path / "run"
    path.write_text(yaml.safe_dump(data))
    res = CliRunner().invoke(app, ["run", str(path), "--requests", "3", "--peak-tflops", "0.5", "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = {(r["engine"], r["load_value"]): r for r in csv.DictReader(open(out / "results.csv"))}
    assert {e for e, _ in rows} == {"bounded", "bounded-noshare", "hf", "noop"}  # one engine twice, by label
    assert all(r["errors"] == "0" for r in rows.values())
    answers = {}
    for line in map(json.loads, (out / "outputs.jsonl").read_text().splitlines()):
        answers.setdefault(line["id"], {})[line["engine"]] = line["scores"]
    for by_engine in answers.values():  # sharing the query or not, the concatenations' answers
        for name in ("bounded", "bounded-noshare"):
            for got, want in zip(by_engine[name], by_engine["hf"], strict=True):
                assert got == pytest.approx(want, abs=1e-4)
    engines = {e["name"]: e["describe"] for e in json.loads((out / "run.json").read_text())["engines"]}
    assert engines["bounded"]["prefill_only"]["share_query"] is True
    assert engines["bounded-noshare"]["prefill_only"]["share_query"] is False
    reqs = [r for r in csv.DictReader(open(out / "requests.csv")) if r["engine"] == "hf"]
    run = json.loads((out / "run.json").read_text())
    assert "full concatenation query + item_i" in run["mfu_formula"]
    from harness.scenario.files import load_scenario
    from harness.workload.requests import build_workload, load_tokenizer
    from harness.workload.presets import materialise

    wl = build_workload(load_scenario(SCENARIOS / "smoke_relevance.yaml"), load_tokenizer(str(materialise("tiny"))))
    first = wl[0]
    assert int(reqs[0]["samples"]) == len(first.request.items)
    assert int(reqs[0]["tokens"]) == sum(first.prompt_tokens) == sum(
        first.query_tokens + len(i.split()) for i in first.request.items)


def test_compile_ahead_of_time_then_from_cache():
    runner = CliRunner()
    first = runner.invoke(app, ["compile", str(SCENARIOS / "smoke_prefill.yaml")])
    assert first.exit_code == 0, first.output
    second = runner.invoke(app, ["compile", str(SCENARIOS / "smoke_prefill.yaml")])
    assert second.exit_code == 0, second.output
    status = json.loads(second.stdout[second.stdout.index("{"):])
    prefill = status["prefill_only"]
    assert prefill["compile"] == "aot" and prefill["packages"]["score_prefill"]["compiled_now"] is False


@pytest.mark.parametrize("engine, why", [
    ("DyingEngine", "dying: EngineDied: engine died: server exited with code 1 (after 1 measured request)"),
    ("BrokenStartEngine", "broken: failed to start: RuntimeError: weights are corrupt"),
    ("RejectingEngine", "rejecting: measured no successful request (0 errors, 4 rejected, 0 timeouts)"),
])
def test_run_exits_3_when_an_engine_did_not_measure(tmp_path, monkeypatch, engine, why):
    import engines.registry as reg

    name = why.split(":")[0]
    monkeypatch.setitem(reg.ENGINES, name, f"tests.harness.engines_for_tests:{engine}")
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", str(SCENARIOS / "smoke_prefill.yaml"), "--engine", "noop", "--engine",
                                   name, "--requests", "4", "--concurrency", "1", "--peak-tflops", "1",
                                   "--out", str(out)])
    assert res.exit_code == 3, res.output
    assert "Traceback" not in res.output
    assert f"not measured: {why}" in " ".join(res.output.split())
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert "noop" in {r["engine"] for r in rows}  # the others' results are kept


def test_run_exits_0_when_every_engine_measured(tmp_path):
    res = CliRunner().invoke(app, ["run", str(SCENARIOS / "smoke_beam.yaml"), "--engine", "noop", "--requests", "2",
                                   "--peak-tflops", "1", "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output


def test_summary_shows_an_engine_that_fell_back(tmp_path, monkeypatch):
    import engines.registry as reg

    monkeypatch.setitem(reg.ENGINES, "fallback", "tests.harness.engines_for_tests:FallbackEngine")
    res = CliRunner().invoke(app, ["run", str(SCENARIOS / "smoke_prefill.yaml"), "--engine", "fallback",
                                   "--engine", "noop", "--requests", "2", "--concurrency", "1",
                                   "--peak-tflops", "1", "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "eager (AOT failed)" in text
    assert "fallback does not serve as asked: prefill_only: ToolchainMissing: AOT toolchain for cuda" in text


def test_run_on_a_cpu_without_native_bf16_uses_the_fp32_peak_and_warns(tmp_path, monkeypatch):
    import harness.device.peak as peak
    from tests.engines.test_hardware import ICE_LAKE
    from tests.harness.device.test_peak import ICE_LAKE_RATES

    monkeypatch.setattr(peak, "cache_root", lambda: tmp_path)
    monkeypatch.setattr(peak, "probe", lambda device: ICE_LAKE)
    monkeypatch.setattr(peak, "measure_cpu", lambda caps: ICE_LAKE_RATES)
    out, bf16 = tmp_path / "run", tmp_path / "smoke_prefill_bf16.yaml"
    bf16.write_text((SCENARIOS / "smoke_prefill.yaml").read_text().replace("dtype: float32", "dtype: bfloat16"))
    res = CliRunner().invoke(app, ["run", str(bf16), "--engine", "hf", "--engine", "noop",
                                   "--requests", "2", "--concurrency", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    printed = " ".join(res.output.split())  # rich wraps long lines
    assert "hf: computes in bfloat16, which this device emulates" in printed
    assert "noop: computes" not in printed
    run = json.loads((out / "run.json").read_text())
    assert run["peak"]["tflops"] == 0.32 and run["peak"]["precision"] == "float32"
    assert run["peak"]["rates_tflops"]["int8"] == 1.07 and run["hardware"]["native"]["bfloat16"] is False
    assert {float(r["peak_tflops"]) for r in csv.DictReader(open(out / "results.csv")) if r["engine"] == "hf"} == {0.32}
    html = (out / "report.html").read_text()
    assert "MFU denominator" in html and "which this device emulates" in html
    assert "the best measured float rate: float32" in html


def test_doctor_lists_isa_flags_and_rates(tmp_path, monkeypatch):
    from harness.device.doctor import device_lines
    from harness.device.peak import cpu_peaks
    from tests.engines.test_hardware import ICE_LAKE, ZEN4
    from tests.harness.device.test_peak import ICE_LAKE_RATES

    monkeypatch.setenv("BOUNDED_BENCH_CACHE", str(tmp_path))
    lines = dict(device_lines("cpu", False, caps=ICE_LAKE))
    assert "avx512_bf16 no" in lines["cpu isa"] and "avx512_vnni yes" in lines["cpu isa"]
    assert lines["cpu native"].startswith("float32;") and "int8: avx512_vnni" in lines["cpu native"]
    assert "not measured" in lines["cpu peak"]
    cpu_peaks(ICE_LAKE, measure=lambda caps: ICE_LAKE_RATES)
    lines = dict(device_lines("cpu", False, caps=ICE_LAKE))
    assert lines["cpu float32"] == "320 GFLOP/s  <- MFU denominator"
    assert lines["cpu bfloat16"] == "64 GFLOP/s (emulated)" and lines["cpu int8"] == "1,070 GOP/s"
    assert lines["cpu float16"] == "not native here, not measured"
    zen4 = dict(device_lines("cpu", False, caps=ZEN4))  # not measured yet: says so, measures nothing
    assert "avx512_bf16 yes" in zen4["cpu isa"] and zen4["cpu native"].startswith("float32, bfloat16;")
    assert "not measured" in zen4["cpu peak"]


def _optional_scenario(tmp_path, engines: str) -> Path:
    text = (SCENARIOS / "smoke_prefill.yaml").read_text().replace("engines: [bounded, hf, noop]", f"engines: {engines}")
    path = tmp_path / "optional.yaml"
    path.write_text(text)
    return path


# a real SGLang engine pointed at an environment that does not exist: unavailable here
MISSING_SGLANG = "{name: sglang, python: /nonexistent/bin/python, optional: true}"


def test_optional_engine_that_cannot_run_is_skipped_and_the_run_exits_0(tmp_path):
    out = tmp_path / "run"
    sc = _optional_scenario(tmp_path, f"[noop, {MISSING_SGLANG}]")
    res = CliRunner().invoke(app, ["run", str(sc), "--requests", "2", "--concurrency", "1", "--peak-tflops", "1",
                                   "--out", str(out)])
    text = " ".join(res.output.split())
    assert res.exit_code == 0, res.output
    assert "sglang: skipped (optional): no SGLang environment at /nonexistent/bin/python" in text
    assert "not measured" not in text
    run = json.loads((out / "run.json").read_text())
    sglang = [e for e in run["engines"] if e["name"] == "sglang"][0]
    assert sglang["optional"] is True and "no SGLang environment" in sglang["skipped"]
    assert any("skipped (optional)" in w for w in run["warnings"])
    assert "skipped (optional): no SGLang environment" in (out / "report.html").read_text()


def test_optional_engine_named_on_the_command_line_still_counts(tmp_path):
    sc = _optional_scenario(tmp_path, f"[noop, {MISSING_SGLANG}]")
    res = CliRunner().invoke(app, ["run", str(sc), "--engine", "noop", "--engine", "sglang", "--requests", "2",
                                   "--concurrency", "1", "--peak-tflops", "1", "--out", str(tmp_path / "run")])
    assert res.exit_code == 3, res.output
    assert "not measured: sglang: skipped (no SGLang environment" in " ".join(res.output.split())


def test_optional_engine_that_fails_to_start_counts(tmp_path, monkeypatch):
    import engines.registry as reg

    monkeypatch.setitem(reg.ENGINES, "broken", "tests.harness.engines_for_tests:BrokenStartEngine")
    sc = _optional_scenario(tmp_path, "[noop, {name: broken, optional: true}]")
    res = CliRunner().invoke(app, ["run", str(sc), "--requests", "2", "--concurrency", "1", "--peak-tflops", "1",
                                   "--out", str(tmp_path / "run")])
    assert res.exit_code == 3, res.output  # optional forgives "cannot run here", not a broken start
    assert "not measured: broken: failed to start" in " ".join(res.output.split())


def test_every_engine_optional_and_skipped_is_not_a_run(tmp_path):
    sc = _optional_scenario(tmp_path, f"[{MISSING_SGLANG}]")
    res = CliRunner().invoke(app, ["run", str(sc), "--requests", "2", "--concurrency", "1", "--peak-tflops", "1",
                                   "--out", str(tmp_path / "run")])
    assert res.exit_code == 3, res.output
    assert "not measured: no engine ran: every one was optional and skipped" in " ".join(res.output.split())


def test_optional_must_be_a_boolean(tmp_path):
    sc = _optional_scenario(tmp_path, '[noop, {name: sglang, optional: "yes"}]')
    res = CliRunner().invoke(app, ["run", str(sc), "--peak-tflops", "1", "--out", str(tmp_path / "run")])
    assert res.exit_code == 2, res.output
    assert "field engines.1.optional: Input should be a valid boolean" in " ".join(res.output.split())


def test_seed_scenarios_run_without_server_engines():
    """The README's main job exits 0 on a machine without SGLang/vLLM environments: every
    seed entry of a launched server engine is optional (an entry with a url is not: someone
    started that server on purpose)."""
    from harness.scenario.files import load_scenario

    seen = 0
    for path in sorted(SCENARIOS.glob("*.yaml")):
        for spec in load_scenario(path).engines:
            if spec.name in ("sglang", "vllm") and "url" not in spec.options:
                assert spec.optional, f"{path.name}: {spec.title} should be optional"
                seen += 1
            elif spec.name in ("bounded", "hf", "noop"):
                assert not spec.optional, f"{path.name}: {spec.title} must run"
    assert seen >= 9


def test_scenarios_of_something_that_is_not_a_folder(tmp_path):
    for where in (tmp_path / "missing", SCENARIOS / "smoke_beam.yaml"):  # both listed an empty table, exit 0
        res = CliRunner().invoke(app, ["scenarios", str(where)])
        assert res.exit_code == 2 and "not a folder of scenario files" in " ".join(res.output.split()), res.output
    res = CliRunner().invoke(app, ["scenarios", str(SCENARIOS)])
    assert res.exit_code == 0 and "smoke_beam" in res.output


def test_a_bad_yes_no_option_names_the_option(tmp_path, tiny_dir):
    """`--option share_query=banana` said only "'banana' is not a yes/no value"."""
    requests = tmp_path / "in.jsonl"
    requests.write_text('{"id": "a", "kind": "prefill_only", "samples": ["hi"], "labels": [" yes", " no"]}\n')
    res = CliRunner().invoke(app, ["infer", "--engine", "bounded", "--model", str(tiny_dir), "--input", str(requests),
                                   "--output", str(tmp_path / "out.jsonl"), "--option", "share_query=banana"])
    assert res.exit_code == 2, res.output
    assert "share_query='banana': not a yes/no value" in " ".join(res.output.split())
