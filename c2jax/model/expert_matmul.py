"""Expert matmuls, the one place they are dispatched on ``moe.precision``.

`expert_matmul` runs groups of rows sorted by expert (ragged), `batched_expert_matmul` equal-size
groups; f32/bf16 run in XLA, every low-precision recipe through `kernels_pallas.api.grouped_matmul`
(imported lazily). Used by every MoE implementation (`moe_impls`, `moe_dense`, `parallel.ep_moe`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

XLA_PRECISIONS = ("f32", "bf16")


def _kernels_grouped_matmul():
    try:
        from kernels_pallas.api import grouped_matmul  # type: ignore
    except ImportError as e:  # pragma: no cover - depends on the kernels package being present
        raise NotImplementedError(
            "this MoE setting needs kernels_pallas.api.grouped_matmul (impl='pallas' or a "
            f"low-precision moe.precision), which could not be imported: {e}") from e
    return grouped_matmul


def expert_matmul(x: jax.Array, w: jax.Array, group_sizes: jax.Array, precision: str,
                  use_kernels: bool = False) -> jax.Array:
    """Grouped matmul: rows of x [M, K] sorted by expert (group_sizes [E], sum <= M) times
    w [E, K, F] -> [M, F] in x.dtype. The one place expert matmuls are dispatched on precision."""
    if use_kernels or precision not in XLA_PRECISIONS:
        return _kernels_grouped_matmul()(x, w, group_sizes, precision=precision).astype(x.dtype)
    if precision == "bf16":
        return jax.lax.ragged_dot(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), group_sizes,
                                  preferred_element_type=jnp.float32).astype(x.dtype)
    return jax.lax.ragged_dot(x, w.astype(x.dtype), group_sizes)


def batched_expert_matmul(x: jax.Array, w: jax.Array, precision: str) -> jax.Array:
    """Equal-size groups: x [E, C, K] times w [E, K, F] -> [E, C, F] in x.dtype."""
    if precision not in XLA_PRECISIONS:
        e, c, k = x.shape
        sizes = jnp.full((e,), c, jnp.int32)
        return expert_matmul(x.reshape(e * c, k), w, sizes, precision).reshape(e, c, -1)
    if precision == "bf16":
        return jnp.einsum("eck,ekf->ecf", x.astype(jnp.bfloat16), w.astype(jnp.bfloat16),
                          preferred_element_type=jnp.float32).astype(x.dtype)
    return jnp.einsum("eck,ekf->ecf", x, w.astype(x.dtype))
