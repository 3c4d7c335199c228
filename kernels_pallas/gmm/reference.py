"""Grouped-matmul oracles: `jax.lax.ragged_dot` (forward/dgrad shape) and a masked einsum (wgrad
shape) on f32 (dequantised) operands at HIGHEST precision."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels_pallas.gmm.groups import group_bounds


def gmm_ref(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """out[m] = lhs[m] @ rhs[group(m)]; lhs (M, K), rhs (G, K, N) -> (M, N) f32."""
    return jax.lax.ragged_dot(lhs.astype(jnp.float32), rhs.astype(jnp.float32),
                              group_sizes.astype(jnp.int32), precision=jax.lax.Precision.HIGHEST,
                              preferred_element_type=jnp.float32)


def tgmm_ref(lhs: jax.Array, dy: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """out[g] = lhs[rows of g]^T @ dy[rows of g]; lhs (M, K), dy (M, N) -> (G, K, N) f32."""
    starts, ends = group_bounds(group_sizes)
    r = jnp.arange(lhs.shape[0])
    onehot = ((r[:, None] >= starts[None]) & (r[:, None] < ends[None])).astype(jnp.float32)
    return jnp.einsum("mg,mk,mn->gkn", onehot, lhs.astype(jnp.float32), dy.astype(jnp.float32),
                      precision=jax.lax.Precision.HIGHEST)
