"""KL(pi_theta || pi_ref) estimators k1, k2, k3 and their two placements.

With samples x ~ q = pi_theta and r = p / q = pi_ref(x) / pi_theta(x) (per token), and
KL(q || p) = E_q[-log r] (Composer 2 report 3.3, J. Schulman's "Approximating KL divergence"):

* k1 = -log r = log pi - log pi_ref: unbiased, variance grows ~ linearly in the divergence
  (Gaussian case: Var = mu^2). Composer 2's choice. Can be negative per sample.
* k2 = (log r)^2 / 2: biased (Gaussian: E = mu^2/2 + mu^4/8), always >= 0, low variance near q = p.
* k3 = (r - 1) - log r: unbiased and >= 0, lowest variance near q = p, but the r term explodes as
  the policies diverge (Gaussian: Var = e^{mu^2} - 1 - mu^2). See benchmarks/kl_estimators.py.

Placements (they are not interchangeable; tests/rl/test_rl_kl.py checks each on an enumerable policy):

* ``reward`` (score-function form, the correct one for k1): the trajectory's summed estimate,
  stop-gradient, is subtracted from its reward, R_i <- R_i - beta * sum_t k_t, before the
  advantages. With k1 the expected policy gradient is exactly -beta grad KL(pi || pi_ref) of the
  whole-sequence KL (the sum carries the effect of each token on the later tokens' KL).
* ``loss`` (pathwise): beta * aggregate(k_t) is added to the loss and differentiated through
  log pi. Then E[grad k1] = E[grad log pi] = 0: **k1 in the loss has zero expected gradient**
  (the `rl` config validator warns). E[grad k2] = sum_t E_{s_t}[grad KL(pi(.|s_t) || pi_ref(.|s_t))]
  with the state distribution held fixed: exact for one-token actions, but for sequences it drops
  how a token changes the KL of later tokens (a bias; ~7% on the test policy). E[grad k3] is the
  same for the *reverse* KL(pi_ref || pi), a different objective.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from c2jax.registry import Registry

KL_ESTIMATORS: Registry = Registry("rl_kl_estimator")
KL_PLACEMENTS = ("reward", "loss")


@KL_ESTIMATORS.register("k1")
def k1(log_ratio: jax.Array) -> jax.Array:
    """-log r, with log_ratio = log r = logp_ref - logp."""
    return -log_ratio


@KL_ESTIMATORS.register("k2")
def k2(log_ratio: jax.Array) -> jax.Array:
    """(log r)^2 / 2."""
    return 0.5 * log_ratio ** 2


@KL_ESTIMATORS.register("k3")
def k3(log_ratio: jax.Array) -> jax.Array:
    """(r - 1) - log r, computed as expm1(log r) - log r for accuracy near r = 1."""
    return jnp.expm1(log_ratio) - log_ratio


def kl_estimate(logp: jax.Array, logp_ref: jax.Array, kind: str, *, log_ratio_clip: float | None = None) -> jax.Array:
    """Per-token estimate of KL(pi || pi_ref) from the sampled tokens' logprobs. Any shape -> same shape.

    `log_ratio_clip` bounds |log r| before the estimator (keeps k3's exp finite); None = exact.
    """
    log_ratio = logp_ref - logp
    if log_ratio_clip is not None:
        log_ratio = jnp.clip(log_ratio, -log_ratio_clip, log_ratio_clip)
    return KL_ESTIMATORS.get(kind)(log_ratio)


def kl_reward_penalty(logp, logp_ref, mask, traj_index, num_traj: int, *, kind: str = "k1",
                      coef: float = 1.0, log_ratio_clip: float | None = None) -> jax.Array:
    """Per-trajectory penalty beta * sum_t sg(k_t) over policy tokens: [B, L] -> [N], to subtract from R."""
    m = mask > 0
    k = kl_estimate(jnp.where(m, logp, 0.0), jnp.where(m, logp_ref, 0.0), kind, log_ratio_clip=log_ratio_clip)
    k = jax.lax.stop_gradient(jnp.where(m, k, 0.0))
    idx = jnp.clip(jnp.where(m, traj_index, 0), 0).reshape(-1)
    return coef * jax.ops.segment_sum(k.reshape(-1), idx, num_traj)


def kl_loss_per_token(logp, logp_ref, mask, *, kind: str = "k1", log_ratio_clip: float | None = None) -> jax.Array:
    """Pathwise per-token KL term (differentiable in logp), 0 off the mask: [B, L] -> [B, L]."""
    m = mask > 0
    k = kl_estimate(jnp.where(m, logp, 0.0), jax.lax.stop_gradient(jnp.where(m, logp_ref, 0.0)), kind,
                    log_ratio_clip=log_ratio_clip)
    return jnp.where(m, k, 0.0)


def kl_metrics(logp, logp_ref, mask, *, log_ratio_clip: float | None = 20.0) -> dict:
    """Mean over policy tokens of all three estimators (the report suggests logging all of them)."""
    m = mask > 0
    n = jnp.maximum(m.sum(), 1)
    lp, lr = jax.lax.stop_gradient(jnp.where(m, logp, 0.0)), jax.lax.stop_gradient(jnp.where(m, logp_ref, 0.0))
    return {f"kl/{kind}": jnp.sum(jnp.where(m, kl_estimate(lp, lr, kind, log_ratio_clip=log_ratio_clip), 0.0)) / n
            for kind in ("k1", "k2", "k3")}
