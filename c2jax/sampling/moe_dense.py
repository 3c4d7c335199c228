"""A dropless MoE implementation for small token counts (decode): every expert on every token.

At decode a step carries B tokens (B = slots, 1 with speculative drafts doubled); with
``B * top_k >= n_routed_experts`` every expert's weights are read anyway, so computing all experts
on all B tokens as one batched einsum costs the same memory traffic as a grouped matmul and avoids
the sort/scatter and `ragged_dot`'s CPU lowering (which costs as much as all experts, plus
overhead). It is exact (no token is dropped): ``y_n = sum_j w[n, j] * expert_{idx[n, j]}(x_n)``,
only the unselected products are computed and discarded. Expert matmuls go through the model's
`batched_expert_matmul`, so ``moe.precision`` (f32 / bf16 / low-precision recipes through
`kernels_pallas`) is honoured exactly as in the other implementations.

Registered in the model's `MOE_IMPLS` as ``'sampler_dense'``; the engine switches to it for
decode/prefill when ``EngineConfig.moe_impl == 'auto'`` and the experts are few (see engine.py).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from c2jax.model.config import MoEConfig
from c2jax.model.moe_impls import MOE_IMPLS, batched_expert_matmul

NAME = "sampler_dense"


def dense_all_experts_moe(p: dict, x: jax.Array, idx: jax.Array, w: jax.Array, m: MoEConfig):
    """x [N, D], idx/w [N, k] -> (y [N, D], dropped=0)."""
    e = m.n_routed_experts
    xb = jnp.broadcast_to(x[None], (e,) + x.shape)  # [E, N, D]
    g = batched_expert_matmul(xb, p["gate_proj"], m.precision)  # [E, N, F]
    u = batched_expert_matmul(xb, p["up_proj"], m.precision)
    out = batched_expert_matmul(jax.nn.silu(g) * u, p["down_proj"], m.precision)  # [E, N, D]
    # combine weights per (expert, token): sum of w over the slots choosing that expert
    comb = jnp.zeros((x.shape[0], e), jnp.float32).at[jnp.arange(x.shape[0])[:, None], idx].add(w)
    y = jnp.einsum("end,ne->nd", out, comb.astype(out.dtype))
    return y, jnp.zeros((), jnp.float32)


if NAME not in MOE_IMPLS:
    MOE_IMPLS.register(NAME, dense_all_experts_moe)
