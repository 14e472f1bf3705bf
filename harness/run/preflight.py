"""The whole scenario checked before any engine starts, against what the file alone cannot
tell: the model it names (preset, local directory or hub id), its maximum positions and
vocabulary, the labels under its tokenizer, the item codes the tokenizer can make, the
dataset line by line (each line through the engines' own request check), each engine's
options against that engine's own schema, the device, and the command line's overrides.

Every failure is a `ScenarioError` that names the file and the field (`bench` exits 2);
a preset is checked from its built-in config, without materialising its weights.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.base import Bounds, EngineUnavailable, RequestRejected
from engines.registry import engine_class
from engines.validate import FieldNames, Limits, RequestChecker
from harness.workload.presets import PRESETS, tokenizer_files
from harness.scenario.fields import DEVICE, MAX_RUN_TOKENS
from harness.scenario.task import BeamTaskSpec, PrefillTaskSpec
from harness.scenario.schema import EngineSpec, Scenario
from harness.scenario.errors import ScenarioError
from harness.scenario.engines import select_engines
from harness.workload.requests import LineError, dataset_path, read_lines, scenario_bounds, single_token_words
from harness.run.sweep import plan_cells
from harness.run.runner import effective_load
from harness.load.modes import load_mode

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
MAX_LISTED = 5  # bad dataset lines quoted in one message


@dataclass(frozen=True)
class ModelFacts:
    """What the checks need to know of a model; None where it cannot be known offline."""

    kind: str  # "preset" | "directory" | "hub"
    vocab: int | None
    max_positions: int | None
    eos: frozenset[int]
    tokenizer: Any | None


def model_facts(spec: str, where: str = "field model") -> ModelFacts:
    """Facts of a scenario's `model`; ScenarioError (message starting with `where`) when it
    is neither a preset, nor a model directory, nor shaped like a hub id."""
    if spec in PRESETS:
        cfg = PRESETS[spec]
        return ModelFacts("preset", cfg["vocab_size"], cfg["max_position_embeddings"],
                          frozenset([cfg["eos_token_id"]]), _tokenizer(str(tokenizer_files()[0].parent), where))
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ScenarioError(f"{where}: {path.resolve()} has no config.json (not a Hugging Face model directory)")
        limits = Limits.for_model(path, Bounds())
        return ModelFacts("directory", limits.vocab, limits.max_positions, limits.eos, _tokenizer(str(path), where))
    if path.exists():
        raise ScenarioError(f"{where}: {path} is a file, not a model directory")
    if not HUB_ID.match(spec) or spec.startswith((".", "~", "/")):
        raise ScenarioError(f"{where}: {spec!r} is not a preset ({', '.join(PRESETS)}), nor a model directory "
                            f"(no folder {path.resolve()}), nor a hub id (owner/name)")
    return _hub_facts(spec)


def _tokenizer(source: str, where: str) -> Any:
    try:
        return _load_tokenizer(source, Path(source).stat().st_mtime_ns)
    except Exception as e:  # noqa: BLE001 - any failure to load is the same news to the user
        raise ScenarioError(f"{where}: cannot load the tokenizer of {source} ({type(e).__name__}: {e})") from None


@functools.lru_cache(maxsize=4)
def _load_tokenizer(source: str, _mtime: int) -> Any:
    """Loading one takes seconds; a process checks several scenarios of one model (tests, serve)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source)


def _hub_facts(spec: str) -> ModelFacts:
    """A hub id: what the local hub cache knows (nothing, offline, before its first download)."""
    try:
        from transformers import AutoConfig, AutoTokenizer

        cfg = AutoConfig.from_pretrained(spec, local_files_only=True).to_dict()
        tok = AutoTokenizer.from_pretrained(spec, local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached: the engines fetch it, and check it then
        return ModelFacts("hub", None, None, frozenset(), None)
    eos = cfg.get("eos_token_id")
    eos = frozenset([] if eos is None else [eos] if isinstance(eos, int) else eos)
    return ModelFacts("hub", cfg.get("vocab_size"), cfg.get("max_position_embeddings"), eos, tok)


def check_scenario(sc: Scenario, path: str | Path, *, engines: list[str] | None = None,
                   device: str | None = None, engine_options: dict[str, Any] | None = None,
                   overrides: Any = None, device_here: bool = True) -> list[EngineSpec]:
    """Check `sc` (loaded from `path`) for a run of `engines` (default: the scenario's) on
    `device`; `engine_options` are merged into each engine's (as `bench serve --option`
    does); `overrides` is a runner.Overrides. `device_here=False`: the engines run on other
    machines (a Ray cluster), so this one's GPUs say nothing. -> the engines that will run."""
    src = str(path)
    dev = device or sc.device
    if device is not None and not DEVICE.match(device):
        raise ScenarioError(f"--device {device}: not a device; give cpu, cuda or cuda:N")
    if device_here:
        _check_device(dev, "--device" if device else f"{src}: field device")
    facts = model_facts(sc.model, f"{src}: field model")
    _check_positions(sc, facts, src)
    _check_sweep(sc, facts, src, dev, getattr(overrides, "sweep", None))
    if facts.tokenizer is not None:
        _check_task(sc, facts, src)
    specs = select_engines(sc, engines)
    for k, spec in enumerate(specs):
        _check_options(spec, {**spec.options, **(engine_options or {})}, src, k)
    if overrides is not None:
        _check_overrides(sc, overrides, dev)
    ds = dataset_path(sc, Path(path).parent)
    if ds is not None:
        _check_dataset(sc, ds, facts, src)
    return specs


def _check_device(dev: str, where: str) -> None:
    if dev.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ScenarioError(f"{where}: {dev} asked for, but torch sees no GPU on this machine (use --device cpu)")
        index = int(dev.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ScenarioError(f"{where}: {dev} asked for, but this machine has {torch.cuda.device_count()} GPU(s)")


def _check_positions(sc: Scenario, facts: ModelFacts, src: str) -> None:
    if facts.max_positions is None:
        return
    steps = sc.task.decode_steps if isinstance(sc.task, BeamTaskSpec) else 0
    b = sc.bounds
    if b.max_prompt_tokens + steps > facts.max_positions:
        extra = f" + {steps} decode steps" if steps else ""
        raise ScenarioError(f"{src}: field bounds.max_prompt_tokens: {b.max_prompt_tokens}{extra} > the model's "
                            f"{facts.max_positions} positions (max_position_embeddings)")
    pt = sc.workload.prompt_tokens
    longest = pt if isinstance(pt, int) else getattr(pt, "max", None)
    if longest is not None and longest > facts.max_positions:
        raise ScenarioError(f"{src}: field workload.prompt_tokens: up to {longest} tokens > the model's "
                            f"{facts.max_positions} positions")


def _check_sweep(sc: Scenario, facts: ModelFacts, src: str, device: str, override: Any) -> None:
    """Every cell of the sweep (with --sweep's values) fits the model's positions."""

    if sc.sweep is None and not override:
        return
    try:
        cells = plan_cells(sc, sc.load, device, override).cells
    except ValueError as e:
        raise ScenarioError(str(e) if str(e).startswith("--sweep") else f"{src}: field sweep: {e}") from None
    for cell in cells:
        try:
            _check_positions(cell.scenario, facts, src)
        except ScenarioError as e:
            raise ScenarioError(f"{e} (sweep cell {cell.label})") from None


def _check_task(sc: Scenario, facts: ModelFacts, src: str) -> None:
    task = sc.task
    if isinstance(task, PrefillTaskSpec):
        checker = RequestChecker(Limits(vocab=facts.vocab), facts.tokenizer, FieldNames(labels="task.labels"))
        try:
            checker.labels(task.labels)
        except RequestRejected as e:
            raise ScenarioError(f"{src}: field {e}") from None
    needs_words = sc.workload.dataset is None
    if not needs_words:
        return
    try:
        words = single_token_words(facts.tokenizer)
    except ValueError as e:
        raise ScenarioError(f"{src}: field model: {e}") from None
    codes = getattr(task, "item_codes", None)
    if codes is not None and codes.count > len(words) ** codes.length:
        raise ScenarioError(f"{src}: field task.item_codes.count: {codes.count:,} > the {len(words):,}^"
                            f"{codes.length} distinct codes of {codes.length} single-token words")


def _check_options(spec: EngineSpec, options: dict[str, Any], src: str, k: int) -> None:
    try:
        cls = engine_class(spec.name)
    except EngineUnavailable:
        return  # skipped at run time, with its reason
    try:
        cls.check_options(options)
    except (TypeError, ValueError) as e:
        raise ScenarioError(f"{src}: field engines.{k} ({spec.title}): {e}") from None


def _check_overrides(sc: Scenario, ov: Any, device: str) -> None:
    load = effective_load(sc, ov, device, lambda _m: None)
    _check_run_size(sc, load, ov)
    if ov.peak_tflops is not None and not 0 < ov.peak_tflops < float("inf"):
        raise ScenarioError(f"--peak-tflops {ov.peak_tflops}: give a positive number of TFLOP/s")
    if ov.find_max_qps and sc.slo.mean_ms is None and sc.slo.p99_ms is None:
        raise ScenarioError(f"--find-max-qps: scenario {sc.name!r} has no slo (mean_ms and/or p99_ms) to meet")


def _check_run_size(sc: Scenario, load: Any, ov: Any) -> None:
    """Synthetic requests are made before each load point starts (and kept for the run):
    their text must fit in memory."""

    if sc.workload.dataset is not None:
        return  # a dataset's requests are read once and reused
    mode = load_mode(load)
    per_cell = sum(mode.size(load, v, sc.workload.seed) for v in mode.levels(load))
    cells = plan_cells(sc, load, "cpu", getattr(ov, "sweep", None)).cells if sc.sweep or getattr(ov, "sweep", None) \
        else []
    sizes = [_longest_request(c.scenario) for c in cells] or [_longest_request(sc)]
    made, text = per_cell * len(sizes), per_cell * sum(sizes)
    if text > MAX_RUN_TOKENS:
        raise ScenarioError(f"the run would make {made:,} requests of up to {max(sizes):,} tokens up front "
                            f"({text:,} tokens of text > {MAX_RUN_TOKENS:,}): ask for fewer requests, a shorter "
                            "duration, fewer load points or sweep cells (scenario, or --requests/--duration)")


def _longest_request(sc: Scenario) -> int:
    wl, most = sc.workload, lambda d: d if isinstance(d, int) else d.max  # noqa: E731
    if wl.has_query:
        return most(wl.items_per_request) * (most(wl.query_tokens) + most(wl.item_tokens))
    return most(wl.prompt_tokens) * (wl.samples_per_request if isinstance(sc.task, PrefillTaskSpec) else 1)


def _check_dataset(sc: Scenario, path: Path, facts: ModelFacts, src: str) -> None:
    where = f"{src}: field workload.dataset"
    if not path.is_file():
        raise ScenarioError(f"{where}: no file {path.resolve()}")
    limits = Limits(scenario_bounds(sc), facts.vocab, facts.max_positions, facts.eos)
    checker = RequestChecker(limits, facts.tokenizer)
    bad, good = [], 0
    try:
        for n, _rid, req in read_lines(path):
            problem = _line_problem(req, sc.task.kind, checker)
            if problem:
                bad.append(f"line {n}: {problem}")
            else:
                good += 1
    except OSError as e:
        raise ScenarioError(f"{where}: cannot read {path} ({e.strerror})") from None
    if bad:
        more = f"\n  ... and {len(bad) - MAX_LISTED} more bad lines" if len(bad) > MAX_LISTED else ""
        raise ScenarioError(f"{where}: {path} has {len(bad)} bad line(s):\n  " + "\n  ".join(bad[:MAX_LISTED]) + more)
    if not good:
        raise ScenarioError(f"{where}: {path} holds no requests")


def _line_problem(req: Any, kind: str, checker: RequestChecker) -> str:
    if isinstance(req, LineError):
        return req.reason
    if req.kind != kind:
        return f"a {req.kind} request in a {kind} scenario"
    try:
        checker.check(req)
    except RequestRejected as e:
        return str(e)
    return ""
