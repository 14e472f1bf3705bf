from pathlib import Path

import pytest

from engines.base import Description, Precision
from harness.run.runner import Overrides, effective_load
from harness.scenario.files import load_scenario

SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios"


def test_cpu_limits_apply_on_cpu_only_and_say_so():
    sc = load_scenario(SCENARIOS / "beam_short.yaml")
    notes = []
    cpu = effective_load(sc, Overrides(), "cpu", notes.append)
    assert (cpu.requests, cpu.warmup_requests, cpu.concurrency) == (3, 1, [1])
    assert notes and "cpu limits" in notes[0]
    gpu = effective_load(sc, Overrides(), "cuda", notes.append)
    assert (gpu.requests, gpu.concurrency) == (200, [1, 4])


def test_command_line_overrides_win():
    sc = load_scenario(SCENARIOS / "beam_short.yaml")
    load = effective_load(sc, Overrides(requests=7, concurrency=[2, 3]), "cpu", lambda m: None)
    assert (load.requests, load.warmup_requests, load.concurrency) == (7, 1, [2, 3])
    poisson = load_scenario(SCENARIOS / "noop_ceiling.yaml")
    load = effective_load(poisson, Overrides(duration_s=2.5, rate=[10.0]), "cpu", lambda m: None)
    assert (load.duration_s, load.rate) == (2.5, [10.0])


def test_rate_alone_makes_a_closed_scenario_poisson_and_concurrency_alone_the_reverse():
    from harness.scenario.errors import ScenarioError
    from harness.scenario.load import ClosedLoad, PoissonLoad

    sc = load_scenario(SCENARIOS / "beam_short.yaml")  # closed; cpu: 3 requests, 1 warm-up
    notes = []
    load = effective_load(sc, Overrides(rate=[2.0, 8.0]), "cpu", notes.append)
    assert isinstance(load, PoissonLoad) and load.rate == [2.0, 8.0] and load.requests == 3
    # the CPU run's warm-up requests (1; the file's 10 elsewhere) at the slowest rate
    assert sc.cpu.warmup_requests != sc.load.warmup_requests
    assert load.warmup_s == pytest.approx(sc.cpu.warmup_requests / 2.0)
    assert effective_load(sc, Overrides(rate=[2.0]), "cuda", lambda m: None).warmup_s == pytest.approx(
        sc.load.warmup_requests / 2.0)
    assert any("Poisson arrivals" in n for n in notes)
    assert effective_load(sc, Overrides(rate=[0.01], requests=4), "cpu", lambda m: None).warmup_s == 5.0
    with pytest.raises(ScenarioError, match="--rate: every rate"):  # checked as the flag
        effective_load(sc, Overrides(rate=[1e9]), "cpu", lambda m: None)
    with pytest.raises(ScenarioError, match="two load modes"):
        effective_load(sc, Overrides(rate=[2.0], concurrency=[2]), "cpu", lambda m: None)
    poisson = load_scenario(SCENARIOS / "noop_ceiling.yaml")
    load = effective_load(poisson, Overrides(concurrency=[2, 4], requests=6), "cpu", lambda m: None)
    assert isinstance(load, ClosedLoad) and (load.concurrency, load.requests) == ([2, 4], 6)


def test_load_points_never_repeat_a_request(tokenizer):
    import asyncio

    from engines.base import EngineConfig
    from engines.noop import NoopEngine
    from harness.load.loadgen import no_progress
    from harness.run.engine_run import drive
    from harness.workload.requests import build_workload

    sc = load_scenario(SCENARIOS / "smoke_prefill.yaml")  # closed loop, concurrency [1, 2]
    load = effective_load(sc, Overrides(requests=5), "cpu", lambda m: None)
    points = []
    asyncio.run(drive(NoopEngine(EngineConfig(".")), build_workload(sc, tokenizer), load, 0, no_progress, points))
    ids = [[r.item.request.id for r in p.records] for p in points]
    assert len(ids) == 2 and all(len(x) == 7 for x in ids)  # 2 warm-up + 5 each
    assert not set(ids[0]) & set(ids[1])


def _run_with(peaks, describes):
    from harness.run.engine_run import EngineRun
    from harness.run.runner import RunResult

    sc = load_scenario(SCENARIOS / "smoke_prefill.yaml")
    result = RunResult(sc, "m", "cpu", peaks)
    for name, d in describes.items():
        result.engines.append(EngineRun(name, describe=d, computes=name != "noop"))
    return result


def test_engines_computing_in_an_emulated_dtype_are_warned_about(tmp_path, monkeypatch):
    from harness.device.peak import cpu_peaks
    from tests.engines.test_hardware import ICE_LAKE, ZEN4
    from tests.harness.device.test_peak import ICE_LAKE_RATES, ZEN4_RATES

    monkeypatch.setenv("BOUNDED_BENCH_CACHE", str(tmp_path))
    described = lambda dtype, computes: Description("x", "cpu", dtype, Precision(computes))  # noqa: E731
    engines = {"hf": described("bfloat16", "bfloat16"), "bounded": described("bfloat16", "float32"),
               "noop": described("bfloat16", "bfloat16"), "fp32": described("float32", "float32")}
    ice = _run_with(cpu_peaks(ICE_LAKE, measure=lambda c: ICE_LAKE_RATES), engines)
    assert ice.peak_tflops == 0.32
    warned = [w for w in ice.warnings if "emulates" in w]
    assert len(warned) == 1 and warned[0].startswith("hf: computes in bfloat16") and "float32" in warned[0]
    zen = _run_with(cpu_peaks(ZEN4, measure=lambda c: ZEN4_RATES), engines)
    assert zen.peak_tflops == 0.44 and not [w for w in zen.warnings if "emulates" in w]


def test_an_mfu_over_100_percent_says_the_peak_is_wrong():
    from harness.run.runner import run_scenario

    sc = load_scenario(SCENARIOS / "smoke_prefill.yaml")
    load = {"engines": ["hf"], "requests": 2, "concurrency": [1]}
    low = run_scenario(sc, Overrides(peak_tflops=1e-7, **load), log=lambda m: None)
    [warning] = [w for w in low.warnings if "effective MFU up to" in w]
    assert "1e-07 TFLOP/s (given on the command line" in warning and "or give --peak-tflops" in warning
    fair = run_scenario(sc, Overrides(peak_tflops=1e3, **load), log=lambda m: None)
    assert not [w for w in fair.warnings if "effective MFU" in w]


def test_a_query_shared_by_its_items_may_pass_100_percent_by_the_workloads_bound():
    """Effective FLOPs count each item's whole concatenation; an engine computing the query
    once does q + n i tokens' work instead of n (q + i): that ratio, at its largest, is how
    far past 100 % effective MFU goes before the peak is judged wrong."""
    from harness.run.runner import sharing_bound
    from harness.scenario.task import Workload

    assert sharing_bound(load_scenario(SCENARIOS / "prefill_15.yaml").workload) == 1.0
    # relevance_15: queries up to 48 tokens, items from 32, 15 items: 15 * 80 / (48 + 15 * 32)
    assert sharing_bound(load_scenario(SCENARIOS / "relevance_15.yaml").workload) == pytest.approx(1200 / 528)
    fixed = Workload(query_tokens=10, item_tokens=10, items_per_request=4)
    assert sharing_bound(fixed) == pytest.approx(4 * 20 / 50)


def test_a_hub_id_this_machine_cannot_load_names_the_field(monkeypatch):
    """A hub id that is not cached, offline: transformers' OSError said nothing of the scenario."""
    import pytest
    import transformers

    from harness.measure.flops import model_shape

    def offline(*_a, **_k):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files.\nCheck your connection.")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", offline)
    with pytest.raises(ValueError) as e:
        model_shape("someone/not-cached")
    assert str(e.value) == ("field model: 'someone/not-cached' is a hub id this machine cannot load (We couldn't "
                            "connect to 'https://huggingface.co' to load the files.); use a preset or a local "
                            "model directory")


def test_an_int8_plan_over_100_percent_does_not_blame_the_peak():
    """int8/fp8 work counts at the float FLOPs against the float peak, so it may pass 100 %."""
    from types import SimpleNamespace

    from harness.run.engine_run import EngineRun
    from harness.run.runner import RunResult

    int8 = Description("bounded", "cpu", "bfloat16", Precision("bfloat16", "bfloat16 + int8 [down]", low_precision=True))
    sc = load_scenario(SCENARIOS / "smoke_prefill.yaml")
    peaks = SimpleNamespace(mfu_tflops=0.4, why=lambda: "measured", emulated=lambda d: None, slow_host=lambda: [])
    point = lambda: SimpleNamespace(metrics=SimpleNamespace(mfu=1.13, ok=5, p99_estimate=False))  # noqa: E731
    result = RunResult(sc, "m", "cpu", peaks)
    result.engines.append(EngineRun("bounded-int8", describe=int8))
    result.engines[-1].points = [point()]
    result.engines[-1].warnings = lambda: []  # the per-point warnings are not what is tested
    assert not [w for w in result.warnings if "effective MFU up to" in w]
    result.engines.append(EngineRun("bounded", describe=Description("bounded", "cpu", "bfloat16", Precision("bfloat16"))))
    result.engines[-1].points = [point()]
    result.engines[-1].warnings = lambda: []
    assert [w for w in result.warnings if "effective MFU up to" in w]
