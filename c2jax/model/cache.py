"""The latent KV cache used by `apply(..., cache=...)` for prefill and decode.

Layout (a plain dict pytree, so it jits, shards and donates like params):

    cache = {
        "lengths": int32 [B]                  tokens already written per row (next write slot)
        "dense_layers": {"c_kv":   [L_dense, B, T, kv_lora_rank],
                         "k_rope": [L_dense, B, T, qk_rope_head_dim]}   (absent if no dense layers)
        "moe_layers":   {same, leading L_moe}                            (absent if no MoE layers)
    }

T = `max_len` is static (the compile shape); attention always runs over all T slots with a mask,
so one compiled decode step serves every length. Only the compressed latent `c_kv` (after
kv_a_norm) and the rotated `k_rope` are stored: (kv_lora + rope) numbers per token per layer.

How a call with a cache works (`apply(params, tokens [B, S], cfg, cache=cache, segment_ids=...)`):
* row b's S new tokens are written at slots ``lengths[b] + 0 .. S-1``; each attends to every slot
  ``<=`` its own (its row's history plus the causal part of this chunk);
* ``segment_ids`` [B, S] (optional) marks valid tokens with non-zero ids; valid tokens must come
  first in each row (right padding). ``lengths[b]`` advances by the number of valid tokens, so the
  padding slots are overwritten by the next call and never attended to by valid tokens;
* ``positions`` (RoPE positions) default to the write slots ``lengths[b] + i``; pass them to use
  other positions (e.g. left-padded prompts);
* writes past T are dropped (size T for prompt + generation).

Batched prompts of different lengths: right-pad them to [B, S_prompt], pass
``segment_ids = (arange(S) < prompt_len[:, None]).astype(int32)`` and read each row's next-token
logits at index ``prompt_len[b] - 1``. Then decode with tokens [B, 1] (one compiled shape); rows
that are finished can pass ``segment_ids = 0`` so they do not advance. With S == 1 the attention
uses the absorbed MLA form. Use ``moe.impl='dropless'`` for inference (capacity drops tokens
when a call carries few tokens).
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from c2jax.model.config import ModelConfig


def _dtype(cfg: ModelConfig, dtype: Optional[str]):
    return jnp.dtype(dtype or cfg.dtype)


def init_cache(cfg: ModelConfig, batch_size: int, max_len: int, dtype: Optional[str] = None) -> dict:
    """An empty cache for `batch_size` rows of up to `max_len` tokens (see module docstring)."""
    a, dt = cfg.attention, _dtype(cfg, dtype)
    out: dict = {"lengths": jnp.zeros((batch_size,), jnp.int32)}
    for key, n in (("dense_layers", cfg.n_dense_layers), ("moe_layers", cfg.n_moe_layers)):
        if n:
            out[key] = {"c_kv": jnp.zeros((n, batch_size, max_len, a.kv_lora_rank), dt),
                        "k_rope": jnp.zeros((n, batch_size, max_len, a.qk_rope_head_dim), dt)}
    return out


def cache_max_len(cache: dict) -> int:
    """T, the static number of slots per row."""
    for key in ("dense_layers", "moe_layers"):
        if key in cache:
            return cache[key]["c_kv"].shape[2]
    raise ValueError("cache has no layers")


def reset_rows(cache: dict, rows: jax.Array) -> dict:
    """Empty the given rows (bool [B]) so a new sequence can start there (slots are just
    forgotten: `lengths` is set to 0; stale latents are masked out and overwritten)."""
    return dict(cache, lengths=jnp.where(rows, 0, cache["lengths"]))
