from pathlib import Path

from harness.runner import Overrides, effective_load
from harness.scenario import load_scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


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
