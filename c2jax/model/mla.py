"""Multi-head latent attention (MLA, DeepSeek-V2/V3) over the ``attn`` params of params_spec.

Per token the layer computes
    q        = q_b(RMSNorm(q_a(x)))           or q_proj(x) when q_lora_rank is None  [H, nope + rope]
    c_kv     = RMSNorm(kv_a(x)[:kv_lora])     the compressed latent                  [kv_lora]
    k_rope   = RoPE(kv_a(x)[kv_lora:])        one rotary key shared by all heads      [rope]
    k_nope_h, v_h = kv_b(c_kv)                per-head keys/values                   [H, nope], [H, v]
and attends with score_h = (q_nope_h . k_nope_h + q_rope_h . k_rope) * softmax_scale.

Only (c_kv, k_rope) are cached. Two equivalent ways to attend over a latent cache:
* expanded: materialise k_nope/v for every cached position (cheap for long query blocks:
  training and prefill);
* absorbed (decode): fold kv_b into the query (q_lat_h = W_kb_h q_nope_h) and into the output
  (o_h = W_vb_h^T (p_h . c_kv)), so a step costs O(T * H * kv_lora) and nothing per-head is
  materialised over the cache.
"""
from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp

from c2jax.model.attention_recompute import BACKWARDS, NEG_LOGIT, attend_heads_recompute, causal_blocks
from c2jax.model.config import ModelConfig
from c2jax.model.norms import dense, rms_norm
from c2jax.model.rope import apply_rope, softmax_scale

CAUSAL_BLOCK = 128  # query block of causal block-skipping in self-attention without a cache
SPLIT_ROPE_SCORES = False  # True: score = q_nope.k_nope + q_rope.k_rope as two matmuls, no per-head k_rope copy
# None: all of the batch at once. An int c dividing the batch: attend c rows at a time (lax.map), so a
# chunk's [c, H, S, T] scores and probabilities (f32) can stay in cache between the matmul, the mask,
# the softmax and the value matmul instead of streaming the whole batch's through memory each time.
ATTN_BATCH_CHUNK: Optional[int] = None
# Decode's absorbed value product prob [B,H,S,T] x c_kv [B,T,C]: "bhsc" asks XLA for [B,H,S,C] and
# transposes after (a plain per-row matmul on XLA:CPU's fast path); "bshc" asks for [B,S,H,C]
# directly, which XLA:CPU ran as a transposed product off that path (the form until 2026-12-07,
# kept as the baseline of `python benchmarks/engine_steps.py --variants absorbed-out=bshc`).
ABSORBED_OUT = "bhsc"
# Backward of the cache-free attention (training, the RL learner; the cache paths that sample are
# not affected): "autodiff" differentiates `_attend_heads` (keeps every block's probabilities for the
# backward); "recompute" uses `attention_recompute.attend_heads_recompute` (same forward; the backward
# recomputes the transposed probabilities from saved row statistics). The rotary-split and
# batch-chunk paths stay on autodiff.
ATTN_BACKWARD = "recompute"  # the default since 2026-12-07 (README, "Performance figures")
# The recompute path's heads in this many independent groups (1: all heads in one call). XLA:CPU runs
# one batched attention product on one thread (measured: the same time on 1 core as on 2), but it runs
# independent chains of work side by side, so groups of heads let both cores share attention.
ATTN_HEAD_GROUPS = 1


def queries(p: dict, x: jax.Array, cfg: ModelConfig) -> jax.Array:
    """x [B, S, D] -> q [B, S, H, qk_head] (before RoPE)."""
    dt = x.dtype
    if cfg.attention.q_lora_rank is None:
        return dense(x, p["q_proj"]["kernel"])
    qa = rms_norm(dense(x, p["q_a_proj"]["kernel"]), p["q_a_norm"]["scale"], cfg.rms_norm_eps)
    return dense(qa, p["q_b_proj"]["kernel"])


def latents(p: dict, x: jax.Array, cos: jax.Array, sin: jax.Array, cfg: ModelConfig
            ) -> tuple[jax.Array, jax.Array]:
    """x [B, S, D] -> (c_kv [B, S, kv_lora] normed, k_rope [B, S, rope] rotated): what is cached."""
    a = cfg.attention
    kv = dense(x, p["kv_a_proj"]["kernel"])  # [B, S, kv_lora + rope]
    c_kv = rms_norm(kv[..., : a.kv_lora_rank], p["kv_a_norm"]["scale"], cfg.rms_norm_eps)
    k_rope = apply_rope(kv[..., a.kv_lora_rank:], cos, sin, a.rope_interleave)
    return c_kv, k_rope


def _softmax(scores: jax.Array, mask: jax.Array) -> jax.Array:
    """scores [B, H, S, T] f32, mask [B, S, T] bool -> probabilities (f32)."""
    scores = jnp.where(mask[:, None], scores, NEG_LOGIT)
    return jax.nn.softmax(scores, axis=-1)


def attend_expanded(p: dict, q_nope: jax.Array, q_rope: jax.Array, c_kv: jax.Array, k_rope: jax.Array,
                    mask: jax.Array, cfg: ModelConfig, causal_blocks: int = 1, backward: str = "autodiff"
                    ) -> jax.Array:
    """Attention with per-head keys/values expanded from the latents.

    q_nope [B,S,H,nope], q_rope [B,S,H,rope], c_kv [B,T,kv_lora], k_rope [B,T,rope], mask [B,S,T]
    -> per-head outputs [B, S, H, v]. With ``causal_blocks = n > 1`` (self-attention without a
    cache: T == S and the mask is causal) the queries are split into n blocks and block i only
    scores the keys up to its own end: (n + 1) / (2n) of the square, the same result.
    ``backward="recompute"`` differentiates through `attention_recompute.attend_heads_recompute`
    (see ATTN_BACKWARD); the cache paths (prefill, decode) keep the default, so sampling is unchanged."""
    if backward not in BACKWARDS:
        raise ValueError(f"attention backward {backward!r} is not one of {BACKWARDS}")
    a, dt = cfg.attention, q_nope.dtype
    h = q_nope.shape[2]
    kv = dense(c_kv, p["kv_b_proj"]["kernel"])  # [B,T,H,nope+v]
    k_nope, v = kv[..., : a.qk_nope_head_dim], kv[..., a.qk_nope_head_dim:]
    scale = softmax_scale(a)
    if SPLIT_ROPE_SCORES:
        # the shared rotary key scores all heads at once: [B, H*S, rope] x [B, T, rope]
        q, k, v = (t.transpose(0, 2, 1, 3) for t in (q_nope, k_nope, v))  # heads-major: [B,H,S|T,*]
        qr = q_rope.transpose(0, 2, 1, 3)  # [B,H,S,rope]
    else:
        # one score matmul over [nope | rope] (k_rope is shared by all heads)
        q = jnp.concatenate([q_nope, q_rope], axis=-1)  # [B,S,H,qk]
        k = jnp.concatenate([k_nope, jnp.broadcast_to(k_rope[:, :, None], k_rope.shape[:2] + (h, k_rope.shape[-1]))],
                            axis=-1)  # [B,T,H,qk]
        q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))  # heads-major: [B,H,S|T,*]
    s_len = q.shape[2]
    n = causal_blocks if causal_blocks > 1 and s_len % causal_blocks == 0 else 1
    qr_kr = (qr, k_rope) if SPLIT_ROPE_SCORES else None
    chunk = ATTN_BATCH_CHUNK
    b = q.shape[0]
    if backward == "recompute" and qr_kr is None and (chunk is None or chunk >= b or b % chunk):
        groups = ATTN_HEAD_GROUPS if ATTN_HEAD_GROUPS > 1 and h % ATTN_HEAD_GROUPS == 0 else 1
        if groups == 1:
            o = attend_heads_recompute(q, k, v, mask, n, scale, dt)
        else:
            parts = zip(*(jnp.split(t, groups, axis=1) for t in (q, k, v)))  # each [B, H/groups, S|T, *]
            o = jnp.concatenate([attend_heads_recompute(qg, kg, vg, mask, n, scale, dt) for qg, kg, vg in parts],
                                axis=1)  # [B,H,S,v]
    elif chunk is None or chunk >= b or b % chunk:
        o = _attend_heads(q, k, v, mask, qr_kr, n, scale, dt)
    else:
        # batch chunks one after another: each chunk's scores stay cache-sized (see ATTN_BATCH_CHUNK)
        mask = jnp.broadcast_to(mask, (b,) + mask.shape[1:])
        split = lambda t: t.reshape((b // chunk, chunk) + t.shape[1:])  # [B, ...] -> [B/c, c, ...]
        xs = (split(q), split(k), split(v), split(mask), None if qr_kr is None else tuple(map(split, qr_kr)))
        o = jax.lax.map(lambda a: _attend_heads(*a[:4], a[4], n, scale, dt), xs)
        o = o.reshape((b,) + o.shape[2:])
    return o.transpose(0, 2, 1, 3)  # [B,S,H,v]


def _attend_heads(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                  qr_kr: Optional[tuple[jax.Array, jax.Array]], n: int, scale: float, dt) -> jax.Array:
    """Heads-major q [B,H,S,qk], k [B,H,T,qk], v [B,H,T,v], mask [B,S,T] -> o [B,H,S,v], with the
    queries in n causal blocks (block i scores keys up to its own end). ``qr_kr`` = (q_rope
    [B,H,S,rope], k_rope [B,T,rope]) adds the rotary scores as a second matmul (SPLIT_ROPE_SCORES)."""
    outs = []
    for rows, hi in causal_blocks(n, q.shape[2], k.shape[2]):
        s = jnp.einsum("bhsk,bhtk->bhst", q[:, :, rows], k[:, :, :hi],
                       preferred_element_type=jnp.float32)  # [B,H,blk,hi]
        if qr_kr is not None:
            qr, kr = qr_kr
            s = s + jnp.einsum("bhsr,btr->bhst", qr[:, :, rows], kr[:, :hi],
                               preferred_element_type=jnp.float32)  # [B,H,blk,hi]
        prob = _softmax(s * scale, mask[:, rows, :hi]).astype(dt)
        outs.append(jnp.einsum("bhst,bhtv->bhsv", prob, v[:, :, :hi]))
    return outs[0] if n == 1 else jnp.concatenate(outs, axis=2)


def attend_absorbed(p: dict, q_nope: jax.Array, q_rope: jax.Array, c_kv: jax.Array, k_rope: jax.Array,
                    mask: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Same result as `attend_expanded`, with kv_b absorbed into query and output (decode)."""
    a, dt = cfg.attention, q_nope.dtype
    w = p["kv_b_proj"]["kernel"].astype(dt)  # [kv_lora, H, nope + v]
    w_k, w_v = w[..., : a.qk_nope_head_dim], w[..., a.qk_nope_head_dim:]
    q_lat = jnp.einsum("bshk,chk->bshc", q_nope, w_k)  # [B,S,H,kv_lora]
    s = jnp.einsum("bshc,btc->bhst", q_lat, c_kv, preferred_element_type=jnp.float32)
    s = s + jnp.einsum("bshr,btr->bhst", q_rope, k_rope, preferred_element_type=jnp.float32)
    prob = _softmax(s * softmax_scale(a), mask).astype(dt)
    if ABSORBED_OUT == "bshc":
        o_lat = jnp.einsum("bhst,btc->bshc", prob, c_kv)  # [B,S,H,kv_lora]
    else:  # [B,H,S,kv_lora] -> [B,S,H,kv_lora]; see ABSORBED_OUT
        o_lat = jnp.einsum("bhst,btc->bhsc", prob, c_kv).transpose(0, 2, 1, 3)
    return jnp.einsum("bshc,chv->bshv", o_lat, w_v)


def mla(p: dict, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array, cfg: ModelConfig,
        layer_cache: Optional[dict] = None, slots: Optional[jax.Array] = None,
        attend_fn: Optional[Callable] = None) -> tuple[jax.Array, Optional[dict]]:
    """One MLA layer. x [B, S, D]; cos/sin [B, S, rope/2]; mask [B, S, T] (T = S without a cache,
    the cache length with one). With `layer_cache` ({c_kv [B,T,kv_lora], k_rope [B,T,rope]}) the new
    latents are written at `slots` [B, S] (out-of-range slots are dropped) and attention runs over
    the whole cache: absorbed form when S == 1, expanded otherwise. Returns (out [B,S,D], cache).

    `attend_fn` (cache-free path only; default `attend_expanded`) swaps in another attention with
    the same signature, e.g. the context-parallel one of `c2jax.model.parallel.cp_attention`, which
    all-gathers the latents (c_kv, k_rope) rather than up-projected keys/values."""
    a = cfg.attention
    q = queries(p, x, cfg)
    q_nope = q[..., : a.qk_nope_head_dim]
    q_rope = apply_rope(q[..., a.qk_nope_head_dim:], cos, sin, a.rope_interleave)
    c_kv, k_rope = latents(p, x, cos, sin, cfg)
    new_cache = None
    if layer_cache is not None:
        b = jnp.arange(x.shape[0])[:, None]
        c_all = layer_cache["c_kv"].at[b, slots].set(c_kv.astype(layer_cache["c_kv"].dtype), mode="drop")
        r_all = layer_cache["k_rope"].at[b, slots].set(k_rope.astype(layer_cache["k_rope"].dtype), mode="drop")
        new_cache = {"c_kv": c_all, "k_rope": r_all}
        c_kv, k_rope = c_all.astype(x.dtype), r_all.astype(x.dtype)
        attend = attend_absorbed if x.shape[1] == 1 else attend_expanded
        o = attend(p, q_nope, q_rope, c_kv, k_rope, mask, cfg)  # [B,S,H,v]
    elif attend_fn is not None:
        o = attend_fn(p, q_nope, q_rope, c_kv, k_rope, mask, cfg)
    else:
        s_len = x.shape[1]
        blocks = s_len // CAUSAL_BLOCK if s_len % CAUSAL_BLOCK == 0 and s_len >= 2 * CAUSAL_BLOCK else 1
        o = attend_expanded(p, q_nope, q_rope, c_kv, k_rope, mask, cfg, causal_blocks=blocks, backward=ATTN_BACKWARD)
    b, s = o.shape[:2]
    out = dense(o.reshape(b, s, -1), p["o_proj"]["kernel"].reshape(-1, x.shape[-1]))  # [B, S, D]
    return out, new_cache
