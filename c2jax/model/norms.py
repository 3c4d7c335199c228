"""RMSNorm and the SwiGLU MLP: the two small building blocks shared by every layer kind."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """RMSNorm as in DeepSeek-V3 / HF `DeepseekV3RMSNorm`: statistics in float32, then
    `scale * normed.astype(x.dtype)`.  x: [..., n], scale: [n] -> [..., n] (x.dtype)."""
    xf = x.astype(jnp.float32)
    var = jnp.mean(jnp.square(xf), axis=-1, keepdims=True)
    normed = (xf * jax.lax.rsqrt(var + eps)).astype(x.dtype)
    return scale.astype(x.dtype) * normed


def swiglu_mlp(p: dict, x: jax.Array) -> jax.Array:
    """Dense SwiGLU MLP `down(silu(gate(x)) * up(x))` over a params dict with
    `{gate_proj,up_proj,down_proj}/kernel` (input-major).  x: [..., D] -> [..., D]."""
    dt = x.dtype
    g = x @ p["gate_proj"]["kernel"].astype(dt)  # [..., F]
    u = x @ p["up_proj"]["kernel"].astype(dt)  # [..., F]
    return (jax.nn.silu(g) * u) @ p["down_proj"]["kernel"].astype(dt)  # [..., D]
