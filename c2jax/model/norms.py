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


def dense(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """x [..., n] @ kernel [n, *out] -> [..., *out] as one 2-D matmul (XLA CPU runs rank-3 dots
    and their gradients about 2x slower than the same work as a 2-D dot)."""
    n = x.shape[-1]
    out = kernel.shape[1:]
    y = x.reshape(-1, n) @ kernel.astype(x.dtype).reshape(n, -1)
    return y.reshape(x.shape[:-1] + out)


def swiglu_mlp(p: dict, x: jax.Array) -> jax.Array:
    """Dense SwiGLU MLP `down(silu(gate(x)) * up(x))` over a params dict with
    `{gate_proj,up_proj,down_proj}/kernel` (input-major).  x: [..., D] -> [..., D]."""
    dt, shape = x.dtype, x.shape
    x2 = x.reshape(-1, shape[-1])  # 2-D matmuls: XLA CPU runs rank-3 dots and their grads ~2x slower
    g = x2 @ p["gate_proj"]["kernel"].astype(dt)  # [N, F]
    u = x2 @ p["up_proj"]["kernel"].astype(dt)  # [N, F]
    y = (jax.nn.silu(g) * u) @ p["down_proj"]["kernel"].astype(dt)  # [N, D]
    return y.reshape(shape[:-1] + (y.shape[-1],))
