"""The full-vocabulary head of a beam step: logits into planned buffers (prepacked for
oneDNN where that is faster), log-softmax, banned tokens. Shapes: B rows, V vocabulary.

Two tails after the GEMM. `head_log_probs` writes every row's float32 log-probabilities (bit
for bit transformers' `log_softmax(logits.float())`: the float32 plan where the native
float32 head does not serve, and a constrained choice's rows). `logit_summary` is
the low-precision plans' on a CPU: two passes over the bf16 logits (banned ids set to -inf
first) for the maximum of each block of `BLOCK` tokens and each row's log-sum-exp, and no
float32 copy: the choice of beams (kernels/select.py) needs only those to find the blocks
that hold the best continuations, and then reads those blocks' logits alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional, Protocol

import torch
from torch import Tensor

from engines.bounded.kernels import int8
from engines.hardware import onednn_packs_bf16


def prepack_head(weight: Tensor, rows: int) -> Optional[Tensor]:
    """The head weight [V, hidden] prepacked for oneDNN, where that is the faster GEMM: a
    CPU, bfloat16. Measured here (2 cores, AVX-512 bf16): 66 ms vs 79 ms for aten's mm at
    100 rows, but 295 vs 271 ms at 400 rows, so `head_logits` uses it up to PACKED_MAX_ROWS."""
    if weight.device.type != "cpu" or weight.dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available() \
            or not onednn_packs_bf16():
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


BLOCK = 128  # tokens per block of the summary (the presets' 151,936 is 1,187 blocks)


def block_size(vocab: int) -> int:
    return math.gcd(vocab, BLOCK)


def ban_logits(logits: Tensor, banned: Tensor) -> Tensor:
    """Set the banned ids' logits [B, V] to -inf in place; -> their former values [B, E]
    float32 (the log-sum-exp still counts them: log_softmax normalises before the ban)."""
    former = logits.index_select(1, banned).float()
    logits.index_fill_(1, banned, -math.inf)
    return former


def logit_summary(logits: Tensor, banned: Tensor, blk: int) -> tuple[Tensor, Tensor]:
    """logits [B, V] with the banned ids at -inf (ban_logits), banned [B, E] their former
    values -> (lse [B] float32: each row's log-sum-exp over every token, the banned ones
    included; block_max [B, V/blk] float32: the largest logit of each block). Plain tensor
    ops: compiled (programs/beam.BeamHeadTail) they fuse into two passes over the bf16
    logits (block maxima, then exp-sums against the row maximum taken from them)."""
    block_max = logits.view(logits.shape[0], -1, blk).float().amax(-1)
    m = block_max.amax(-1, keepdim=True)  # [B, 1]
    lse = (logits.float() - m).exp().sum(-1).log() + m.squeeze(-1)
    return torch.logaddexp(lse, torch.logsumexp(banned, -1)), block_max


@dataclass(frozen=True)
class LogitRows:
    """A head's output for the choice of beams without float32 log-probabilities:
    log p(t | row) = float(logits[row, t]) - lse[row] (so a block's best is exactly its
    block_max's). Shapes [R, W, ...]: R requests, W rows."""

    logits: Tensor  # [R, W, V] the GEMM's output dtype, banned ids at -inf
    lse: Tensor  # [R, W] float32
    block_max: Tensor  # [R, W, V/blk] float32
    blk: int

    def view(self, r: int, w: int) -> "LogitRows":
        return LogitRows(self.logits.view(r, w, -1), self.lse.view(r, w), self.block_max.view(r, w, -1), self.blk)

    def requests(self, index: Tensor | slice | int) -> "LogitRows":
        return LogitRows(self.logits[index], self.lse[index], self.block_max[index], self.blk)

    @property
    def shape(self) -> torch.Size:
        return self.logits.shape

    @property
    def device(self) -> torch.device:
        return self.logits.device

    def log_probs(self) -> Tensor:
        """[..., V] float32 log-probabilities, materialised (a constrained request's rows)."""
        return self.logits.float() - self.lse[..., None]

    def at(self, row: Tensor, token: Tensor) -> Tensor:
        """log p of (row, token) pairs: row/token [R, n] (rows within each request) -> [R, n]."""
        r, w, v = self.logits.shape
        return self.logits.reshape(r, w * v).gather(1, row * v + token).float() - self.lse.gather(1, row)


class FusedHead(Protocol):
    """What HiddenRows needs of the head that made them (runtime/beam_head.BeamHead)."""

    def top(self, hidden: Tensor, cum: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]: ...

    def logit_rows(self, hidden: Tensor) -> "LogitRows | Tensor": ...


@dataclass(frozen=True)
class HiddenRows:
    """A fused head's output before any logits exist: the final-normed hidden rows. The
    common choice of beams (every request free, select.next_beams) runs the head and its
    top-k in one native pass (`top`); any other choice takes LogitRows (`materialise`)."""

    hidden: Tensor  # [R, W, hidden]
    vocab: int
    head: FusedHead

    def view(self, r: int, w: int) -> "HiddenRows":
        return replace(self, hidden=self.hidden.view(r, w, -1))

    def requests(self, index: Tensor | slice | int) -> "HiddenRows":
        return replace(self, hidden=self.hidden[index])

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.hidden.shape[:-1], self.vocab))

    @property
    def device(self) -> torch.device:
        return self.hidden.device

    def top(self, cum: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
        """cum [R, W] -> each request's best k continuations (select.top_continuations)."""
        return self.head.top(self.hidden.reshape(-1, self.hidden.shape[-1]), cum, k)

    def materialise(self) -> "LogitRows | Tensor":
        """LogitRows [R, W, ...], or (a float32 head) log-probabilities [R, W, V]."""
        r, w, _ = self.hidden.shape
        out = self.head.logit_rows(self.hidden.reshape(r * w, -1))
        return out.view(r, w, -1) if isinstance(out, Tensor) else out.view(r, w)


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
