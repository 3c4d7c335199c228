"""A dropless MoE implementation for small token counts (decode): every expert on every token.

At decode a step carries a few tokens per slot; with ``tokens * top_k >= n_routed_experts`` every
expert's weights are read anyway, so computing all experts on all tokens costs the same memory
traffic as a grouped matmul and avoids the sort/scatter and `ragged_dot`'s CPU lowering. It is
exact (no token is dropped):

    y_n = sum_j w[n, j] * expert_{idx[n, j]}(x_n)
        = (comb[n, e] * act[n, e, f]).reshape(N, E*F) @ down.reshape(E*F, D)

with ``comb[n, e]`` the gate weight of expert e for token n (0 if not chosen) and
``act = silu(x @ gate_e) * (x @ up_e)``. For speed the gate and up projections of all experts
are ONE matmul against a serving layout ``gate_up [D, E*2*F]`` prepared once per weight version
by `fuse_experts` (called from `c2jax.sampling.forward.serving_params`) (a batched [E, N, D] einsum with tiny N runs at a tenth of the matmul rate on
CPU); the down projection is one matmul with contraction E*F. With very few tokens per step
(``slots * top_k <= E / 2``, e.g. batch 1) the engine uses the 'split' layout instead
(``gate_up_e [E, D, 2F]``) and each expert runs under `lax.cond` only if some token chose it, so
a step reads only the chosen experts' weights. Without the serving layout (or for
the low-precision recipes, which go through `kernels_pallas`) it falls back to the model's
`batched_expert_matmul`, so ``moe.precision`` is honoured exactly as elsewhere.

Registered in the model's `MOE_IMPLS` (by `moe_impls`) as ``'sampler_dense'``; the sampling
engine uses it when ``EngineConfig.moe_impl == 'auto'`` and the experts are few.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from c2jax.model.expert_matmul import batched_expert_matmul

if TYPE_CHECKING:
    from c2jax.model.config import ModelConfig, MoEConfig

NAME = "sampler_dense"
_FAST_PRECISIONS = ("f32", "bf16")


def _mm(a: jax.Array, b: jax.Array, precision: str, out_dtype) -> jax.Array:
    if precision == "bf16":
        return jnp.matmul(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16),
                          preferred_element_type=jnp.float32).astype(out_dtype)
    return jnp.matmul(a, b.astype(a.dtype))


def dense_all_experts_moe(p: dict, x: jax.Array, idx: jax.Array, w: jax.Array, m: MoEConfig):
    """x [N, D], idx/w [N, k] -> (y [N, D], dropped=0)."""
    e = m.n_routed_experts
    n, d = x.shape
    comb = jnp.zeros((n, e), jnp.float32).at[jnp.arange(n)[:, None], idx].add(w)  # [N, E]
    if "gate_up_e" in p and m.precision in _FAST_PRECISIONS:
        # per expert, skipped (lax.cond) when no token chose it: reads only the hit experts
        hit = (idx[:, :, None] == jnp.arange(e)[None, None, :]).any((0, 1))  # [E]
        f = p["down_proj"].shape[1]
        y = jnp.zeros((n, d), x.dtype)
        for ei in range(e):
            def run(y, ei=ei):
                h = _mm(x, p["gate_up_e"][ei], m.precision, x.dtype)  # [N, 2F]
                act = jax.nn.silu(h[:, :f]) * h[:, f:] * comb[:, ei:ei + 1].astype(x.dtype)
                return y + _mm(act, p["down_proj"][ei], m.precision, x.dtype)
            y = jax.lax.cond(hit[ei], run, lambda y: y, y)
        return y, jnp.zeros((), jnp.float32)
    if "gate_up" in p and m.precision in _FAST_PRECISIONS:
        f = p["down_proj"].shape[1]
        h = _mm(x, p["gate_up"], m.precision, x.dtype).reshape(n, e, 2, f)  # [N, E, 2, F]
        act = jax.nn.silu(h[:, :, 0]) * h[:, :, 1] * comb[:, :, None].astype(x.dtype)  # [N, E, F]
        y = _mm(act.reshape(n, e * f), p["down_proj"].reshape(e * f, d), m.precision, x.dtype)
        return y, jnp.zeros((), jnp.float32)
    xb = jnp.broadcast_to(x[None], (e,) + x.shape)  # [E, N, D]
    g = batched_expert_matmul(xb, p["gate_proj"], m.precision)  # [E, N, F]
    u = batched_expert_matmul(xb, p["up_proj"], m.precision)
    out = batched_expert_matmul(jax.nn.silu(g) * u, p["down_proj"], m.precision)  # [E, N, D]
    y = jnp.einsum("end,ne->nd", out, comb.astype(out.dtype))
    return y, jnp.zeros((), jnp.float32)


def fuse_experts(experts: dict) -> dict:
    """One layer's routed experts {gate,up}_proj [E, D, F], down_proj [E, F, D] -> the serving
    layout {gate_up [D, E*2*F] (per expert: gate columns, then up), down_proj}."""
    g, u = experts["gate_proj"], experts["up_proj"]
    E, D, F = g.shape
    gu = jnp.transpose(jnp.stack([g, u], axis=1), (2, 0, 1, 3)).reshape(D, E * 2 * F)
    return {"gate_up": gu, "down_proj": experts["down_proj"]}


def split_experts(experts: dict) -> dict:
    """Serving layout for the skip-unused-experts path: {gate_up_e [E, D, 2F], down_proj}."""
    return {"gate_up_e": jnp.concatenate([experts["gate_proj"], experts["up_proj"]], axis=-1),
            "down_proj": experts["down_proj"]}


def can_fuse(cfg: ModelConfig) -> bool:
    """The fused layout serves the XLA precisions; low-precision recipes keep the model layout."""
    return cfg.moe.precision in _FAST_PRECISIONS
