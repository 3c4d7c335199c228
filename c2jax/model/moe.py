"""The MoE feed-forward block: router + routed experts (implementation by name) + shared experts.

MoE settings (``config.model.moe``):
* ``impl``: 'dropless' (sort + ragged_dot; exact, the reference; use it for decode and parity),
  'capacity' (fixed capacity factor, batched einsum; fastest on CPU for training; drops overflow
  and reports the dropped fraction), 'pallas' (grouped matmul kernels from `kernels_pallas`).
* ``precision``: expert-matmul arithmetic, 'f32' | 'bf16' in XLA, or a low-precision recipe
  ('fp8_blockwise', 'mxfp8', 'nvfp4_fwd_mxfp8_bwd') through `kernels_pallas` (see moe_impls).
* routing: ``n_routed_experts``, ``top_k``, ``n_group``/``topk_group``, ``norm_topk_prob``,
  ``routed_scaling_factor``; router bias = selection-only, updated by `update_router_bias` with
  ``bias_update_rate``; ``seq_aux_loss_coef`` > 0 adds the sequence-wise balance loss;
  ``replay_margin`` controls the plausibility check of router replay.
"""
from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp

from c2jax.model.config import ModelConfig
from c2jax.model.moe_impls import MOE_IMPLS
from c2jax.model.moe_router import (expert_counts, replay_routes, route, router_scores,
                                    sequence_balance_loss)
from c2jax.model.norms import swiglu_mlp


def moe_block(p: dict, x: jax.Array, cfg: ModelConfig, valid: jax.Array,
              routes: Optional[jax.Array] = None, experts_fn: Optional[Callable] = None
              ) -> tuple[jax.Array, dict]:
    """x [B, S, D] (already normed), valid [B, S] bool, routes [B, S, k] or None ->
    (y [B, S, D], stats) with stats: scores [B,S,E] f32, routes [B,S,k] int32, counts [E] int32,
    dropped (fraction of assignments not computed), balance_loss (un-weighted), replaced (fraction
    of replayed routes replaced by the plausibility check). `experts_fn` (signature of the
    `MOE_IMPLS` entries) overrides ``moe.impl``, e.g. with the expert-parallel dispatch of
    `c2jax.model.parallel.ep_moe`."""
    m = cfg.moe
    b, s, d = x.shape
    xf = x.reshape(b * s, d)
    scores = router_scores(p["router"], xf)  # [N, E] f32
    bias = p["router"]["bias"]
    if routes is None:
        idx, w = route(scores, bias, m)
        replaced = jnp.zeros((), jnp.float32)
    else:
        idx, w, rep = replay_routes(scores, bias, routes.reshape(b * s, -1), m)
        replaced = rep.astype(jnp.float32).mean()
    y, dropped = (experts_fn or MOE_IMPLS.get(m.impl))(p["experts"], xf, idx, w, m)
    y = y.reshape(b, s, d)
    if "shared" in p:
        y = y + swiglu_mlp(p["shared"], x)
    scores = scores.reshape(b, s, -1)
    idx = idx.reshape(b, s, -1)
    stats = {
        "scores": scores,
        "routes": idx,
        "counts": expert_counts(idx.reshape(b * s, -1), valid.reshape(-1), m.n_routed_experts),
        "dropped": dropped,
        "replaced": replaced,
        "balance_loss": (sequence_balance_loss(scores, idx, valid, m) if m.seq_aux_loss_coef > 0
                         else jnp.zeros((), jnp.float32)),
    }
    return y, stats
