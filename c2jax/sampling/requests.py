"""What the engine keeps per request (`SeqState`) and emits per token or completion (`StreamEvent`)."""
from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from c2jax.sampling.stops import StopMatcher
from c2jax.sampling.types import Request, Result, SamplingParams


@dataclass
class StreamEvent:
    """One generated token of a request (``token`` set) or its completion (``result`` set)."""

    index: int  # position of the request in the call (generate/stream) or submission order
    request_id: Optional[str]
    token: Optional[int] = None
    logprob: Optional[float] = None
    raw_logprob: Optional[float] = None
    version: Optional[int] = None
    result: Optional[Result] = None


@dataclass
class SeqState:
    """A request inside the engine: its row, sampled tokens and logprobs, stop state and future."""

    index: int
    req: Request
    params: SamplingParams
    prompt: np.ndarray
    seed: int
    slot: int = -1
    gen: list = field(default_factory=list)
    lps: list = field(default_factory=list)
    lpr: list = field(default_factory=list)
    matcher: Optional[StopMatcher] = None
    next_tok: int = 0
    draining: bool = False
    finish_reason: Optional[str] = None
    stop: Any = None
    reused: int = 0
    result: Optional[Result] = None
    future: Optional[concurrent.futures.Future] = None
