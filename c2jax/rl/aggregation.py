"""Loss aggregation: how per-token losses [B, L] become the scalar that is differentiated.

Signature: ``fn(per_token [B, L], mask [B, L], traj_index [B, L], num_traj, *, constant=None) -> scalar``.
`traj_index` maps each token to its trajectory (-1 = padding); a trajectory may span several
segments and rows (self-summarisation chains), and "sequence" below means the whole trajectory.

* ``constant`` (Dr. GRPO, Composer 2): sum over all policy tokens / C with C a constant
  (default: the batch's token capacity B * L, fixed by the static shapes). Every token has the same
  weight whatever its sequence length or batch composition, so the estimator is an unbiased
  (scaled) policy gradient.
* ``token_mean`` (DAPO): sum / (number of policy tokens in the batch). No per-sequence length bias,
  but the normaliser is random (depends on the sampled lengths), so the expectation is a ratio
  estimator, biased at small batch sizes, and a batch of long rollouts gets a smaller step per token.
* ``seq_mean_token_mean`` (original GRPO): mean over sequences of (sum over the sequence / |o_i|).
  Each token of sequence i has weight 1 / |o_i|: for a negative advantage, a long wrong answer is
  penalised less per token than a short wrong one, and for a positive advantage short answers are
  favoured. That is the length bias Dr. GRPO removes (tests/rl/test_rl_objectives.py constructs it).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from c2jax.registry import Registry

AGGREGATIONS: Registry = Registry("rl_loss_aggregation")


def _masked(per_token, mask):
    return jnp.where(mask > 0, per_token, 0.0)


@AGGREGATIONS.register("constant")
def constant_sum(per_token, mask, traj_index, num_traj, *, constant: float | None = None):
    """sum(loss * mask) / C; C = B * L (the static token capacity) when `constant` is None."""
    c = float(per_token.size) if constant is None else float(constant)
    return jnp.sum(_masked(per_token, mask)) / c


@AGGREGATIONS.register("token_mean")
def token_mean(per_token, mask, traj_index, num_traj, *, constant: float | None = None):
    """sum(loss * mask) / sum(mask): mean over every policy token of the batch."""
    return jnp.sum(_masked(per_token, mask)) / jnp.maximum(jnp.sum(mask), 1.0)


@AGGREGATIONS.register("seq_mean_token_mean")
def seq_mean_token_mean(per_token, mask, traj_index, num_traj, *, constant: float | None = None):
    """mean over trajectories with >= 1 policy token of (their token-sum / their token count)."""
    idx = jnp.where(mask > 0, traj_index, -1).reshape(-1)  # [B*L]
    seg_sum = jax.ops.segment_sum(_masked(per_token, mask).reshape(-1), jnp.clip(idx, 0), num_traj)  # [N]
    seg_cnt = jax.ops.segment_sum((idx >= 0).astype(per_token.dtype), jnp.clip(idx, 0), num_traj)  # [N]
    # clip(-1) -> 0 adds zeros (masked value and count are 0), so padding never counts.
    has = seg_cnt > 0
    per_seq = jnp.where(has, seg_sum / jnp.maximum(seg_cnt, 1.0), 0.0)
    return jnp.sum(per_seq) / jnp.maximum(jnp.sum(has), 1)


def aggregate(name: str, per_token, mask, traj_index, num_traj, **kwargs):
    """Look up aggregation `name` in AGGREGATIONS and apply it."""
    return AGGREGATIONS.get(name)(per_token, mask, traj_index, num_traj, **kwargs)
