"""Max-of-k reward transform: train for best-of-k (pass@k) instead of the mean reward (pass@1).

With G samples per prompt and rewards r_1..r_G, the unbiased estimate of E[max of k samples] is the
average of max(r_S) over all k-subsets S of the group. Its policy gradient (Walder & Karkhanis 2025,
"Pass@K Policy Optimization"; Chen et al. 2025, "Pass@k Training") is

    grad E[max_k] ~ sum_i s_i grad log pi(o_i),   s_i = mean of max(r_S) over the k-subsets S that contain i,

so replacing each reward by s_i and keeping the group-mean baseline trains best-of-k. For binary
rewards with c successes in a group of G: s_success = 1, s_failure = 1 - C(G-c-1, k-1) / C(G-1, k-1),
and the mean of s is 1 - C(G-c, k) / C(G, k), the usual unbiased pass@k. A group already solved
c >= G - k + 1 times gets zero advantages (its best-of-k is already 1): the gradient goes to the
prompts with rare successes instead of sharpening solved ones, which is what lowers pass@k under
plain GRPO. k = 1 is the identity (plain GRPO).

Closed form for any real rewards, per group of m valid samples ranked r_(1) <= ... <= r_(m) (ties
broken by index; the value of the max does not depend on how):

    s_(i) = [ C(i-1, k-1) r_(i) + sum_{j > i} C(j-2, k-2) r_(j) ] / C(m-1, k-1)

(the subsets containing i whose max is i itself, plus those whose max is a higher rank j). k is
clipped to m, so a group that lost samples to masking still gets a defined transform.
O(N^2) pairwise over the batch's N trajectories (N is tens to hundreds), static shapes for jit.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.special import gammaln


def _log_comb(a: jax.Array, b: jax.Array) -> jax.Array:
    """log C(a, b) for real a >= b >= 0 (caller masks the rest)."""
    a, b = jnp.maximum(a, 0.0), jnp.maximum(b, 0.0)
    return gammaln(a + 1.0) - gammaln(b + 1.0) - gammaln(jnp.maximum(a - b, 0.0) + 1.0)


def _comb_ratio(a: jax.Array, b: jax.Array, log_den: jax.Array) -> jax.Array:
    """C(a, b) / exp(log_den), 0 where C(a, b) = 0 (b < 0 or b > a)."""
    ok = (b >= 0) & (b <= a)
    return jnp.where(ok, jnp.exp(jnp.where(ok, _log_comb(a, b) - log_den, 0.0)), 0.0)


def max_at_k_rewards(rewards: jax.Array, group_index: jax.Array, ok: jax.Array, k: int) -> jax.Array:
    """s_i = mean of max(r_S) over the k-subsets S of i's group that contain i.

    rewards [N] (any finite value where ok), group_index [N] int, ok [N] bool (the sample counts).
    Returns [N]; 0 where not ok. k = 1 returns the rewards unchanged.
    """
    if int(k) == 1:
        return jnp.where(ok, rewards, 0.0)
    n = rewards.shape[0]
    r = jnp.where(ok, rewards, 0.0).astype(jnp.float32)  # [N]
    idx = jnp.arange(n)
    same = ok[:, None] & ok[None, :] & (group_index[:, None] == group_index[None, :])  # [N, N]
    # below[i, j]: j ranks below i in their group (smaller reward, or equal with a smaller index)
    below = same & ((r[None, :] < r[:, None]) | ((r[None, :] == r[:, None]) & (idx[None, :] < idx[:, None])))
    rank = 1.0 + below.sum(axis=1).astype(jnp.float32)  # [N] 1-based rank in the group
    m = same.sum(axis=1).astype(jnp.float32)  # [N] valid members of i's group (0 where not ok)
    ke = jnp.minimum(float(k), jnp.maximum(m, 1.0))  # [N] k clipped to the group
    log_den = _log_comb(m - 1.0, ke - 1.0)  # [N] log C(m-1, k-1)
    own = _comb_ratio(rank - 1.0, ke - 1.0, log_den) * r  # [N] subsets whose max is i itself
    # higher-ranked j in i's group: above[i, j] = below[j, i]; weight C(rank_j - 2, k - 2)
    above = below.T  # [N, N]
    w = _comb_ratio(rank[None, :] - 2.0, ke[:, None] - 2.0, log_den[:, None])  # [N, N]
    higher = jnp.sum(jnp.where(above, w * r[None, :], 0.0), axis=1)  # [N]
    return jnp.where(ok, own + higher, 0.0)
