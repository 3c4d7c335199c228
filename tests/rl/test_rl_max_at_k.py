"""Max-of-k reward transform (c2jax/rl/max_at_k.py) against brute-force subset enumeration."""
import itertools
from math import comb

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax.rl.advantages import compute_advantages
from c2jax.rl.max_at_k import max_at_k_rewards


def _brute(rewards, groups, ok, k):
    """s_i = mean over the k-subsets of i's (valid) group containing i of the subset's max reward."""
    out = np.zeros(len(rewards))
    for i in range(len(rewards)):
        if not ok[i]:
            continue
        members = [j for j in range(len(rewards)) if ok[j] and groups[j] == groups[i]]
        ke = min(k, len(members))
        others = [j for j in members if j != i]
        vals = [max(rewards[j] for j in (i,) + sub) for sub in itertools.combinations(others, ke - 1)]
        out[i] = np.mean(vals)
    return out


@pytest.mark.parametrize("k", [1, 2, 3, 4, 7])
def test_matches_brute_force_with_ties_masking_and_uneven_groups(k):
    rng = np.random.default_rng(k)
    n = 20
    groups = np.array([0] * 8 + [1] * 5 + [2] * 7)
    rewards = rng.choice([-0.2, 0.0, 0.5, 1.0, 1.3], size=n)  # ties on purpose
    ok = rng.random(n) > 0.15
    got = np.asarray(max_at_k_rewards(jnp.asarray(rewards, jnp.float32), jnp.asarray(groups), jnp.asarray(ok), k))
    np.testing.assert_allclose(got, _brute(rewards, groups, ok, k), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("c", range(9))
def test_binary_closed_form_and_pass_at_k_estimate(c):
    """G = 8, k = 2: success -> 1, failure -> 1 - C(G-c-1, k-1)/C(G-1, k-1); mean = unbiased pass@k."""
    g, k = 8, 2
    r = jnp.asarray([1.0] * c + [0.0] * (g - c))
    s = np.asarray(max_at_k_rewards(r, jnp.zeros(g, jnp.int32), jnp.ones(g, bool), k))
    fail = 1 - comb(g - c - 1, k - 1) / comb(g - 1, k - 1) if c < g else None
    np.testing.assert_allclose(s[:c], 1.0, rtol=1e-6)
    if fail is not None:
        np.testing.assert_allclose(s[c:], fail, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s.mean(), 1 - comb(g - c, k) / comb(g, k), rtol=1e-5, atol=1e-6)


def test_grpo_k1_is_plain_grpo_and_solved_groups_get_zero_advantage():
    r = jnp.asarray([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0])  # group 0: 3 of 4 solved; group 1: 1 of 4
    gi = jnp.asarray([0, 0, 0, 0, 1, 1, 1, 1])
    v = jnp.ones(8)
    a1, _ = compute_advantages("grpo", r, gi, v, k=1)
    a0, _ = compute_advantages("grpo", r, gi, v)
    np.testing.assert_array_equal(np.asarray(a1), np.asarray(a0))
    a2, _ = compute_advantages("grpo", r, gi, v, k=2)
    # group 0 has c = 3 >= G - k + 1 = 3 successes: every pair holds a success, nothing to learn
    np.testing.assert_allclose(np.asarray(a2)[:4], 0.0, atol=1e-6)
    # group 1: success s = 1, failures s = 1 - C(2,1)/C(3,1) = 1/3; mean 1/2
    np.testing.assert_allclose(np.asarray(a2)[4:], [0.5, -1 / 6, -1 / 6, -1 / 6], rtol=1e-5)


def test_gradient_is_unbiased_for_best_of_k_on_a_bernoulli_policy():
    """A one-parameter policy p = sigmoid(theta) over {success, failure}: E[sum_i A_i d log pi(o_i)]
    over groups of 8 is proportional to d/dtheta [1 - (1-p)^k], exactly, by enumerating every group."""
    g, k, theta = 8, 3, -0.7
    p = float(jax.nn.sigmoid(theta))
    expected = 0.0
    for c in range(g + 1):
        r = jnp.asarray([1.0] * c + [0.0] * (g - c))
        a, _ = compute_advantages("grpo", r, jnp.zeros(g, jnp.int32), jnp.ones(g), k=k)
        score = np.array([1 - p] * c + [-p] * (g - c))  # d log pi(o)/d theta
        expected += comb(g, c) * p ** c * (1 - p) ** (g - c) * float(np.dot(np.asarray(a), score))
    true_grad = k * (1 - p) ** (k - 1) * p * (1 - p)  # d/dtheta [1 - (1-p)^k]
    # sum_i s_i score_i has mean (G / k) grad J_k; the group-mean baseline (which includes i) takes one
    # grad J_k back (the k-subsets are averaged): (G - k) / k, which is G - 1 for plain GRPO (k = 1)
    assert expected > 0
    np.testing.assert_allclose(expected / true_grad, (g - k) / k, rtol=1e-5)


def test_jit_and_rloo_rejects_k():
    r = jnp.asarray([1.0, 0.0, 0.0, 1.0])
    gi = jnp.asarray([0, 0, 0, 0])
    f = jax.jit(lambda r: compute_advantages("grpo", r, gi, jnp.ones(4), k=2)[0])
    assert np.isfinite(np.asarray(f(r))).all()
    with pytest.raises(ValueError, match="k = 1 only"):
        compute_advantages("rloo", r, gi, jnp.ones(4), k=2)
