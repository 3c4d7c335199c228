"""Decoupled rotary position embedding for MLA, with YaRN scaling exactly as `transformers`
DeepSeek-V3 computes it.

Only the `qk_rope_head_dim` slice of each query head and the single shared `k_rope` vector are
rotated (decoupled RoPE). Two layouts:

* ``rope_interleave=True`` (DeepSeek checkpoints, HF default): rotation pairs are adjacent
  dimensions ``(x0, x1), (x2, x3), ...``. Like HF `apply_rotary_pos_emb_interleave`, the output is
  written de-interleaved ``[rotated evens, rotated odds]``; queries and keys get the same
  permutation, so dot products are unchanged (and the latent cache stores keys in this layout).
* ``rope_interleave=False``: rotate-half layout, pairs ``(x_i, x_{i + r/2})``.

YaRN (`rope_scaling.type == 'yarn'`) changes three things, all reproduced here:
1. the inverse frequencies: a linear ramp between interpolated (`/factor`) and original
   frequencies over the dimensions between the `beta_fast` / `beta_slow` correction range;
2. cos/sin are multiplied by ``attention_factor = m(factor, mscale) / m(factor, mscale_all_dim)``
   (or ``m(factor, 1)`` when either mscale is 0/unset), with ``m(s, a) = 0.1 a ln s + 1`` (s > 1);
3. the softmax scale becomes ``qk_head_dim**-0.5 * m(factor, mscale_all_dim)**2`` when
   ``mscale_all_dim`` is non-zero (HF `yarn_apply_mscale`).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from c2jax.model.config import AttentionConfig


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def rope_frequencies(att: AttentionConfig) -> tuple[np.ndarray, float]:
    """Inverse frequencies [qk_rope_head_dim // 2] (float32) and the cos/sin multiplier."""
    dim, base = att.qk_rope_head_dim, float(att.rope_theta)
    pos_freqs = np.power(np.float32(base), np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
    inv_extra = (1.0 / pos_freqs).astype(np.float32)
    rs = att.rope_scaling
    if rs is None:
        return inv_extra, 1.0
    factor = float(rs.factor)
    if rs.mscale and rs.mscale_all_dim:
        attention_factor = float(_yarn_mscale(factor, rs.mscale) / _yarn_mscale(factor, rs.mscale_all_dim))
    else:
        attention_factor = _yarn_mscale(factor)
    beta_fast = rs.beta_fast or 32
    beta_slow = rs.beta_slow or 1
    omp = rs.original_max_position_embeddings

    def corr_dim(num_rot: float) -> float:
        return (dim * math.log(omp / (num_rot * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(corr_dim(beta_fast)), 0)
    high = min(math.ceil(corr_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1).astype(np.float32)
    extra_factor = (1 - ramp).astype(np.float32)
    inv_inter = (1.0 / (np.float32(factor) * pos_freqs)).astype(np.float32)
    inv = inv_inter * (1 - extra_factor) + inv_extra * extra_factor
    return inv.astype(np.float32), attention_factor


def softmax_scale(att: AttentionConfig) -> float:
    """Attention logit scale: qk_head_dim**-0.5, times YaRN's mscale(factor, mscale_all_dim)**2."""
    scale = att.qk_head_dim ** -0.5
    rs = att.rope_scaling
    if rs is not None and rs.mscale_all_dim:
        m = _yarn_mscale(rs.factor, rs.mscale_all_dim)
        scale = scale * m * m
    return scale


def rope_cos_sin(att: AttentionConfig, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos, sin tables for integer `positions` [B, S] -> two float32 [B, S, r/2] (already
    multiplied by the YaRN attention factor)."""
    inv_freq, attn_factor = rope_frequencies(att)
    ang = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [B, S, r/2]
    return jnp.cos(ang) * attn_factor, jnp.sin(ang) * attn_factor


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array, interleave: bool) -> jax.Array:
    """Rotate x [B, S, H, r] (or [B, S, r] with cos/sin [B, S, r/2]) by cos/sin [B, S, r/2].

    Output layout is ``[rot(first of pairs), rot(second of pairs)]`` for both layouts (HF)."""
    if x.ndim == cos.ndim + 1:  # a heads axis: broadcast tables over it
        cos, sin = cos[..., None, :], sin[..., None, :]
    half = x.shape[-1] // 2
    if interleave:
        x1, x2 = x[..., 0::2], x[..., 1::2]
    else:
        x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos.astype(x.dtype), sin.astype(x.dtype)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
