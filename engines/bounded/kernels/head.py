"""The full-vocabulary head of a beam step: logits into planned buffers (prepacked for
oneDNN where that is faster), log-softmax, banned tokens. Shapes: B rows, V vocabulary.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from engines.bounded.kernels import int8


def prepack_head(weight: Tensor, rows: int) -> Optional[Tensor]:
    """The head weight [V, hidden] prepacked for oneDNN, where that is the faster GEMM: a
    CPU, bfloat16. Measured here (2 cores, AVX-512 bf16): 66 ms vs 79 ms for aten's mm at
    100 rows, but 295 vs 271 ms at 400 rows, so `head_logits` uses it up to PACKED_MAX_ROWS."""
    if weight.device.type != "cpu" or weight.dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available():
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight, rows)


PACKED_MAX_ROWS = 200


def head_logits(hidden: Tensor, weight: Tensor, out: Tensor, packed: Optional[Tensor] = None) -> Tensor:
    """hidden [B, hidden] -> full-vocabulary logits [B, V] in the weight's dtype: into `out`,
    or (prepacked weight, few rows) a new tensor."""
    if packed is not None and hidden.shape[0] <= PACKED_MAX_ROWS:
        return torch.ops.mkldnn._linear_pointwise(hidden, packed, None, "none", [], "")
    return torch.mm(hidden, weight.t(), out=out)


def head_log_probs(hidden: Tensor, weight: Tensor, banned: Tensor, logp: Tensor,
                   logits: Optional[Tensor] = None, packed: Optional[Tensor] = None) -> Tensor:
    """Full-vocabulary log-probabilities into planned buffers, as transformers computes them.

    hidden: [B, hidden] final-normed; weight: [V, hidden] head; banned: [E] ids (EOS) set
    to -inf after the log-softmax, without renormalising; logp: [B, V] float32 output
    buffer; logits: [B, V] buffer in the weight's dtype when that is not float32 (the GEMM
    writes there, then the values are widened into `logp`). The log-softmax is aten's, in
    place, so float32 results match transformers' `log_softmax(logits.float())` bit for bit.
    """
    if weight.dtype == torch.float32:
        head_logits(hidden, weight, logp)
    else:
        logp.copy_(head_logits(hidden, weight, logits, packed))
    return log_probs_of(logp, banned, logp)


def log_probs_of(logits: Tensor, banned: Tensor, logp: Tensor) -> Tensor:
    """float32 logits [B, V] -> log-probabilities in `logp` (may be `logits`), banned ids -inf."""
    torch.ops.aten._log_softmax.out(logits, -1, False, out=logp)
    return logp.index_fill_(-1, banned, -math.inf)


@dataclass(frozen=True)
class Int8Head:
    """The head as a W8A8 GEMM (precision group `head`: int8): the weight quantised per
    vocabulary row and prepacked for oneDNN once; each call scales the hidden rows."""

    weight: Tensor  # [V, hidden] int8 (an empty tensor once prepacked)
    scale: Tensor  # [V] float32
    packed: Optional[Tensor]

    @classmethod
    def of(cls, weight: Tensor) -> "Int8Head":
        q, scale = int8.int8_quantise(weight)
        packed = int8.prepack(q)
        return cls(q if packed is None else q[:0], scale, packed)

    def __call__(self, hidden: Tensor, out: Optional[Tensor] = None) -> Tensor:
        # hidden [B, hidden] -> float32 logits [B, V] (in `out`, a planned buffer, when given)
        return int8.int8_linear_packed(hidden, self.packed, self.weight, self.scale, out)
