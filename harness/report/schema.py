"""What a run folder's files must hold for the report to read them: run.json's fields with
their types, and results.csv / requests.csv's numeric columns with their ranges. A file that
was edited by hand or cut short fails here with one message naming the file and the field
(or the row and column), rather than as a traceback, a figure that cannot be drawn, or a
string read letter by letter as a list.

The checks cover what the report reads; other keys are kept as they are (run.json also
holds what only people read, e.g. `hardware` and `results`)."""
from __future__ import annotations

import math
from typing import Annotated, Any, Optional

import pandas as pd
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

# A latency or duration the harness can write: a request times out after at most a week
# (the scenario's cap on timeout_s); ten times that is surely a corrupted figure.
MAX_MS = 7 * 24 * 3600 * 1000 * 10.0
MAX_RATE = 1e9  # requests, samples, tokens or beams per second
MAX_TFLOPS = 1e6


def _finite_in(lo: float, hi: float):
    def check(v: float | None) -> float | None:
        if v is None or math.isnan(v):  # a figure that was not measured (e.g. a failed point)
            return v
        if not lo <= v <= hi:
            raise ValueError(f"{v:g} is outside {lo:g}..{hi:g}")
        return v
    return AfterValidator(check)


Ms = Annotated[float, _finite_in(0, MAX_MS)]
Rate = Annotated[float, _finite_in(0, MAX_RATE)]
Tflops = Annotated[float, _finite_in(0, MAX_TFLOPS)]
Count = Annotated[int, Field(ge=0)]


class _Obj(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class Harness(_Obj):
    version: str = ""
    git_sha: str = ""


class ScenarioContent(_Obj):
    name: str = ""
    description: str = ""
    model: str = ""
    dtype: str = ""
    task: dict[str, Any] = {}
    workload: dict[str, Any] = {}
    load: dict[str, Any] = {}
    slo: Optional[dict[str, Any]] = None
    bounds: Optional[dict[str, Any]] = None


class ScenarioRecord(_Obj):
    path: Optional[str] = None
    sha256: str = ""
    content: ScenarioContent = ScenarioContent()
    text: str = ""


class Peak(_Obj):
    tflops: Optional[Tflops] = None
    precision: Optional[str] = None
    why: str = ""
    source: str = ""
    rates_tflops: dict[str, Tflops] = {}
    capabilities: dict[str, Any] = {}


class Slo(_Obj):
    mean_ms: Optional[Ms] = None
    p99_ms: Optional[Ms] = None


class EngineRecord(_Obj):
    name: str
    describe: Optional[dict[str, Any]] = None
    start_s: Optional[Ms] = None
    starts: Optional[Count] = None
    skipped: Optional[str] = None
    failed: Optional[str] = None
    unconstrained: bool = False
    optional: bool = False


class Cell(_Obj):
    label: str
    params: dict[str, Any] = {}


class SweepRecord(_Obj):
    params: list[str] = []
    sizing: str = "cell"
    cells: list[Cell] = []


class Probe(_Obj):
    rate: Rate
    meets: bool
    why: str = ""
    mean_ms: Optional[Ms] = None
    p99_ms: Optional[Ms] = None
    ok: Count = 0
    requests: Count = 0
    fell_behind: bool = False


class Search(_Obj):
    max_rate: Optional[Rate] = None
    goodput_qps: Optional[Rate] = None
    lowest_failed_rate: Optional[Rate] = None
    probes: list[Probe] = []


class CellSearch(Search):
    engine: str
    cell: str = ""
    params: dict[str, Any] = {}


class RunJson(_Obj):
    run_id: Optional[str] = None
    harness: Harness = Harness()
    command: list[str] = []
    scenario: ScenarioRecord = ScenarioRecord()
    seed: Optional[int] = None
    model_dir: Optional[str] = None
    device: Optional[str] = None
    peak: Peak = Peak()
    mfu_formula: str = ""
    environment: dict[str, Any] = {}
    engines: list[EngineRecord] = []
    sweep: Optional[SweepRecord] = None
    slo: Optional[Slo] = None
    slo_search: Optional[dict[str, Search]] = None
    slo_searches: Optional[list[CellSearch]] = None
    notes: list[str] = []
    warnings: list[str] = []


EXPECTED = {"model_type": "an object", "dict_type": "an object", "list_type": "a list", "string_type": "a string",
            "bool_type": "true or false", "int_type": "a whole number", "float_type": "a number"}


def _kind(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(v), type(v).__name__)


def check_run_json(data: Any, where: str) -> None:
    """ValueError naming `where` (the file) and the field when run.json's content is not what
    `bench run` writes."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: not what `bench run` writes (an object), got {_kind(data)}")
    try:
        RunJson.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "(top level)"
        got = err.get("input")
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] in EXPECTED:
            msg = f"{EXPECTED[err['type']]} expected, got {_kind(got)}"
        elif err["type"] == "missing":
            msg = "missing"
        more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
        raise ValueError(f"{where}: field {field}: {msg}{more}") from None


# results.csv / requests.csv: each numeric column, and the range a real run can write
RESULT_RANGES = {
    "load_value": (0, 1e9), "requests": (0, 1e9), "ok": (0, 1e9), "errors": (0, 1e9), "timeouts": (0, 1e9),
    "rejected": (0, 1e9), "mean_ms": (0, MAX_MS), "p50_ms": (0, MAX_MS), "p90_ms": (0, MAX_MS),
    "p99_ms": (0, MAX_MS), "max_ms": (0, MAX_MS), "qps": (0, MAX_RATE), "samples_per_s": (0, MAX_RATE),
    "tokens_per_s": (0, MAX_RATE), "beams_per_s": (0, MAX_RATE), "generated_tokens_per_s": (0, MAX_RATE),
    "items_per_s": (0, MAX_RATE), "valid_code_rate": (0, 1), "recall": (0, 1), "effective_tflops": (0, MAX_TFLOPS),
    "mfu": (0, 1e3), "peak_tflops": (0, MAX_TFLOPS), "window_s": (0, MAX_MS / 1000),
    "send_lag_p99_ms": (0, MAX_MS), "achieved_rate_ratio": (0, 1e6),
}
REQUEST_RANGES = {"load_value": (0, 1e9), "index": (0, 1e12), "scheduled_s": (-MAX_MS, MAX_MS),
                  "sent_s": (-MAX_MS, MAX_MS), "done_s": (-MAX_MS, MAX_MS), "latency_ms": (0, MAX_MS),
                  "send_lag_ms": (-MAX_MS, MAX_MS), "samples": (0, 1e9), "tokens": (0, 1e12)}
# columns a measured row must fill (the others may be blank: not measured, or not this task's)
FILLED = {"load_value", "requests", "ok", "errors", "timeouts", "rejected"}


def check_numbers(df: pd.DataFrame, ranges: dict[str, tuple[float, float]], where: str,
                  filled: set[str] = frozenset()) -> pd.DataFrame:
    """The table with its numeric columns as numbers; ValueError naming the file, the row (as
    a spreadsheet numbers it: the header is row 1) and the column on text, inf or a value
    outside what a run writes."""
    for col, (lo, hi) in ranges.items():
        if col not in df:
            continue
        raw = df[col]
        num = pd.to_numeric(raw, errors="coerce")
        blank = raw.isna() | raw.astype(str).str.strip().isin(["", "nan", "NaN"])
        bad = (num.isna() & ~blank) | ~(num.isna() | num.between(lo, hi))
        if col in filled:
            bad |= blank
        if bad.any():
            i = int(bad.to_numpy().nonzero()[0][0])
            value = raw.iloc[i]
            why = ("blank" if blank.iloc[i] else f"{value!r} is not a number" if pd.isna(num.iloc[i])
                   else f"{num.iloc[i]:g} is outside {lo:g}..{hi:g}")
            raise ValueError(f"{where}: row {i + 2}, column {col}: {why}")
        if not pd.api.types.is_numeric_dtype(raw):  # blanks read as text: now NaN (counts stay whole)
            df[col] = num.astype(float)
    return df
