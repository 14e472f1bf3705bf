"""What every section of a scenario shares: the caps on what one scenario may ask for (far
above any bounded workload; below what would hang while requests are made up front, or
exhaust memory while buffers are planned), strict pydantic models, token-length distributions."""
from __future__ import annotations

import re
from typing import Annotated
from pydantic import BaseModel, ConfigDict, Field, model_validator


# Caps on what one scenario may ask for (far above any bounded workload; below what would
# hang while requests are made up front, or exhaust memory while buffers are planned).
MAX_REQUESTS = 1_000_000  # per load point, warm-up included


MAX_CONCURRENCY = 10_000


MAX_RATE = 1_000_000.0


MAX_SECONDS = 7 * 24 * 3600.0


MAX_PROMPT_TOKENS = 1 << 20


MAX_REQUEST_TOKENS = 1 << 22  # max_samples_per_request x max_prompt_tokens


MAX_ITEM_CODES = 10_000_000


MAX_RUN_TOKENS = 200_000_000  # synthetic text a run makes up front (all its load points)


MAX_FILE_BYTES = 1 << 20


DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class TokenDist(Strict):
    """Token-length distribution: normal around `mean`, clipped to [min, max]; `std`
    defaults to a quarter of the range."""

    mean: float = Field(gt=0)
    min: int = Field(ge=1, le=MAX_PROMPT_TOKENS)
    max: int = Field(ge=1, le=MAX_PROMPT_TOKENS)
    std: float | None = Field(default=None, ge=0, le=MAX_PROMPT_TOKENS)

    @model_validator(mode="after")
    def _ordered(self) -> "TokenDist":
        if not self.min <= self.mean <= self.max:
            raise ValueError(f"need min <= mean <= max, got min={self.min} mean={self.mean} max={self.max}")
        return self


Length = Annotated[int, Field(ge=1, le=MAX_PROMPT_TOKENS)]


Count = Annotated[int, Field(gt=0, le=MAX_REQUESTS)]


Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS)]


def _levels(v: list, what: str, cap: float) -> list:
    if any(x <= 0 for x in v):
        raise ValueError(f"every {what} must be > 0")
    if any(x > cap for x in v):
        raise ValueError(f"every {what} must be <= {cap:g}")
    if len(set(v)) != len(v):
        raise ValueError(f"a {what} is listed twice")
    return v


def longest(dist: "TokenDist | int | None") -> int | None:
    return dist if isinstance(dist, int) or dist is None else dist.max
