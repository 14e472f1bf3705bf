"""Engine options: parsed and checked once; an unknown or bad option says what is known
or allowed."""
from __future__ import annotations

import pytest

from engines.bounded.options import BoundedOptions, OptionError


def test_defaults_and_conversions():
    assert BoundedOptions.parse({}) == BoundedOptions()
    o = BoundedOptions.parse({"max_batch_tokens": "4096", "max_wait_ms": "0.5", "fp8": "down", "compile": "eager"})
    assert (o.max_batch_tokens, o.max_wait_ms, o.fp8, o.compile) == (4096, 0.5, ("down",), "eager")
    assert BoundedOptions.parse({"fp8": ["qkv", "o"]}).fp8 == ("qkv", "o")
    assert BoundedOptions.parse({"cuda_graphs": "off"}).cuda_graphs is False  # --option cuda_graphs=off
    assert BoundedOptions.parse({"cuda_graphs": False, "prefill_attention": "padded"}) == \
        BoundedOptions(cuda_graphs=False, prefill_attention="padded")


def test_unknown_option_lists_the_known_ones():
    with pytest.raises(OptionError) as e:
        BoundedOptions.parse({"compiel": "aot", "max_batch": 3})
    msg = str(e.value)
    assert "unknown bounded-engine option(s) compiel, max_batch" in msg
    assert "known options: compile, max_wait_ms, max_batch_tokens, max_batch_seqs, max_labels, " \
           "max_batch_beams, residual, precision, int8, fp8, prefill_attention, cuda_graphs, gate, share_query" in msg


@pytest.mark.parametrize("options,says", [
    ({"compile": "jit"}, "compile='jit'; choose one of aot, eager"),
    ({"residual": "int8"}, "residual='int8'; choose one of bfloat16, float32, float16"),
    ({"fp8": ["mlp"]}, "fp8 groups ['mlp']; groups are qkv, o, gate_up, down"),
    ({"int8": ["mlp"]}, "int8 groups ['mlp']; groups are qkv, o, gate_up, down, head"),
    ({"int8": ["down"], "fp8": "down"}, "groups ['down'] are both int8 and fp8"),
    ({"precision": "int8"}, "precision='int8'; choose one of auto, bfloat16, float32, float16"),
    ({"gate": "maybe"}, "gate='maybe'; choose one of refuse, decisions, accept"),
    ({"max_labels": 0}, "max_labels >= 1"),
    ({"max_wait_ms": -1}, "max_wait_ms=-1: give milliseconds in 0..10000"),
    ({"max_batch_tokens": "lots"}, "max_batch_tokens='lots': a whole number is expected"),
    # hostile values: each was accepted, and misread or hung
    ({"max_batch_tokens": 2.7}, "max_batch_tokens=2.7: a whole number is expected"),  # was truncated to 2
    ({"max_batch_seqs": True}, "max_batch_seqs=True: a whole number is expected"),  # was 1
    ({"max_wait_ms": float("nan")}, "max_wait_ms=nan: give milliseconds"),  # a batch waited forever
    ({"max_wait_ms": "inf"}, "max_wait_ms='inf': give milliseconds"),  # --option max_wait_ms=inf
    ({"max_labels": 10**11}, "max_labels=100000000000: outside 0..4,096"),  # tried to allocate 800 GB at start
    ({"max_batch_beams": 1 << 40}, "outside 0..65,536"),
    ({"fp8": 5}, "fp8=5: give a GEMM group or a list of them"),  # was "'int' object is not iterable"
    ({"residual": [1]}, "residual=[1]: a name is expected"),  # was "unhashable type: 'list'"
    ({"prefill_attention": "flash"}, "prefill_attention='flash'; choose one of auto, per_sequence, padded, dense, native"),
    ({"cuda_graphs": "maybe"}, "cuda_graphs='maybe': not a yes/no value"),
    ({"share_query": "banana"}, "share_query='banana': not a yes/no value"),  # named only the value
])
def test_bad_values_say_what_is_allowed(options, says):
    with pytest.raises(OptionError, match=says.replace("[", r"\[").replace("]", r"\]")):
        BoundedOptions.parse(options)
