"""Group advantages: values by hand, RLOO = G/(G-1) GRPO, masking cases, and the std-normalisation blow-up."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax.rl.advantages import ADVANTAGES, compute_advantages


def test_grpo_and_rloo_by_hand_mixed_group_sizes():
    r = jnp.array([1.0, 0.0, 0.0, 3.0, 5.0, 2.0, 2.0, 0.5, 0.7, 0.9])
    gi = jnp.array([0, 0, 0, 1, 1, 2, 2, 3, 3, 3])
    valid = jnp.ones(10)
    a, m = compute_advantages("grpo", r, gi, valid)
    want = [2 / 3, -1 / 3, -1 / 3, -1, 1, 0, 0, -0.2, 0.0, 0.2]
    np.testing.assert_allclose(a, want, atol=1e-6)
    b, _ = compute_advantages("rloo", r, gi, valid)
    sizes = np.array([3, 3, 3, 2, 2, 2, 2, 3, 3, 3])
    np.testing.assert_allclose(b, np.array(want) * sizes / (sizes - 1), atol=1e-6)
    assert float(m["adv/zero_std_groups"]) == 1.0 and float(m["adv/small_groups"]) == 0.0
    c, _ = compute_advantages("grpo", r, gi, valid, scale=0.5)
    np.testing.assert_allclose(c, 0.5 * np.array(want), atol=1e-6)
    # every group's GRPO advantages sum to 0
    np.testing.assert_allclose(jax.ops.segment_sum(a, gi, 4), 0.0, atol=1e-6)


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_masking_cases_never_nan(name):
    r = jnp.array([1.0, 0.0, 7.0,   # group 0: sample 2 is an infra failure (excluded from baseline)
                   jnp.nan, 1.0, 0.0,  # group 1: a NaN reward
                   4.0,             # group 2: a single sample
                   1.0, 2.0,        # group 3: every sample infra-failed
                   9.0])            # N-axis padding
    gi = jnp.array([0, 0, 0, 1, 1, 1, 2, 3, 3, -1])
    valid = jnp.array([1, 1, 0, 1, 1, 1, 1, 0, 0, 0], jnp.float32)
    a, m = compute_advantages(name, r, gi, valid)
    assert np.all(np.isfinite(a))
    f = 2.0 if name == "rloo" else 1.0  # RLOO on a 2-sample group doubles the GRPO value
    np.testing.assert_allclose(a[:2], [0.5 * f, -0.5 * f], atol=1e-6)  # the failure did not shift the baseline
    np.testing.assert_allclose(a[2], 0.0)
    np.testing.assert_allclose(a[3:6], [0.0, 0.5 * f, -0.5 * f], atol=1e-6)
    np.testing.assert_allclose(a[6:], 0.0)
    assert float(m["adv/nonfinite_rewards"]) == 1.0
    assert float(m["adv/small_groups"]) == 1.0  # group 2 (group 3 has no valid sample at all)
    assert float(m["adv/used_samples"]) == 4.0
    # the gradient through the advantage of a NaN reward is finite too
    g = jax.grad(lambda rr: jnp.sum(compute_advantages(name, rr, gi, valid, std_normalize=True)[0] ** 2))(r)
    assert np.all(np.isfinite(g))


def test_std_normalisation_blows_up_near_uniform_groups():
    """All four rollouts solved the task; one is 0.001 worse (say, a few extra tokens of length penalty).
    Without std division the advantages stay ~1e-3; with it they become O(1), as large as the signal of
    a group that actually distinguishes right from wrong."""
    r = jnp.array([1.0, 1.0, 1.0, 0.999, 1.0, 0.0, 0.0, 0.0])
    gi = jnp.array([0, 0, 0, 0, 1, 1, 1, 1])
    valid = jnp.ones(8)
    plain, _ = compute_advantages("grpo", r, gi, valid)
    normed, m = compute_advantages("grpo", r, gi, valid, std_normalize=True)
    near_plain, near_normed = np.abs(plain[:4]).max(), np.abs(normed[:4]).max()
    informative_normed = np.abs(normed[4:]).max()
    assert near_plain < 1e-3
    assert near_normed / near_plain > 1000  # the amplification factor is 1 / std = 2000
    assert near_normed > 0.5 * informative_normed  # noise now weighs like a real success/failure signal
    # a group with identical rewards stays at exactly 0 (eps keeps it finite)
    flat, _ = compute_advantages("grpo", jnp.ones(4), jnp.zeros(4, jnp.int32), jnp.ones(4), std_normalize=True)
    np.testing.assert_array_equal(flat, 0.0)


def test_jit_and_registry():
    r = jnp.arange(12.0)
    gi = jnp.arange(12) // 4
    f = jax.jit(lambda r, g, v: compute_advantages("rloo", r, g, v))
    a, m = f(r, gi, jnp.ones(12))
    assert a.shape == (12,) and all(v.shape == () for v in m.values())
    assert ADVANTAGES.names() == ["grpo", "rloo"]
    with pytest.raises(KeyError, match="known: grpo, rloo"):
        compute_advantages("ppo", r, gi, jnp.ones(12))


@pytest.mark.parametrize("name", ["grpo", "rloo"])
@pytest.mark.parametrize("std", [False, True])
def test_matches_brute_force_loop(name, std):
    """Random groups of sizes 1..6 (shuffled order), random masks and NaNs vs a plain Python loop."""
    rng = np.random.default_rng(3)
    n = 64
    gi = rng.integers(0, 15, n)
    gi[-4:] = -1  # padding
    r = rng.normal(size=n).astype(np.float32)
    r[rng.random(n) < 0.05] = np.nan
    valid = (rng.random(n) > 0.15).astype(np.float32)
    want = np.zeros(n)
    for g in set(gi[gi >= 0]):
        idx = [i for i in range(n) if gi[i] == g and valid[i] > 0 and np.isfinite(r[i])]
        if len(idx) < 2:
            continue
        vals = r[idx].astype(np.float64)
        sd = vals.std(ddof=1)
        for j, i in enumerate(idx):
            base = vals.mean() if name == "grpo" else np.delete(vals, j).mean()
            want[i] = (r[i] - base) / ((sd + 1e-6) if std else 1.0)
    a, _ = jax.jit(lambda *x: compute_advantages(name, *x, std_normalize=std))(r, gi, valid)
    np.testing.assert_allclose(a, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_positive_weight_scales_only_above_baseline(name):
    """W-REINFORCE: positive_weight multiplies the advantages above the baseline, leaves the rest; 1 is
    the plain estimator and 0 keeps only the push away from failures."""
    r = jnp.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0])  # groups of 4: 1/4 and 3/4 solved
    gi = jnp.array([0, 0, 0, 0, 1, 1, 1, 1])
    valid = jnp.ones(8)
    plain, _ = compute_advantages(name, r, gi, valid)
    plain = np.asarray(plain)
    for w in (0.0, 0.25, 1.0):
        a, _ = compute_advantages(name, r, gi, valid, positive_weight=w)
        want = np.where(plain > 0, w * plain, plain)
        np.testing.assert_allclose(a, want, atol=1e-6)
    a0, _ = compute_advantages(name, r, gi, valid, positive_weight=0.0, scale=2.0)
    assert np.all(np.asarray(a0) <= 0) and np.asarray(a0)[1] < 0  # failures still pushed down, x scale


def test_positive_weight_is_validated():
    from c2jax.config import Checker
    from c2jax.rl.config_checks import validate_rl

    check = Checker()
    validate_rl(check, {"advantage": {"name": "grpo", "positive_weight": -0.5}}, {})
    assert any(k == "advantage.positive_weight" for k, _ in check.problems), check.problems
