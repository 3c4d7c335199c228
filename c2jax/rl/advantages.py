"""Group-relative advantages: A_i = R_i - baseline(group of i), optionally / std, times a constant.

Composer 2 samples a fixed number G of rollouts per prompt and, following Dr. GRPO, uses the raw
centred reward: no division by the group standard deviation (report 3.3). Two baselines:

* ``grpo``: b_i = mean_j R_j over the group *including* i. E[sum_i A_i grad log pi(o_i)]
  = (G - 1) grad J: unbiased up to the constant (G - 1) / G per sample.
* ``rloo``: b_i = mean_{j != i} R_j (leave-one-out). A_rloo = G / (G - 1) * A_grpo, and
  E[sum_i A_i grad log pi(o_i)] = G grad J: the baseline is independent of o_i, so each
  sample's term is unbiased.

``std_normalize=True`` divides by the group's sample std (+ eps). Off by default: when all rollouts
in a group are (nearly) equally good the std is tiny and the division blows small behavioural
differences up to unit-size advantages (tests/rl/test_rl_advantages.py shows the scale blow-up),
and it reweights prompts by 1 / std, which biases the gradient towards too-easy and too-hard prompts.

``k`` > 1 (``grpo`` only) first replaces each reward by its max-of-k transform (max_at_k.py): the
mean of max(r_S) over the k-subsets of the group containing the sample, which trains best-of-k
(pass@k) instead of the mean reward (Walder & Karkhanis 2025 PKPO; Chen et al. 2025). k = 1 is
plain GRPO.

Masking (every case reported in the metrics, never a NaN):
* `valid` = 0 (N-axis padding, infrastructure failures): excluded from the baseline, advantage 0.
* non-finite reward: treated as invalid, counted in ``adv/nonfinite_rewards``.
* a group with fewer than 2 valid samples has no baseline: advantages 0, counted in
  ``adv/small_groups``. (A *configured* group size of 1 is rejected by the `rl` config validator.)
Groups are identified by `group_index` in [0, N) (-1 = none), so N bounds the number of groups and
everything is static-shaped for jit (segment sums, O(N)).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from c2jax.rl.max_at_k import max_at_k_rewards
from c2jax.registry import Registry

ADVANTAGES: Registry = Registry("rl_advantage")


class _Groups(NamedTuple):
    ok: jax.Array       # [N] bool: sample counts (valid, finite reward, has a group)
    r: jax.Array        # [N] reward, 0 where not ok
    gi: jax.Array       # [N] group index clipped into [0, N)
    count_g: jax.Array  # [N] ok samples per group (the N axis bounds the number of groups)
    sum_g: jax.Array    # [N] reward sum per group
    count_i: jax.Array  # [N] count_g of each sample's group
    sum_i: jax.Array    # [N] sum_g of each sample's group


def _groups(rewards: jax.Array, group_index: jax.Array, valid: jax.Array) -> _Groups:
    """Masked per-group counts and sums with segment sums: O(N), static shapes."""
    n = rewards.shape[0]
    ok = (valid > 0) & jnp.isfinite(rewards) & (group_index >= 0)  # [N]
    r = jnp.where(ok, rewards, 0.0)  # [N]
    gi = jnp.clip(group_index, 0, n - 1)  # [N]; rows with group_index < 0 are not ok, so add zeros
    count_g = jax.ops.segment_sum(ok.astype(r.dtype), gi, n)  # [N]
    sum_g = jax.ops.segment_sum(r, gi, n)  # [N]
    return _Groups(ok, r, gi, count_g, sum_g, count_g[gi], sum_g[gi])


def _finish(adv, g: _Groups, *, std_normalize, std_eps, scale, positive_weight, rewards, valid):
    n = rewards.shape[0]
    mean_g = g.sum_g / jnp.maximum(g.count_g, 1.0)  # [N]
    dev2 = jnp.where(g.ok, (g.r - mean_g[g.gi]) ** 2, 0.0)  # [N]
    var_g = jax.ops.segment_sum(dev2, g.gi, n) / jnp.maximum(g.count_g - 1.0, 1.0)  # sample (n-1) variance
    pos = var_g > 0
    std_g = jnp.where(pos, jnp.sqrt(jnp.where(pos, var_g, 1.0)), 0.0)  # sqrt'(0) = inf would poison grads
    usable = g.ok & (g.count_i >= 2)
    if std_normalize:
        adv = adv / (std_g[g.gi] + std_eps)
    # Positive-sample weight (W-REINFORCE, Zhu et al. 2025, "The Surprising Effectiveness of Negative
    # Reinforcement"): < 1 shrinks the push toward samples above their group's baseline, leaving the
    # push away from those below; the paper reports pass@k at large k kept while pass@1 rises. Not
    # reproduced on the RL quickstart (pass@8 fell as with 1.0: README, preset `w_reinforce`).
    adv = jnp.where(adv > 0, adv * positive_weight, adv)
    adv = jnp.where(usable, adv * scale, 0.0)
    present = g.count_g > 0
    full = g.count_g >= 2
    metrics = {
        "adv/mean": jnp.sum(adv) / jnp.maximum(usable.sum(), 1),
        "adv/abs_mean": jnp.sum(jnp.abs(adv)) / jnp.maximum(usable.sum(), 1),
        "adv/abs_max": jnp.max(jnp.abs(adv)),
        "adv/nonfinite_rewards": jnp.sum((valid > 0) & ~jnp.isfinite(rewards)).astype(jnp.float32),
        "adv/small_groups": jnp.sum(present & ~full).astype(jnp.float32),
        "adv/zero_std_groups": jnp.sum(full & (var_g <= 1e-12)).astype(jnp.float32),
        "adv/group_std_mean": jnp.sum(jnp.where(full, std_g, 0.0)) / jnp.maximum(jnp.sum(full), 1),
        "adv/used_samples": usable.sum().astype(jnp.float32),
    }
    return adv, metrics


@ADVANTAGES.register("grpo")
def grpo_advantages(rewards: jax.Array, group_index: jax.Array, valid: jax.Array, *,
                    std_normalize: bool = False, std_eps: float = 1e-6, scale: float = 1.0,
                    positive_weight: float = 1.0, k: int = 1):
    """A_i = scale * w_i * (R_i - mean of i's group) [/ std]; w_i = positive_weight where the centred
    value is > 0, else 1; with k > 1, R_i is first replaced by its max-of-k transform (trains pass@k).
    rewards, group_index, valid: [N] -> ([N], metrics)."""
    g = _groups(rewards, group_index, valid)
    if int(k) != 1:
        s = max_at_k_rewards(rewards, g.gi, g.ok, int(k))  # [N]
        g = _groups(jnp.where(g.ok, s, jnp.nan), group_index, valid)  # same ok set, transformed rewards
    adv = g.r - g.sum_i / jnp.maximum(g.count_i, 1.0)
    return _finish(adv, g, std_normalize=std_normalize, std_eps=std_eps, scale=scale,
                   positive_weight=positive_weight, rewards=rewards, valid=valid)


@ADVANTAGES.register("rloo")
def rloo_advantages(rewards: jax.Array, group_index: jax.Array, valid: jax.Array, *,
                    std_normalize: bool = False, std_eps: float = 1e-6, scale: float = 1.0,
                    positive_weight: float = 1.0, k: int = 1):
    """A_i = scale * w_i * (R_i - mean of the *other* members of i's group) [/ std] (w_i as in grpo).
    [N] -> ([N], metrics). k must be 1 (the max-of-k transform is implemented for ``grpo`` only)."""
    if int(k) != 1:
        raise ValueError(f"rloo supports advantage.k = 1 only (got {k}); use advantage.name='grpo' for max-of-k")
    g = _groups(rewards, group_index, valid)
    adv = g.r - (g.sum_i - g.r) / jnp.maximum(g.count_i - 1.0, 1.0)
    return _finish(adv, g, std_normalize=std_normalize, std_eps=std_eps, scale=scale,
                   positive_weight=positive_weight, rewards=rewards, valid=valid)


def compute_advantages(name: str, rewards, group_index, valid, **kwargs):
    """Look up the estimator `name` in ADVANTAGES and apply it."""
    return ADVANTAGES.get(name)(rewards, group_index, valid, **kwargs)
