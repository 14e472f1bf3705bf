"""engines/base.py: the typed description every engine gives the harness."""
from engines.base import Bounds, Description, EngineConfig, Precision
from engines.noop import NoopEngine


def test_description_round_trips_through_run_json():
    d = Description("bounded", "cpu", "bfloat16", Precision("float32", "float32 + int8 [down]", "no native bf16", True),
                    "0.1.0", "aot", None, "not used", "prefill 16 tokens", {"stats": {"requests": 3}})
    flat = d.to_dict()
    assert flat["compute_dtype"] == "float32" and flat["stats"] == {"requests": 3} and flat["name"] == "bounded"
    assert Description.from_dict(flat) == d


def test_description_reads_the_older_run_json_layout():
    old = {"name": "bounded", "dtype": "bfloat16", "compute_dtype": "float32", "mode": "eager (AOT failed)",
           "precision": {"summary": "float32 + int8 [down]", "gemm": {"qkv": "dense", "down": "int8"},
                         "accuracy_gate": {"prefill_only": {"passed": False}}}}
    d = Description.from_dict(old)
    assert d.precision == Precision("float32", "float32 + int8 [down]", "", True, True)
    assert d.mode == "eager (AOT failed)" and d.details == {}
    assert d.precision.label == "float32 + int8 [down] (accuracy gate: further from float32 than bf16, accepted)"
    plain = Description.from_dict({"name": "hf", "dtype": "bfloat16"}).precision
    assert plain == Precision("bfloat16") and plain.label == "bfloat16" and not plain.low_precision


def test_an_engine_without_a_policy_computes_in_the_dtype_asked_for(tiny_dir):
    d = NoopEngine(EngineConfig(tiny_dir, "float16", "cpu", Bounds(), options={})).describe()
    assert (d.engine, d.version, d.precision.dtype, d.precision.label, d.fallback) == ("noop", "1", "float16",
                                                                                       "float16", None)
