"""The engine's jitted device steps over a slot cache (fixed shapes; one compile per shape).

The cache is the model's latent MLA cache (`c2jax.model.cache` semantics) with one row per slot,
in the engine's per-layer layout (forward.py): ``lengths [S]`` and per layer ``c_kv [S, T,
kv_lora]``, ``k_rope [S, T, rope]``; the forward is forward.serving_apply.
Row ``s`` holds the KV of the sequence in slot ``s`` for positions ``0 .. lengths[s]-1``
(positions = cache slots, so a sequence always starts at 0 in its row). Everything that varies per
request (lengths, sampling parameters, seeds) is data, not shape:

* `decode_step`: one token per slot ([S, 1], absorbed MLA); rows with ``active = False`` do not
  advance (their write lands on their first free slot and is overwritten later).
* `prefill_row`: a chunk of C tokens (C from a few bucket sizes) into ONE row starting at an
  arbitrary offset (after a reused prefix), right-padded; samples from the last valid position.
* `copy_row`: copy a row's latents to another row (prefix reuse from a sequence in another slot).
* `spec_decode_step`: greedy speculative decoding with the model's MTP head (see spec.py).

All take and return the cache with buffer donation, so a step does not copy it. Decode and prefill
take a static attention window ``win`` (a power of two >= the longest row they touch, see
`Engine._window`): attention and the cache update run over the first ``win`` positions only, so a
large ``max_len`` costs nothing until sequences are long (one compile per window size).
"""
from __future__ import annotations

import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp

from c2jax.model.config import ModelConfig
from c2jax.sampling.forward import serving_apply as apply
from c2jax.sampling.sample import sample_tokens


def take_row(cache: dict, slot: jax.Array, window: Optional[int] = None) -> dict:
    """Row `slot` of a serving cache (every leaf has the slot axis first) as a batch-1 cache,
    limited to the first `window` positions if given."""
    def one(x):
        if x.ndim == 1:
            return jax.lax.dynamic_slice_in_dim(x, slot, 1, 0)
        size = (1, window or x.shape[1]) + x.shape[2:]
        return jax.lax.dynamic_slice(x, (slot,) + (0,) * (x.ndim - 1), size)
    return jax.tree.map(one, cache)


def put_row(cache: dict, row: dict, slot: jax.Array) -> dict:
    """Write a batch-1 cache (possibly a window: fewer positions) back into row `slot`."""
    return jax.tree.map(lambda x, r: jax.lax.dynamic_update_slice(x, r.astype(x.dtype), (slot,) + (0,) * (x.ndim - 1)),
                        cache, row)


def window(cache: dict, w: int) -> dict:
    """The first `w` positions of every row (attention then runs over w, not max_len, slots)."""
    return jax.tree.map(lambda x: x if x.ndim == 1 else x[:, :w], cache)


def unwindow(full: dict, win: dict) -> dict:
    """Write a windowed cache back into the full one (in place under donation)."""
    return jax.tree.map(lambda x, r: r if x.ndim == 1 else jax.lax.dynamic_update_slice_in_dim(x, r, 0, 1),
                        full, win)


def _decode(cfg: ModelConfig, win: int, params: dict, cache: dict, tok: jax.Array, active: jax.Array,
            samp: dict, draw: jax.Array):
    """tok [S] int32 (last token of each slot, fed at position lengths[s]), active [S] bool,
    samp {temperature, top_p [S] f32, top_k [S] int32, seed [S] uint32}, draw [S] int32 ->
    (cache, next [S], logprob_sampling [S], logprob_raw [S], routes [S, n_moe, k] of the fed token)."""
    out = apply(params, tok[:, None], cfg, segment_ids=active.astype(jnp.int32)[:, None], cache=cache, window=win)
    nxt, lp_s, lp_r = sample_tokens(out["logits"][:, 0], samp["temperature"], samp["top_k"],
                                    samp["top_p"], samp["seed"], draw)
    return out["cache"], nxt, lp_s, lp_r, out["routes"][:, 0]


def _prefill(cfg: ModelConfig, win: int, params: dict, cache: dict, slot: jax.Array, tokens: jax.Array,
             start: jax.Array, n_valid: jax.Array, samp: dict, draw: jax.Array):
    """tokens [C] written into row `slot` at positions start .. start+n_valid-1 (rest is padding).
    samp: scalars. Returns (cache, next token, logprob_sampling, logprob_raw, routes [C, n_moe, k])."""
    row = take_row(cache, slot)
    row["lengths"] = jnp.reshape(start, (1,)).astype(jnp.int32)
    c = tokens.shape[0]
    seg = (jnp.arange(c) < n_valid).astype(jnp.int32)[None]
    out = apply(params, tokens[None], cfg, segment_ids=seg, cache=row, window=win)
    logits = jax.lax.dynamic_index_in_dim(out["logits"][0], n_valid - 1, 0, keepdims=True)  # [1, V]
    s1 = {k: jnp.reshape(v, (1,)) for k, v in samp.items()}
    nxt, lp_s, lp_r = sample_tokens(logits, s1["temperature"], s1["top_k"], s1["top_p"], s1["seed"],
                                    jnp.reshape(draw, (1,)))
    cache = put_row(cache, out["cache"], slot)
    return cache, nxt[0], lp_s[0], lp_r[0], out["routes"][0]


def _copy_row(cache: dict, src: jax.Array, dst: jax.Array, length: jax.Array) -> dict:
    """Copy the latents of row `src` to row `dst` and set its length (prefix reuse)."""
    row = take_row(cache, src)
    row["lengths"] = jnp.reshape(length, (1,)).astype(jnp.int32)
    return put_row(cache, row, dst)


@functools.lru_cache(maxsize=32)
def compiled(cfg: ModelConfig) -> Any:
    """The jitted steps for one (static) model config; the cache argument is donated."""
    ns = type("Steps", (), {})()
    ns.decode = jax.jit(functools.partial(_decode, cfg), static_argnums=(0,), donate_argnums=(2,))
    ns.prefill = jax.jit(functools.partial(_prefill, cfg), static_argnums=(0,), donate_argnums=(2,))
    ns.copy_row = jax.jit(_copy_row, donate_argnums=(0,))
    return ns
