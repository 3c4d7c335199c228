"""Requests, results and their validation for the sampling engine.

A `Request` is token-in/token-out: the prompt is a list of token ids (the agent harness renders
chat turns with `c2jax.data.chat_format` and never re-tokenises). A bad request is rejected on its
own with a `RequestError` in its `Result` (``result.error``); the other requests go on.

Per-token outputs of a `Result` (T = prompt length + number of generated tokens):

    tokens        [T] int32          prompt followed by the generated tokens
    routes        [T, n_moe, top_k]  int32 routed experts of every token at every MoE layer (for
                                     router replay in the trainer; prompt and reused prefix too)
    versions      [T] int64          policy version that processed each prompt token (computed its
                                     KV and routes) or sampled each generated token
    route_versions [T] int64         policy version whose router produced ``routes[t]`` (differs
                                     from ``versions`` only after ``recompute_cache_on_update``)
    logprobs      [G] f32            generated tokens: logprob under the sampling distribution
    raw_logprobs  [G] f32            generated tokens: logprob under the raw model distribution
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np


class RequestError(ValueError):
    """A request was rejected; the message says which field and why."""


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. ``temperature == 0`` means greedy (argmax)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 64
    seed: Optional[int] = None  # None: the engine draws one (reported in the result)
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    include_stop_str: bool = False  # keep the stop string at the end of `text`


@dataclass
class Request:
    prompt: Sequence[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    id: Optional[str] = None


@dataclass
class Result:
    id: Optional[str]
    prompt_len: int = 0
    tokens: np.ndarray = field(default_factory=lambda: np.zeros((0,), np.int32))
    routes: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0), np.int32))
    versions: np.ndarray = field(default_factory=lambda: np.zeros((0,), np.int64))
    route_versions: np.ndarray = field(default_factory=lambda: np.zeros((0,), np.int64))
    logprobs: np.ndarray = field(default_factory=lambda: np.zeros((0,), np.float32))
    raw_logprobs: np.ndarray = field(default_factory=lambda: np.zeros((0,), np.float32))
    text: Optional[str] = None  # decoded output bytes (cut at a stop string), if a tokenizer is set
    finish_reason: Optional[str] = None  # 'length' | 'stop_token' | 'stop_string' | 'error' | 'cancelled'
    stop: Optional[object] = None  # the stop token id or stop string that ended the sequence
    seed: Optional[int] = None
    reused_prefix_len: int = 0  # prompt tokens whose KV came from the prefix cache
    error: Optional[RequestError] = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def output_tokens(self) -> np.ndarray:
        return self.tokens[self.prompt_len:]


def validate_request(req: Request, *, vocab_size: int, max_len: int) -> SamplingParams:
    """Raise `RequestError` with a clear message if `req` cannot run; return its params.

    ``max_len`` is the engine's per-sequence capacity (prompt + generated tokens).
    """
    p = req.params
    if not isinstance(p, SamplingParams):
        raise RequestError(f"params must be a SamplingParams, got {type(p).__name__}")
    try:
        prompt = np.asarray(req.prompt)
    except Exception as e:  # ragged nesting etc.
        raise RequestError(f"prompt must be a flat sequence of token ids: {e}") from None
    if prompt.ndim != 1:
        raise RequestError(f"prompt must be a flat sequence of token ids, got shape {prompt.shape}")
    if prompt.size == 0:
        raise RequestError("empty prompt: at least one token id is required")
    if not np.issubdtype(prompt.dtype, np.integer):
        raise RequestError(f"prompt must hold integer token ids, got dtype {prompt.dtype}")
    bad = np.flatnonzero((prompt < 0) | (prompt >= vocab_size))
    if bad.size:
        i = int(bad[0])
        raise RequestError(f"unknown token id {int(prompt[i])} at prompt position {i} "
                           f"(vocab_size={vocab_size}); {bad.size} bad id(s) in total")
    if prompt.size >= max_len:
        raise RequestError(f"prompt too long: {prompt.size} tokens, the engine holds at most "
                           f"{max_len} per sequence (prompt + at least 1 new token)")
    t = p.temperature
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        raise RequestError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
    tp = p.top_p
    if isinstance(tp, bool) or not isinstance(tp, (int, float)) or not (0.0 < tp <= 1.0):
        raise RequestError(f"top_p must be in (0, 1], got {tp!r}")
    tk = p.top_k
    if isinstance(tk, bool) or not isinstance(tk, (int, np.integer)) or tk < 0:
        raise RequestError(f"top_k must be an integer >= 0 (0 = off), got {tk!r}")
    m = p.max_new_tokens
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
        raise RequestError(f"max_new_tokens must be an integer >= 1, got {m!r}")
    if p.seed is not None and (isinstance(p.seed, bool) or not isinstance(p.seed, (int, np.integer))
                               or not 0 <= p.seed < 2**32):
        raise RequestError(f"seed must be None or an integer in [0, 2**32), got {p.seed!r}")
    for s in p.stop_token_ids:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or not 0 <= s < vocab_size:
            raise RequestError(f"stop_token_ids must be token ids in [0, {vocab_size}), got {s!r}")
    for s in p.stop_strings:
        if not isinstance(s, str) or not s:
            raise RequestError(f"stop_strings must be non-empty strings, got {s!r}")
    return p
