"""Per-token policy-gradient objectives, each with an optional truncated importance ratio.

Every objective maps the learner's per-token logprobs `logp` [B, L] (differentiable), per-token
advantages `adv` [B, L] (the trajectory advantage broadcast to its tokens), the loss mask and the
sampler's `behaviour_logp` to a per-token loss [B, L] whose gradient is the estimator; the
aggregation (`aggregation.py`) turns it into a scalar. Signature:

    fn(logp, adv, mask, behaviour_logp, *, old_logp=None, **cfg) -> (per_token_loss [B, L], metrics)

* ``pg``: plain policy gradient, loss = -A * log pi. What the Composer 2 report describes: no
  clipping and no importance weights; off-policyness is handled by infrastructure (fast weight
  sync, in-flight updates, router replay). Unbiased on-policy.
* ``ppo``: clipped surrogate -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A) with
  r = pi / pi_old and asymmetric ranges (clip_high > clip_low is DAPO's "clip-higher"). pi_old
  is `old_logp` (a proximal policy recomputed by the learner) or, if None, the behaviour policy.
  With one gradient step per batch and pi_old = pi its gradient equals ``pg``; clipped tokens get
  zero gradient (a bias the clip fraction metric reports).
* ``cispo``: MiniMax-M1's clipped IS weight: loss = -sg(clip(r, 1 - clip_low, 1 + clip_high)) A log pi.
  Every token keeps a gradient (only the weight is clipped), unlike PPO which drops clipped tokens.

Truncated importance sampling (``tis_cap``): multiplies the per-token loss by the stop-gradient
weight w = min(pi_num / pi_behaviour, cap), where pi_num is pi (``pg``) or pi_old (``ppo``,
``cispo``). It corrects the train/inference mismatch and staleness token by token; w = 1 exactly
on-policy. ``tis_mode="mask"`` zeroes tokens whose ratio exceeds the cap instead of capping.
Truncation (and the token-level, rather than sequence-level, ratio) is a deliberate bias traded
for bounded variance.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from c2jax.registry import Registry

POLICY_LOSSES: Registry = Registry("rl_policy_loss")

# exp() argument bound for ratios: keeps exp finite in float32 (e^30 ~ 1e13) without changing any
# ratio a sane run produces; a clipped/capped ratio never depends on values this large.
_MAX_LOG_RATIO = 30.0


def _safe_log_ratio(num: jax.Array, den: jax.Array, mask: jax.Array) -> jax.Array:
    """num - den where masked in, 0 elsewhere (so padding and NaN slots cannot poison gradients)."""
    d = jnp.where(mask > 0, num - den, 0.0)
    return jnp.clip(d, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)


def truncated_is_ratio(logp_num: jax.Array, behaviour_logp: jax.Array, mask: jax.Array, cap: float | None,
                       mode: str = "truncate") -> tuple[jax.Array, dict]:
    """Stop-gradient per-token weight min(exp(logp_num - behaviour_logp), cap). [B, L] -> ([B, L], metrics).

    mode="truncate" caps the ratio at `cap`; mode="mask" sets tokens with ratio > cap to 0.
    cap=None returns ones (no correction). Off the mask the weight is 1 (irrelevant, finite).
    """
    logr = jax.lax.stop_gradient(_safe_log_ratio(logp_num, behaviour_logp, mask))
    ratio = jnp.exp(logr)
    n = jnp.maximum(mask.sum(), 1.0)
    metrics = {"tis/ratio_mean": jnp.sum(ratio * mask) / n,
               "tis/ratio_max": jnp.max(jnp.where(mask > 0, ratio, 0.0))}
    if cap is None:
        return jnp.ones_like(ratio), metrics
    over = (ratio > cap) & (mask > 0)
    metrics["tis/capped_frac"] = jnp.sum(over) / n
    if mode == "truncate":
        w = jnp.minimum(ratio, cap)
    elif mode == "mask":
        w = jnp.where(ratio > cap, 0.0, ratio)
    else:
        raise ValueError(f"tis mode must be 'truncate' or 'mask', got {mode!r}")
    return jnp.where(mask > 0, w, 1.0), metrics


def _clean(logp, adv, mask):
    """Zero logp/adv off the mask with where (not multiply) so NaN there cannot reach gradients."""
    m = mask > 0
    return jnp.where(m, logp, 0.0), jnp.where(m, adv, 0.0)


@POLICY_LOSSES.register("pg")
def pg_loss(logp, adv, mask, behaviour_logp, *, old_logp=None, tis_cap=None, tis_mode="truncate"):
    """Plain policy gradient: -w * A * log pi per token (w = truncated IS weight, 1 by default)."""
    logp, adv = _clean(logp, adv, mask)
    w, metrics = truncated_is_ratio(logp, behaviour_logp, mask, tis_cap, tis_mode)
    return -(w * adv * logp) * mask, metrics


@POLICY_LOSSES.register("ppo")
def ppo_loss(logp, adv, mask, behaviour_logp, *, old_logp=None, clip_low=0.2, clip_high=0.2,
             tis_cap=None, tis_mode="truncate"):
    """PPO clipped surrogate with asymmetric ranges, against pi_old (= behaviour if old_logp is None)."""
    logp, adv = _clean(logp, adv, mask)
    old = behaviour_logp if old_logp is None else old_logp
    old = jax.lax.stop_gradient(old)
    ratio = jnp.exp(_safe_log_ratio(logp, old, mask))
    clipped = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    surrogate = jnp.minimum(ratio * adv, clipped * adv)
    w, metrics = truncated_is_ratio(old, behaviour_logp, mask, tis_cap, tis_mode)
    n = jnp.maximum(mask.sum(), 1.0)
    metrics["ppo/clip_frac"] = jnp.sum((ratio * adv > clipped * adv) * mask) / n
    metrics["ppo/ratio_mean"] = jnp.sum(ratio * mask) / n
    return -(w * surrogate) * mask, metrics


@POLICY_LOSSES.register("cispo")
def cispo_loss(logp, adv, mask, behaviour_logp, *, old_logp=None, clip_low=1.0, clip_high=0.28,
               tis_cap=None, tis_mode="truncate"):
    """CISPO: -sg(clip(pi / pi_old, 1 - clip_low, 1 + clip_high)) * A * log pi per token."""
    logp, adv = _clean(logp, adv, mask)
    old = jax.lax.stop_gradient(behaviour_logp if old_logp is None else old_logp)
    ratio = jax.lax.stop_gradient(jnp.exp(_safe_log_ratio(logp, old, mask)))
    weight = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    w, metrics = truncated_is_ratio(old, behaviour_logp, mask, tis_cap, tis_mode)
    n = jnp.maximum(mask.sum(), 1.0)
    metrics["cispo/clip_frac"] = jnp.sum((weight != ratio) * mask) / n
    return -(w * weight * adv * logp) * mask, metrics


def policy_loss(name: str, logp, adv, mask, behaviour_logp, **kwargs):
    """Look up objective `name` in POLICY_LOSSES and apply it."""
    return POLICY_LOSSES.get(name)(logp, adv, mask, behaviour_logp, **kwargs)
